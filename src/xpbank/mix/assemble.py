"""Drawing the sources' shares of a :class:`~xpbank.mix.Mixture` batch and joining them
into one TensorDict.

**In place** (:meth:`Assembler.sample`): where every source with a share reads whole
records of one packed CPU block of one layout (``host_reader`` of a
:class:`~xpbank.TensorStorage`: same record dtype, same fields) and nothing else is read
(no n-step, no relabelling, every field), the batch's records, ids and weights are
allocated once and each share is drawn under its source's lock and taken straight into
its slice: a plain uniform source by its sample fast path's draw
(:func:`xpbank.replay.fast_read.draw_records`: the same draws), any other by its
sampler's own draw (:func:`xpbank.replay.reading.draw_slots`, e.g. a prioritized
sample). The rows are copied once, as by the sources' own samples; the fields are views
of the records, and the TensorDict is made as the sample fast path makes it. Whether the
sources qualify is worked out once per state of theirs (:class:`~xpbank.mix.inplace.Layout`).
A memory-mapped source (an opened bank) beside sources of the same fields takes each
field's rows into the batch's per-field arrays instead (:mod:`xpbank.mix.fields`).

**Share by share** otherwise: each share is drawn by the source's own read path up to
the TensorDict (:func:`xpbank.replay.reading.draw` and
:func:`~xpbank.replay.reading.gather_flat`): its sampler, generator, n-step option and
relabelling, and its fields as a flat ``{key: tensor}``; the shares are then joined key
by key (one ``torch.cat`` per field; records of one layout in one copy) and made into
one TensorDict, with ``"source"``. A source whose class overrides ``sample`` (a buffer
that samples elsewhere, e.g. over shared memory) is sampled whole and flattened. What
depends only on which sources give a share and which keys they give (the keys to keep,
their shapes and dtypes, whether ``"weight"`` is there) is checked once per such
signature and kept (:class:`Assembler`), not per batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import SpecError
from xpbank.mix.fields import FieldLayout, share_entries, take_fields
from xpbank.mix.inplace import Layout, Share, spelled_out, take_shares
from xpbank.replay import ReplayBuffer, fast_read, reading
from xpbank.spec.batch import flat_tensordict, to_tensordict
from xpbank.storage.dtypes import as_torch

__all__ = ["Assembler", "Share", "draw_share", "refuse_keys"]

_CACHED = 64  # signatures and "source" columns kept (schedules give many counts)
_RAW: dict[int, np.dtype] = {}  # a record's itemsize -> the void dtype of that many bytes


def draw_share(s: int, rb: ReplayBuffer, k: int, replace: bool, fields: Any) -> Share:
    """Source ``s``'s ``k`` items as ``rb.sample(k, replace, fields)`` would give them, flat.

    Where the source reads every field of one packed CPU block (``host_reader`` of a
    :class:`~xpbank.TensorStorage`) and nothing was read yet (no n-step, no relabelling),
    its rows are taken whole and left as records: :meth:`Assembler.join` joins the
    records of sources of one layout in one copy and views the fields from it.
    """
    if type(rb).sample is not ReplayBuffer.sample:  # a subclass samples its own way
        td = rb.sample(k, replace, fields)
        return s, dict(td.items(include_nested=True, leaves_only=True)), tuple(td.batch_size), None
    storage = rb.storage
    with rb.lock:
        found = fast_read.draw_records(rb, k) if replace and fields is None else None
        if found is not None:  # a plain uniform buffer's fast sample, stopped at the records
            rows, reader = found
            numbers = fast_read.ids_of_rows(rb._ring, rows)
            return s, {"index": torch.from_numpy(numbers)}, (k,), (reader.records.take(rows), reader, None)
        slots, ids, keys, info, flat = reading.draw(rb, k, replace, fields)
        reader = getattr(storage, "host_reader", None)
        whole = flat is None and keys is None and slots.ndim == 1
        if whole and reader is not None and storage.device == rb.device:
            taken = reader.records.take(slots.numpy())  # one take of whole records, as gather does
            entries = reading.gather_flat(rb, slots, ids, keys, info, {})  # "index" and info
            return s, entries, tuple(slots.shape), (taken, reader, None)
        flat = reading.gather_flat(rb, slots, ids, keys, info, flat)
    if storage.device != rb.device:  # batches delivered elsewhere (e.g. pinned CPU -> CUDA)
        flat = _on(flat, rb.device)
    return s, flat, tuple(slots.shape), None


def _on(entries: dict[Any, torch.Tensor], device: torch.device) -> dict[Any, torch.Tensor]:
    """``entries`` with every tensor on ``device`` (those there already kept as they are)."""
    fast = device.type == "cuda"
    return {k: v if v.device == device else v.to(device, non_blocking=fast) for k, v in entries.items()}


def _moved(part: Share, device: torch.device) -> Share:
    """``part`` (its rows already apart) with every entry on ``device``."""
    s, entries, shape, rows = part
    return s, _on(entries, device), shape, rows


def _rows_apart(part: Share) -> Share:
    """``part`` with its rows' fields as entries (before ``"index"``), as gather gives them."""
    s, entries, shape, rows = part
    if rows is None:
        return part
    return s, {**rows[1].split(rows[0]), **entries}, shape, None


