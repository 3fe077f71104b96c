"""A :class:`~xpbank.Mixture` batch taken in place: each source's share drawn under its
lock and its records, ids and weights taken straight into its slice of the batch's
arrays (:mod:`xpbank.mix.assemble` makes the arrays and the TensorDict).

Where every source with a share keeps its fields in one packed CPU block (``host_reader``
of a :class:`~xpbank.TensorStorage`) and those blocks share one record layout, a batch
of ``B`` items is one ``np.empty`` of ``B`` records and one of ``B`` ids, then one loop
over the shares (:func:`take_shares`): each share's draw (a plain uniform source's
sample fast path, :func:`~xpbank.replay.fast_read.draw_records`; a prioritized one's,
:func:`~xpbank.replay.fast_read.draw_prioritized_at`, whose compiled call writes the
items' ids into the share's slice of the batch's ids and its weights into the batch's
weights; else the source's sampler's own draw, :func:`~xpbank.replay.reading.draw_slots`:
the same draws as its ``sample``) and one ``take`` of whole records into the share's
slice. The rows are copied once, as by the sources' own samples, with no join copy
afterwards; no per-share ids or weights array is made.

Where the time went (two prioritized shares of 128 of 200k items each, thread CPU time):
the draws and the rows' copy are the two sub-samples' own; around them a share took ~15
Python calls (its draw through ``draw_rows`` and ``draw_prioritized_rows``, the ids and
weights as new tensors, their NumPy views and copies into the batch, ``take_share``,
``ids_into``, ``put_weights`` with ``np.ones``) and the batch the sources' layout found
anew (``Layout.state_of``), the counts and checks: ~20 µs over the 78 µs of the two
sub-samples (1.25x). After a tree descent over 200k leaves the interpreter runs cold: each
such step costs 2-3x what it costs in a loop of its own.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.replay import ReplayBuffer, fast_read, reading
from xpbank.ring.ids import Ring
from xpbank.sampler import PrioritizedSampler, UniformSampler

__all__ = ["Layout", "Share", "draw_rows", "ids_into", "put_weights", "spelled_out", "take_shares"]

# (source number, its entries {key: tensor}, its batch shape, its rows where its fields
# are still whole records, else None: (the taken records, the RecordReader that splits
# them, and None; or, taken into a slice of a batch's (records, ids), that pair and the
# slice's start, the entries then left out: spelled_out gives them))
Share = tuple[int, dict[Any, torch.Tensor], tuple[int, ...], Any]
# samplers whose slots are always stored slots: their rows are taken without a bounds check
_IN_RANGE = (UniformSampler, PrioritizedSampler)


class Layout:
    """What a batch of the sources' shares taken in place reads: each source's
    ``host_reader`` (``None`` for sources without a share), the one record dtype they
    share, whether every key is a string (the TensorDict is then made without a walk of
    the keys), and the device. Found once per state of the sources (:meth:`state_of`)."""

    __slots__ = ("device", "dtype", "flat", "readers", "state")

    def __init__(self, state: tuple[Any, ...], readers: tuple[Any, ...], device: torch.device):
        self.state, self.readers, self.device = state, readers, device
        first = next(r for r in readers if r is not None)
        self.dtype = first.records.dtype
        self.flat = all(type(key) is str for key in first.keys)

    @staticmethod
    def state_of(sources: tuple[ReplayBuffer, ...], counts: list[int]) -> tuple[Any, ...]:
        """What a layout depends on: each source's storage, its reader and its device,
        for the sources with a share (compared by identity, per batch)."""
        out = []
        for rb, k in zip(sources, counts, strict=True):
            storage = rb._storage
            out.append((storage, getattr(storage, "host_reader", None), rb._device) if k else None)
        return tuple(out)

    @classmethod
    def of(cls, sources: tuple[ReplayBuffer, ...], state: tuple[Any, ...]) -> Layout | None:
        """The layout of these sources, or ``None``: a source with a share samples its own
        way (a subclass), has no packed CPU block, delivers elsewhere, or the sources'
        records differ in dtype or fields."""
        readers: list[Any] = []
        for rb, found in zip(sources, state, strict=True):
            if found is None:
                readers.append(None)
                continue
            storage, reader, device = found
            if type(rb).sample is not ReplayBuffer.sample or reader is None or storage.device != device:
                return None
            readers.append(reader)
        given = [r for r in readers if r is not None]
        if any(r.records.dtype != given[0].records.dtype or r.fields != given[0].fields for r in given):
            return None
        return cls(state, tuple(readers), next(f[2] for f in state if f is not None))


def take_shares(
    sources: tuple[ReplayBuffer, ...],
    counts: list[int],
    replace: bool,
    readers: tuple[Any, ...],
    joint: tuple[np.ndarray, np.ndarray],
    weights: list[np.ndarray | None],
) -> tuple[list[Share], bool]:
    """Each source ``s``'s ``counts[s]`` items as ``rb.sample(counts[s], replace)`` draws
    them (every field), in source order, their records and ids taken into consecutive
    slices of the batch's ``joint`` ``(records, ids)`` and their weights, if the sampler
    gives any, into ``weights[0]`` (made on first use, 1.0 for the items of sources
    without weights). Returns the shares and whether every one was taken in place.

    ``readers[s]`` is source ``s``'s ``host_reader`` when :class:`Layout` checked it. A
    share that cannot be taken in place (n-step, relabelling, windows, other per-item
    entries, another layout since) is as :func:`draw_share
    <xpbank.mix.assemble.draw_share>` returns it: the batch is then joined share by share.
    One loop over the shares, each drawn as :func:`draw_rows` draws it (its steps inline,
    see the module docstring); a prioritized share's ids and weights are written by its
    draw, and ``weights[0]`` is made with ``np.empty``: 1.0 only where a share has none.
    """
    records, numbers = joint
    n = numbers.shape[0]
    every = weights[0]  # the batch's weights: exposed in weights[0] once a share gave some
    weighted = every is not None
    ones: list[tuple[int, int]] = []  # shares taken here without weights: 1.0 if the batch has some
    ids_at = 0  # the address of numbers (found at the first prioritized share)
    parts: list[Share] = []
    in_place = True
    lo = 0
    for s, k in enumerate(counts):
        if not k:
            continue
        rb = sources[s]
        hi = lo + k
        rows: Any = None
        weight = drawn = None
        written = False  # the share's ids written into numbers by its draw
        with rb.lock:
            found = fast_read.draw_records(rb, k) if replace else None
            if found is not None:  # a plain uniform buffer's fast draw
                rows = found[0]
            else:
                if replace and type(rb._sampler) is PrioritizedSampler:
                    if every is None:
                        every = np.empty(n, dtype=np.float32)
                    if not ids_at:
                        ids_at = torch.from_numpy(numbers).data_ptr()
                    weight = every[lo:hi]
                    # a prioritized buffer's fast draw: ids and weights written into the batch
                    rows = fast_read.draw_prioritized_at(rb, k, ids_at + 8 * lo, weight)
                    written = rows is not None
                if rows is None:
                    rows, weight, own, drawn = _draw_own(s, rb, k, replace)
                    if own is not None:
                        parts.append(own)
                        in_place = False
                        lo = hi
                        continue
                    if weight is not None:
                        if every is None:
                            every = np.empty(n, dtype=np.float32)
                        every[lo:hi] = weight
            reader: Any = getattr(rb._storage, "host_reader", None)
            if reader is readers[s] and type(rb._sampler) in _IN_RANGE:
                taken = records[lo:hi]
                reader.records.take(rows, out=taken, mode="clip")  # in range: no buffered copy
                if drawn is not None:
                    numbers[lo:hi] = drawn
                elif not written:
                    fast_read.ids_of_rows(rb._ring, rows, numbers[lo:hi])
                part = None
            else:
                part = _take_apart(s, rb, k, rows, weight, reader)
        if part is not None:  # read as gather reads it
            parts.append(part)
            in_place = False
        else:
            parts.append((s, {}, (k,), (taken, reader, joint, lo)))  # its entries: see spelled_out
            if weight is None:
                ones.append((lo, hi))
            else:
                weighted = True
        lo = hi
    if weighted and every is not None:
        for a, b in ones:
            every[a:b] = 1.0
        weights[0] = every
    return parts, in_place


def _take_apart(
    s: int, rb: ReplayBuffer, k: int, rows: np.ndarray, weight: np.ndarray | None, reader: Any
) -> Share:
    """The drawn ``rows``' share read as gather reads it, where the source's packed block
    (``reader``, its ``host_reader`` now) is not the one its :class:`Layout` checked or
    its sampler's slots are to be checked (:func:`take_shares`). The caller holds the lock."""
    if reader is None:  # no packed block since it was checked: read as gather does
        slots = torch.from_numpy(rows.copy())
        info = {} if weight is None else {"weight": torch.from_numpy(weight)}
        flat = reading.gather_flat(rb, slots, rb._ring.ids_of_slots(slots), None, info, None)
        return s, flat, (k,), None
    # another layout since it was checked, or slots to check: take as gather does
    entries = {"index": torch.from_numpy(fast_read.ids_of_rows(rb._ring, rows))}
    if weight is not None:
        entries["weight"] = torch.from_numpy(weight)
    return s, entries, (k,), (reader.records.take(rows), reader, None)


