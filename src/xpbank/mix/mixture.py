"""``Mixture``: batches drawn from several buffers and banks in set proportions.

A sampling-time composition: each source is a :class:`~xpbank.ReplayBuffer` (a live
buffer, or a bank opened with ``xpbank.open_bank(path, "r")``: memory-mapped, so a
large offline dataset is read page by page as sampled, never loaded) and keeps its own
sampler, n-step option and RNG. The mixture only decides how many items each source
gives to a batch and draws each share with the source's own sampler. Where the sources
store their fields alike (one packed layout, or a memory-mapped bank beside buffers of
the same fields) each share's rows are taken straight into one batch allocated once
(:mod:`xpbank.mix.inplace`, :mod:`xpbank.mix.fields`); otherwise each share is read by
the source's own read path and the shares are joined (:mod:`xpbank.mix.assemble`). No
TensorDict is made per share.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import BankError, CapacityError, DeviceError, EmptyBufferError, PriorityError, SpecError
from xpbank.mix import routing
from xpbank.mix.assemble import Assembler, refuse_keys
from xpbank.mix.schedule import Constant, Linear, Schedule, as_schedule, split_counts
from xpbank.replay import ReplayBuffer
from xpbank.storage.base import check_device

__all__ = ["Mixture", "METADATA_KEY"]

METADATA_KEY = "xpbank.mix"  # where Mixture.save puts the mixture's state in a bank's metadata


class Mixture:
    """Batches that hold a set share of items from each of several sources.

    Every batch holds exactly ``split_counts(weights at this step, batch_size)`` items
    from each source (largest-remainder rounding, see
    :func:`~xpbank.mix.schedule.split_counts`), in source order, not a coin flip per
    item (``exact=False`` asks for one: counts drawn from a multinomial with the
    mixture's generator). The step is the number of ``sample`` calls made so far; a
    schedule such as ``Linear(0.5, 0.0, steps=N)`` anneals a source's weight over N
    batches. Weights are relative: they are divided by their sum at each step.

    A batch carries the sources' own entries plus ``"source"`` (int64, the source
    number of each item) and ``"index"`` (each item's id in its own source): pass both
    back to :meth:`update` and :meth:`update_priority`.

    **Importance weights**: when a source's sampler adds ``"weight"`` (a prioritized
    one), its items keep that weight exactly as the source computed it (normalized
    within the source); items of the other sources get 1.0. The mixing proportions are
    chosen by the user, not a sampling bias to correct, and each source's sub-batch
    stays an unbiased estimate of that source's loss, as if sampled alone.

    **Keys**: ``keys="same"`` (default) refuses sources whose batches differ in keys;
    ``keys="common"`` keeps only the keys every source's batch has. A key kept from
    several sources must have the same shape and dtype in each.

    Args:
        sources: the buffers; a path is opened with ``xpbank.open_bank(path, "r")``.
        weights: one per source: a number >= 0, :class:`Constant` or :class:`Linear`.
        seed: seeds the mixture's own generator (used by ``exact=False`` only; each
            source samples with its own generator, seeded at its construction).
        exact: exact counts per batch (default) or a multinomial draw per batch.
        keys: ``"same"`` or ``"common"`` (above).
        device: where batches are delivered. ``None`` (default): the sources' device,
            which must then be one. Given, each share is moved there before the batch
            is joined: an online buffer on ``"cuda"`` beside a bank on disk (opened on
            the CPU) gives batches on ``"cuda"`` with ``device="cuda"``.

    Example:
        >>> import torch, xpbank
        >>> from xpbank.mix import Linear
        >>> online = xpbank.ReplayBuffer(100, seed=0)
        >>> _ = online.extend({"x": torch.zeros(10)})
        >>> offline = xpbank.ReplayBuffer(100, seed=1)
        >>> _ = offline.extend({"x": torch.ones(50)})
        >>> mix = xpbank.Mixture([online, offline], [Linear(0.5, 1.0, steps=10), Linear(0.5, 0.0, steps=10)])
        >>> batch = mix.sample(8)
        >>> batch["source"].tolist()
        [0, 0, 0, 0, 1, 1, 1, 1]
        >>> mix.counts(8)  # the next batch's counts (step 1)
        [4, 4]
        >>> mix.update(batch["source"], batch["index"], {"x": torch.full((8,), 2.0)})
    """

    def __init__(
        self,
        sources: Sequence[ReplayBuffer | str | os.PathLike[str]],
        weights: Sequence[float | Schedule],
        *,
        seed: int | None = None,
        exact: bool = True,
        keys: str = "same",
        device: Any = None,
    ) -> None:
        if len(sources) == 0:
            raise CapacityError("sources: expected at least one source, got none")
        if len(weights) != len(sources):
            raise CapacityError(f"weights: expected one per source ({len(sources)}), got {len(weights)}")
        if keys not in ("same", "common"):
            raise SpecError(f"keys: expected 'same' or 'common', got {keys!r}")
        self.sources: tuple[ReplayBuffer, ...] = tuple(_open(s, i) for i, s in enumerate(sources))
        devices = {str(rb.device) for rb in self.sources}
        self.device: torch.device | None = None if device is None else check_device(device)
        if len(devices) > 1 and self.device is None:
            raise DeviceError(
                f"sources: expected one device, got {sorted(devices)}; "
                "pass device= (e.g. device='cuda') to deliver every batch there"
            )
        self.weights: tuple[Schedule, ...] = tuple(
            as_schedule(w, f"weights[{i}]") for i, w in enumerate(weights)
        )
        self.exact = bool(exact)
        self.keys = keys
        self.step = 0
        self.generator = torch.Generator()
        if seed is not None:
            self.generator.manual_seed(int(seed))
        else:
            self.generator.seed()
        self._lock = threading.RLock()
        self._assembler = Assembler(keys)
        self._counts: dict[tuple[Any, ...], list[int]] = {}  # (weights, batch size) -> counts
        # constant weights (every schedule a Constant): batch size -> counts, else None
        self._fixed: dict[int, list[int]] | None = (
            {} if all(type(w) is Constant for w in self.weights) else None
        )
        self._fixed_for = self.weights  # (the weights those counts are of)
        self._checked: tuple[Any, ...] | None = None  # the specs whose keys were found the same

    def __repr__(self) -> str:
        return f"Mixture(sources={len(self.sources)}, weights={list(self.weights)}, step={self.step})"

    # -- counts -----------------------------------------------------------------
    def fractions(self, step: int | None = None) -> list[float]:
        """Each source's share of a batch at ``step`` (default: the next batch's)."""
        w = np.array([s(self.step if step is None else step) for s in self.weights], dtype=np.float64)
        if not w.sum() > 0:
            raise CapacityError(f"weights: every weight is 0 at step {self.step if step is None else step}")
        return [float(f) for f in w / w.sum()]

    def counts(self, batch_size: int) -> list[int]:
        """The items each source gives to the next batch (``exact=True``; no state changes)."""
        key = (batch_size, *[s(self.step) for s in self.weights])
        found = self._counts.get(key)
        if found is None:  # constant weights: computed once
            if len(self._counts) >= 64:
                self._counts.clear()
            found = self._counts[key] = split_counts(key[1:], batch_size)
        return list(found)

    def _draw_counts(self, batch_size: int) -> list[int]:
        """The next batch's counts (read only: a kept list where the weights are constant)."""
        if self.exact:
            fixed = self._fixed
            if fixed is None or self._fixed_for is not self.weights:
                return self.counts(batch_size)
            found = fixed.get(batch_size)
            if found is None:
                if len(fixed) >= 64:
                    fixed.clear()
                found = fixed[batch_size] = self.counts(batch_size)
            return found
        p = torch.tensor(self.fractions(), dtype=torch.float64)
        drawn = torch.multinomial(p, batch_size, replacement=True, generator=self.generator)
        return [int(c) for c in torch.bincount(drawn, minlength=len(self.sources))]

    # -- sampling ---------------------------------------------------------------
    def sample(
        self, batch_size: int, replace: bool = True, fields: Sequence[Any] | None = None
    ) -> TensorDict:
        """Draw ``batch_size`` items: each source's count as its own ``sample(k, replace, fields)``.

        Each source draws as its own ``sample`` does (its sampler, generator and options
        such as n-step, under its own lock: the same items); the shares' rows are taken
        into one batch (or, for sources stored differently, concatenated key by key).
        Items are grouped by source, in source order. The returned batch is new memory
        (never aliases a source, nor an earlier batch).

        Raises:
            EmptyBufferError: a source with a share of this batch holds nothing.
            CapacityError: ``replace=False`` and a source holds fewer items than its share.
            SpecError: the sources' batches differ in keys (``keys="same"``), or a kept
                key differs in shape or dtype between sources.
        """
        kind = type(batch_size)  # (an int: one check)
        if (kind is not int and (kind is bool or not isinstance(batch_size, int))) or batch_size <= 0:
            raise CapacityError(f"batch_size: expected an int > 0, got {batch_size!r}")
        with self._lock:
            counts = self._draw_counts(batch_size)
            self._check_sources(counts, replace)  # before any source draws
            batch = self._assembler.sample(self.sources, counts, replace, fields, self.device)
            self.step += 1
            return batch

    def _check_sources(self, counts: list[int], replace: bool) -> None:
        same = self.keys == "same"
        given = []  # (source, spec) of the sources with a share and a spec
        sources = self.sources
        for s, k in enumerate(counts):
            if k:
                rb = sources[s]
                n = len(rb)
                if not n or (not replace and k > n):
                    _refuse_share(s, k, n)
                if same and (spec := rb.spec) is not None:
                    given.append((s, spec))
        if same and (seen := tuple(given)) != self._checked:
            # specs are compared by value: checked once per change (an empty spec is none)
            specs = [(s, set(spec.keyset)) for s, spec in seen if spec]
            for s, keys in specs[1:]:
                if keys != specs[0][1]:
                    refuse_keys(specs[0], (s, keys))
            self._checked = seen

    # -- updates ----------------------------------------------------------------
    def update(self, source: Any, indices: Any, values: Any) -> None:
        """Write ``values`` back to the items ``(source, indices)`` of a mixed batch.

        Rows are split by ``source`` and passed to each source's
        :meth:`~xpbank.ReplayBuffer.update`; the Mixture's ``"source"`` and ``"weight"``
        entries are dropped, so a uniform mixed batch can be passed back whole.
        Every involved source's lock is held for the whole call, and the ids (stale or
        not), read-only sources, row counts and keys of every source are checked before
        any source is written: a refused call writes nothing.

        Raises:
            ReadOnlyError: a row of a source that is a bank opened ``"r"``.
            StaleIndexError: an id overwritten or cleared since it was sampled.
            SpecError: a key that source does not store; not one row per index.
        """
        split = routing.split_by_source(source, indices, len(self.sources))
        ids = routing._as_int_array(indices, "indices")
        involved = [self.sources[s] for s in sorted(split)]
        with routing.all_locks(involved):
            plans = []
            for s, pos in sorted(split.items()):
                rb = self.sources[s]
                routing.check_writable(rb, s)
                if rb.spec is None:
                    raise EmptyBufferError(f"update: source {s} is empty; nothing was updated")
                rb._ring.slots_of_ids(ids[pos])  # raises on stale ids, writes nothing
                plans.append((rb, ids[pos], routing.rows_of(values, pos, ids.shape[0], rb, s)))
            for rb, sub_ids, rows in plans:
                rb.update(sub_ids, rows)

    def update_priority(self, source: Any, indices: Any, priorities: Any, stale: str = "raise") -> None:
        """Set priorities of the items ``(source, indices)``, each in its own source.

        Every involved source must keep priorities (a prioritized sampler). With
        ``stale="raise"`` every id of every source is checked before any priority is
        written; ``"skip"`` drops stale ids, as :meth:`ReplayBuffer.update_priority`.

        Raises:
            PriorityError: a source without priorities; NaN, infinite or negative
                priorities, or not one per index; ``stale`` not ``"raise"``/``"skip"``.
            StaleIndexError: (``stale="raise"``) an overwritten or cleared id.
        """
        if stale not in ("raise", "skip"):
            raise PriorityError(f"stale: expected 'raise' or 'skip', got {stale!r}")
        split = routing.split_by_source(source, indices, len(self.sources))
        ids = routing._as_int_array(indices, "indices")
        p = routing.check_priorities(priorities, ids.shape[0])
        with routing.all_locks([self.sources[s] for s in sorted(split)]):
            for s in sorted(split):
                rb = self.sources[s]
                if getattr(rb.sampler, "update_priority", None) is None:
                    raise PriorityError(
                        f"update_priority: source {s} ({rb.sampler!r}) keeps no priorities; "
                        "nothing was written"
                    )
                if stale == "raise":
                    rb._ring.slots_of_ids(ids[split[s]])
            for s, pos in sorted(split.items()):
                self.sources[s].update_priority(ids[pos], p[pos], stale)

    # -- state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The mixture's own state: its step and generator (JSON-able).

        The sources' states (their items, samplers and generators) are their own
        ``state_dict()``s or banks: restore those too to resume a run bit for bit.
        """
        with self._lock:
            return {
                "step": self.step,
                "generator": bytes(self.generator.get_state().numpy()).hex(),
                "weights": [_describe(w) for w in self.weights],
                "exact": self.exact,
                "keys": self.keys,
            }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a :meth:`state_dict` (of a mixture with the same weights)."""
        if [_describe(w) for w in self.weights] != state.get("weights"):
            raise SpecError(
                f"load_state_dict: saved with weights {state.get('weights')}, this mixture has "
                f"{[_describe(w) for w in self.weights]}"
            )
        raw = np.frombuffer(bytes.fromhex(state["generator"]), dtype=np.uint8).copy()
        with self._lock:
            self.generator.set_state(torch.from_numpy(raw))
            self.step = int(state["step"])

    def save(self, path: str | os.PathLike[str], source: int = 0) -> Path:
        """Save source ``source`` as a bank at ``path``, with this mixture's state in its
        ``metadata`` under ``"xpbank.mix"`` (other metadata of that source's bank kept).

        Reload with ``xpbank.load(path)`` (or ``open_bank``) and :meth:`load_saved`.
        """
        from xpbank.bank import bank_metadata, save

        rb = self.sources[source]
        return save(rb, path, metadata={**bank_metadata(rb), METADATA_KEY: self.state_dict()})

    def load_saved(self, bank: ReplayBuffer) -> None:
        """Resume from the state :meth:`save` put in ``bank``'s metadata (a loaded or opened bank)."""
        from xpbank.bank import bank_metadata

        state = bank_metadata(bank).get(METADATA_KEY)
        if state is None:
            raise BankError(
                f"load_saved: the bank's metadata holds no {METADATA_KEY!r} entry (not saved by Mixture.save)"
            )
        self.load_state_dict(state)


def _refuse_share(s: int, k: int, n: int) -> NoReturn:
    """Raise for source ``s``'s share of ``k`` items where it holds ``n``: none, or (drawn
    without replacement) fewer than ``k``."""
    if n == 0:
        raise EmptyBufferError(
            f"sample: source {s} is empty but its weight gives it {k} items of this batch; "
            "fill it first or give it weight 0"
        )
    raise CapacityError(
        f"sample: source {s}: {k} distinct items asked for (replace=False), but only {n} are stored"
    )


def _open(source: Any, i: int) -> ReplayBuffer:
    if isinstance(source, ReplayBuffer):
        return source
    if isinstance(source, str | os.PathLike):
        from xpbank.bank import open_bank

        return open_bank(source, "r")
    raise SpecError(f"sources[{i}]: expected a ReplayBuffer or a bank path, got {type(source).__name__}")


def _describe(w: Schedule) -> list[Any]:
    if isinstance(w, Linear):
        return ["linear", w.start, w.end, w.steps]
    return ["constant", w.value] if isinstance(w, Constant) else [repr(w)]