def refuse_keys(first: tuple[int, set[Any]], other: tuple[int, set[Any]]) -> None:
    (a, ka), (b, kb) = first, other
    raise SpecError(
        f"sample: sources {a} and {b} give different keys (only in {a}: {sorted(map(str, ka - kb))}, "
        f"only in {b}: {sorted(map(str, kb - ka))}); pass keys='common' to keep the shared ones"
    )


class Assembler:
    """Joins shares into a batch; keeps the checked plan per signature and the
    ``"source"`` column per counts.

    Args:
        keys: ``"same"`` (refuse shares that differ in keys) or ``"common"``.
    """

    def __init__(self, keys: str):
        self.keys = keys
        self._columns: dict[tuple[Any, ...], torch.Tensor] = {}
        self._plans: dict[tuple[Any, ...], tuple[list[Any], bool, tuple[int, ...]]] = {}
        self._layout: Layout | FieldLayout | None = None  # the last one found
        self._unfit: tuple[Any, ...] | None = None  # the last state without one
        # counts -> ("source" of a batch in place, its torch.Size)
        self._flat_columns: dict[tuple[int, ...], tuple[np.ndarray, torch.Size]] = {}
        # the last batch taken in place through a Layout: (counts, layout, "source", size)
        self._last: tuple[list[int], Layout, np.ndarray, torch.Size] | None = None

    def sample(
        self,
        sources: tuple[ReplayBuffer, ...],
        counts: list[int],
        replace: bool,
        fields: Any,
        device: torch.device | None = None,
    ) -> TensorDict:
        """One batch of ``counts[s]`` items of each source ``s`` (in source order), each
        share drawn as the source's own ``sample(counts[s], replace, fields)`` draws it:
        taken in place where every field is asked for and the sources store them alike
        (one packed :class:`~xpbank.mix.inplace.Layout`, or a memory-mapped source
        beside others of the same fields: :class:`~xpbank.mix.fields.FieldLayout`),
        else share by share and joined (:meth:`join`).

        ``device``: where the batch goes (``None``: the sources'); a share drawn on
        another device is moved there before the join.

        Raises:
            SpecError: as :meth:`join`; what a source's sample raises.
        """
        if device is not None:
            elsewhere = {sources[s].device for s, k in enumerate(counts) if k} - {device}
            if elsewhere:
                parts = [
                    _moved(_rows_apart(draw_share(s, sources[s], k, replace, fields)), device)
                    for s, k in enumerate(counts)
                    if k
                ]
                return self.join(parts, counts)
        last = self._last
        layout: Layout | FieldLayout | None
        if last is not None and fields is None and last[0] == counts:
            # the packed layout of these shares' sources, found for the last batch: each
            # share checks its source's block again (take_shares) and drops it if changed
            layout, column, size = last[1], last[2], last[3]
        else:
            layout = self._layout_of(sources, counts) if fields is None else None
            if layout is None:
                parts = [draw_share(s, sources[s], k, replace, fields) for s, k in enumerate(counts) if k]
                return self.join(parts, counts)
            column, size = self._flat_column(counts)
            if type(layout) is Layout:
                self._last = (list(counts), layout, column, size)
        if isinstance(layout, FieldLayout):
            return self._take_fields(layout, sources, counts, replace, column, size)
        joint = (np.empty(size[0], dtype=layout.dtype), np.empty(size[0], dtype=np.int64))
        weights: list[np.ndarray | None] = [None]
        parts, in_place = take_shares(sources, counts, replace, layout.readers, joint, weights)
        out = _join_rows(parts) if in_place else None  # the fields as views of the joint records
        if out is None:  # a share read its own way (see take_shares): the layout found anew
            self._last = None
            return self.join([spelled_out(p, joint, weights[0]) for p in parts], counts)
        return _batch(out, weights[0], column, size, layout)

    def _take_fields(
        self,
        layout: FieldLayout,
        sources: tuple[ReplayBuffer, ...],
        counts: list[int],
        replace: bool,
        column: np.ndarray,
        size: torch.Size,
    ) -> TensorDict:
        """:meth:`sample` through a :class:`~xpbank.mix.fields.FieldLayout`."""
        n = size[0]
        outs = {key: np.empty((n, *f[1]), dtype=f[0]) for key, f in layout.fields.items()}
        joint = (outs, np.empty(n, dtype=np.int64))
        weights: list[np.ndarray | None] = [None]
        own: list[tuple[int, int, int, Share | None]] = []
        lo = 0
        for s, k in enumerate(counts):
            if k:
                views = layout.views[s]
                own.append((s, lo, k, take_fields(s, sources[s], k, replace, views, joint, lo, weights)))
                lo += k
        if any(share is not None for *_, share in own):  # joined share by share
            parts = [
                (s, share_entries(layout, joint, weights[0], lo, k), (k,), None) if share is None else share
                for s, lo, k, share in own
            ]
            return self.join(parts, counts)
        out = {key: as_torch(joint[0][key], f[2]) for key, f in layout.fields.items()}
        out["index"] = torch.from_numpy(joint[1])
        return _batch(out, weights[0], column, size, layout)

    def _layout_of(self, sources: tuple[ReplayBuffer, ...], counts: list[int]) -> Layout | FieldLayout | None:
        state = Layout.state_of(sources, counts)
        layout = self._layout
        if layout is not None and layout.state == state:
            return layout
        if state == self._unfit:
            return None
        layout = Layout.of(sources, state) or FieldLayout.of(sources, state)
        if layout is None:
            self._unfit = state
        else:
            self._layout = layout
        return layout

    def _flat_column(self, counts: list[int]) -> tuple[np.ndarray, torch.Size]:
        key = tuple(counts)
        found = self._flat_columns.get(key)
        if found is None:
            if len(self._flat_columns) >= _CACHED:
                self._flat_columns.clear()
            column = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
            found = self._flat_columns[key] = (column, torch.Size((int(column.shape[0]),)))
        return found

    def join(self, parts: list[Share], counts: list[int]) -> TensorDict:
        """One batch of ``parts`` (in source order), with ``"source"``.

        Raises:
            SpecError: the shares differ in shape beyond the item dim, in keys
                (``keys="same"``), or in a kept key's shape or dtype.
        """
        joined = _join_rows(parts)
        if joined is None:
            parts = [_rows_apart(p) for p in parts]
        # a source's keys, shapes and dtypes are fixed by its spec, its sampler and the
        # fields asked for: checked once per (sources, their keys, their tails)
        signature = tuple(
            (s, shape[1:], tuple(flat), None if rows is None else rows[0].dtype)
            for s, flat, shape, rows in parts
        )
        plan = self._plans.get(signature)
        if plan is None:
            if len(self._plans) >= _CACHED:
                self._plans.clear()
            plan = self._plans[signature] = self._plan(parts)
        kept, weighted, tail = plan
        flats = [flat for _, flat, _, _ in parts]
        if joined is not None:  # every field a view of the joined records
            out = {key: joined[key] if key in joined else torch.cat([f[key] for f in flats]) for key in kept}
        elif len(flats) == 1:
            out = {key: flats[0][key] for key in kept}
        else:
            out = {key: torch.cat([flat[key] for flat in flats]) for key in kept}
        batch_size = (sum(counts), *tail)
        device = out["index"].device
        if weighted:
            out["weight"] = torch.cat(
                [
                    flat["weight"]
                    if "weight" in flat
                    else torch.ones(shape, dtype=torch.float32, device=device)
                    for _, flat, shape, _ in parts
                ]
            )
        out["source"] = self._source_column(counts, batch_size, device)
        return to_tensordict(out, batch_size, device)

    def _plan(self, parts: list[Share]) -> tuple[list[Any], bool, tuple[int, ...]]:
        """The keys a batch of these shares keeps, whether it has weights, the tail shape."""
        parts = [_rows_apart(p) for p in parts]  # (fields from a few rows: checked like any)
        tails = {shape[1:] for _, _, shape, _ in parts}
        if len(tails) > 1:
            raise SpecError(
                f"sample: the sources' batches differ in shape beyond the item dim: {sorted(tails)}"
            )
        weighted = any("weight" in flat for _, flat, _, _ in parts)
        key_sets = [(s, set(flat) - {"weight"}) for s, flat, _, _ in parts]
        if self.keys == "same":
            for s, keys in key_sets[1:]:
                if keys != key_sets[0][1]:
                    refuse_keys(key_sets[0], (s, keys))
        kept = [k for k in parts[0][1] if k != "weight" and all(k in keys for _, keys in key_sets)]
        for key in kept:
            _check_same(key, [(s, flat[key]) for s, flat, _, _ in parts])
        return kept, weighted, next(iter(tails))

    def _source_column(
        self, counts: list[int], batch_size: tuple[int, ...], device: torch.device
    ) -> torch.Tensor:
        """The ``"source"`` entry: made once per distinct counts, copied per batch (never shared)."""
        key = (tuple(counts), batch_size, str(device))
        column = self._columns.get(key)
        if column is None:
            if len(self._columns) >= _CACHED:
                self._columns.clear()
            column = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
            if len(batch_size) > 1:
                column = column.reshape(-1, *(1,) * (len(batch_size) - 1)).expand(batch_size)
            column = self._columns[key] = column.to(device).contiguous()
        return column.clone()