def spelled_out(part: Share, joint: Any, weights: np.ndarray | None) -> Share:
    """``part`` with its entries (``"index"``, ``"weight"`` where the batch has weights)
    and its records as its own, where :func:`take_shares` took it into ``joint``: the
    form :meth:`Assembler.join <xpbank.mix.assemble.Assembler.join>` joins."""
    rows = part[3]
    if rows is None or rows[2] is not joint:
        return part
    s, _, shape, (records, reader, _, lo) = part
    entries = {"index": torch.from_numpy(joint[1][lo : lo + shape[0]])}
    if weights is not None:
        entries["weight"] = torch.from_numpy(weights[lo : lo + shape[0]])
    return s, entries, shape, (records, reader, None)


def draw_rows(s: int, rb: ReplayBuffer, k: int, replace: bool) -> tuple[Any, Any, Share | None, Any]:
    """Source ``s``'s draw of ``k`` items as its ``sample(k, replace)`` draws them:
    ``(rows, weights or None, None, ids or None)`` (NumPy int64 slots, float32 weights,
    the items' int64 ids where the draw wrote them) where the caller can read the rows
    itself, else ``(None, None, the share, None)`` read the source's own way (n-step,
    relabelling, windows, other per-item entries). The caller holds the lock. A plain
    uniform source's rows are its fast path's kept array: read them before its next
    draw."""
    if replace:
        found = fast_read.draw_records(rb, k)
        if found is not None:  # a plain uniform buffer's fast sample, stopped at the rows
            return found[0], None, None, None
        drawn = fast_read.draw_prioritized_rows(rb, k)
        if drawn is not None:  # a prioritized buffer's fast sample, stopped at the rows
            return drawn[0], drawn[1], None, drawn[3]
    return _draw_own(s, rb, k, replace)