def _batch(
    out: dict[Any, torch.Tensor],
    weights: np.ndarray | None,
    column: np.ndarray,
    size: torch.Size,
    layout: Layout | FieldLayout,
) -> TensorDict:
    """The TensorDict of a batch taken in place: its fields and ``"index"`` (``out``),
    ``"weight"`` where a source gave weights, and ``"source"`` (a copy of the kept column)."""
    if weights is not None:
        out["weight"] = torch.from_numpy(weights)
    out["source"] = torch.from_numpy(column.copy())
    if layout.flat:
        return flat_tensordict(out, size, layout.device)
    return to_tensordict(out, size, layout.device)


def _join_rows(parts: list[Share]) -> dict[Any, torch.Tensor] | None:
    """The fields of every part's rows joined in one array, where every part holds rows
    of one layout (same record dtype, same fields), with ``"index"``; else ``None``.

    Parts taken in place (:meth:`Assembler.sample`), one after another into one batch's
    records, are joined already: their fields are views of those records (no copy).
    Other parts' records are copied into one array.
    """
    first: Any = parts[0][3]
    joint: Any = None if first is None else first[2]
    for part in parts:  # (a loop: ~0.4 µs less than all() of a generator)
        if joint is None or part[3] is None or part[3][2] is not joint:
            break
    else:
        out = first[1].split(joint[0])
        out["index"] = torch.from_numpy(joint[1])
        return out
    if first is None or len(parts) == 1:
        return None
    dtype, reader = first[0].dtype, first[1]
    for part in parts[1:]:
        rows = part[3]
        if rows is None or rows[0].dtype != dtype or rows[1].fields != reader.fields:
            return None
    raw = _RAW.get(dtype.itemsize)
    if raw is None:  # records copied as raw bytes, not field by field
        raw = _RAW[dtype.itemsize] = np.dtype((np.void, dtype.itemsize))
    joined = np.concatenate([part[3][0].view(raw) for part in parts]).view(dtype)
    out = reader.split(joined)
    # the items' ids too: NumPy's concatenate (a CPU buffer's ids are NumPy-backed tensors)
    out["index"] = torch.from_numpy(np.concatenate([part[1]["index"].numpy() for part in parts]))
    return out


def _check_same(key: Any, values: list[tuple[int, torch.Tensor]]) -> None:
    s0, v0 = values[0]
    for s, v in values[1:]:
        if v.shape[1:] != v0.shape[1:] or v.dtype != v0.dtype:
            raise SpecError(
                f"sample: field {key!r}: source {s0} gives {tuple(v0.shape[1:])} {v0.dtype}, "
                f"source {s} gives {tuple(v.shape[1:])} {v.dtype}"
            )