def _draw_own(s: int, rb: ReplayBuffer, k: int, replace: bool) -> tuple[Any, Any, Share | None, Any]:
    """:func:`draw_rows` after its fast draws declined (nothing drawn yet): the source's
    sampler's own draw."""
    if rb._nstep is None and type(rb._ring) is Ring and getattr(rb._sampler, "relabel", None) is None:
        slots, info = reading.draw_slots(rb, k, replace)  # e.g. a prioritized sample
        fit = _rows_of(slots, info, k)
        if fit is not None:
            return fit[0], fit[1], None, None
        entries = reading.gather_flat(rb, slots, rb._ring.ids_of_slots(slots), None, info, None)
        return None, None, (s, entries, tuple(slots.shape), None), None
    slots, ids, keys, info, read = reading.draw(rb, k, replace, None)
    flat = reading.gather_flat(rb, slots, ids, keys, info, read)
    return None, None, (s, flat, tuple(slots.shape), None), None


def ids_into(rb: ReplayBuffer, rows: np.ndarray, drawn: np.ndarray | None, out: np.ndarray) -> np.ndarray:
    """The ids of the items at slots ``rows`` into ``out``: those the draw wrote
    (``drawn``, :func:`draw_rows`' last), else computed from the ring."""
    if drawn is None:
        return fast_read.ids_of_rows(rb._ring, rows, out)
    out[:] = drawn
    return out


def put_weights(weights: list[np.ndarray | None], weight: np.ndarray, lo: int, n: int) -> np.ndarray:
    """Write a share's ``weight`` at ``lo`` into the batch's weights ``weights[0]`` (made
    on first use: 1.0 for the items of sources without weights); returns its slice."""
    every = weights[0]
    if every is None:
        every = weights[0] = np.ones(n, dtype=np.float32)
    share = every[lo : lo + weight.shape[0]]
    share[:] = weight
    return share


def _rows_of(
    slots: torch.Tensor, info: dict[str, torch.Tensor], k: int
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(slots as NumPy int64 rows, the weights or None)`` where they fit a share taken
    in place: one CPU int64 slot per item, and no entry but one float32 CPU ``"weight"``
    per item; else ``None``."""
    if slots.ndim != 1 or not slots.is_cpu:
        return None
    rows = slots.numpy()
    if rows.dtype != np.int64:
        return None
    weight = None
    for name, value in info.items():
        if name != "weight" or not value.is_cpu:
            return None
        weight = value.numpy()
        if weight.dtype != np.float32 or weight.shape != (k,):
            return None
    return rows, weight
