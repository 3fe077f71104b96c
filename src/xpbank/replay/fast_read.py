"""The read fast path: a sample of every field from one packed CPU block, without the
general path's per-call choices.

A sample of 32 narrow items cost ~20 µs through the general path, and most of it was
not the read: each call asks which sampler, which storage, which fields, n-step or
hindsight relabelling, which device, allocates the slot tensor and walks the storage's
blocks. Where none of that can change the result, the buffer keeps a :class:`ReadPlan`
and reads through it:

- :func:`try_sample`, for the uniform sampler with replacement: the draw into a slot
  tensor kept per batch size (:meth:`UniformSampler.draw_into
  <xpbank.sampler.UniformSampler.draw_into>`: the same draws as the general path), then
  the batch;
- :func:`try_prioritized`, for the prioritized sampler (NumPy trees, numba): its draw
  into the same kept slot tensor (:func:`~xpbank.sampler.prioritized_fast.draw_at`:
  the same draws, weights and schedule as its ``sample``), then the batch with the
  weights;
- :func:`try_read`, after any other sampler's own draw: the batch of its slots and
  per-item ``info``;
- :func:`try_records`, for a sampler that draws and reads the records itself
  (``sample_records``: a :class:`~xpbank.her.HerSampler`, :mod:`xpbank.her.records`);
- :func:`read_run`, after a sampler took a contiguous run of slots (a queue's oldest
  items: :func:`xpbank.table.runs.take_run`): one copy of the run's records.

The batch: ids by NumPy arithmetic (:func:`ids_of_rows`), one ``take`` of whole rows
(:class:`~xpbank.storage.blocks.RecordReader`) and the TensorDict
(:func:`~xpbank.spec.batch.flat_tensordict`). It is the batch the general path returns:
same draws, same keys in the same order, same dtypes and device, fresh memory (a kept
slot tensor never leaves this module).

What it needs, checked on every call (pointer comparisons): no n-step option, no
relabelling sampler, every field asked for, the storage exposes a
:attr:`TensorStorage.host_reader <xpbank.TensorStorage.host_reader>` (one CPU block of
narrow rows), batches delivered on the storage's device, and (for :func:`try_read`)
CPU int64 slots of one batch dim. Anything else takes the general path, which raises
what it raises. ``rb._fast_read = False`` turns it off for a buffer (the tests compare
the two paths).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.ring.ids import Ring
from xpbank.sampler.prioritized import PrioritizedSampler
from xpbank.sampler.prioritized_fast import draw_at
from xpbank.sampler.uniform import UniformSampler
from xpbank.spec.batch import flat_tensordict, to_tensordict

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "ReadPlan",
    "draw_prioritized_at",
    "draw_prioritized_rows",
    "draw_records",
    "ids_of_rows",
    "read_run",
    "try_first",
    "try_prioritized",
    "try_read",
    "try_records",
    "try_sample",
]

# batch sizes whose slot tensors a buffer keeps (a loop samples one or two sizes)
_KEPT_SIZES = 8
# larger samples take the general path (its memory check; the per-call cost is noise there)
_MAX_BATCH = 1 << 16


class ReadPlan:
    """What a buffer's fast sample reads through, and its slot tensors per batch size."""

    def __init__(self, rb: Any, reader: Any):
        self.storage, self.reader, self.sampler = rb._storage, reader, rb._sampler
        self.device = rb._device
        # every field in one CPU block, delivered there
        self.usable = reader is not None and rb._device == rb._storage.device
        self.uniform = type(rb._sampler) is UniformSampler  # try_sample draws for it
        self.prioritized = type(rb._sampler) is PrioritizedSampler  # try_prioritized draws for it
        self.flat = self.usable and all(type(k) is str for k in reader.keys)  # no nested keys
        # the records' address and row size, for a draw's prefetch (prioritized_fast.draw_at)
        records = reader.records if self.usable else None
        self.records_at = (0, 0) if records is None else (int(records.ctypes.data), records.strides[0])
        # batch size -> (slot tensor, its NumPy view, the batch's torch.Size)
        self.draws: dict[int, tuple[torch.Tensor, Any, torch.Size]] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        # it holds NumPy views of the storage and of its slot tensors: rebuilt on use
        return (_nothing, ())

    def draw(self, batch_size: int) -> tuple[torch.Tensor, Any, torch.Size]:
        found = self.draws.get(batch_size)
        if found is None:
            if len(self.draws) >= _KEPT_SIZES:
                self.draws.clear()
            slots = torch.empty(batch_size, dtype=torch.int64)
            found = self.draws[batch_size] = (slots, slots.numpy(), torch.Size((batch_size,)))
        return found


def _nothing() -> None:
    return None


def _plan(rb: Any) -> ReadPlan | None:
    """The buffer's read plan, made anew where what it reads through has changed;
    ``None`` where the fast path does not apply."""
    state = rb.__dict__
    if not state.get("_fast_read", True):
        return None
    storage = rb._storage
    reader = getattr(storage, "host_reader", None)
    plan = state.get("_read_plan")
    if (
        plan is not None
        and plan.reader is reader
        and plan.storage is storage
        and plan.sampler is rb._sampler
        and plan.device is rb._device
    ):
        return plan if plan.usable else None
    plan = ReadPlan(rb, reader)
    state["_read_plan"] = plan
    return plan if plan.usable else None


def _uniform_draw(rb: Any, batch_size: Any) -> tuple[ReadPlan, np.ndarray, torch.Size] | None:
    """The uniform sampler's draw with replacement into the plan's kept slot tensor:
    ``(plan, the slots as NumPy rows, the batch's size)``, or ``None`` where the fast
    path does not apply (the caller holds the lock)."""
    ring = rb._ring
    if type(batch_size) is not int or not 0 < batch_size <= _MAX_BATCH or ring.size == 0:
        return None
    if rb._nstep is not None:
        return None
    plan = _plan(rb)
    if plan is None or not plan.uniform:
        return None
    slots, rows, size = plan.draw(batch_size)
    plan.sampler.draw_into(ring, slots, rb._generator)
    return plan, rows, size


def try_sample(rb: Any, batch_size: Any) -> TensorDict | None:
    """``sample(batch_size)`` of every field with replacement from a buffer with the
    uniform sampler (the caller holds the lock), or ``None``: the general path takes the
    call (and raises what it raises)."""
    drawn = _uniform_draw(rb, batch_size)
    if drawn is None:
        return None
    plan, rows, size = drawn
    return _batch(plan, rb._ring, rows, size, None)


def _prioritized_rows(
    rb: Any, batch_size: Any
) -> tuple[ReadPlan, torch.Tensor, np.ndarray, torch.Size] | None:
    """The plan and its kept slot tensor for the prioritized sampler's draw with
    replacement: ``(plan, slots, the slots' NumPy view, the batch's size)``, or ``None``
    where the fast path does not apply (the caller holds the lock)."""
    ring = rb._ring
    if type(batch_size) is not int or not 0 < batch_size <= _MAX_BATCH or ring.size == 0:
        return None
    if rb._nstep is not None or type(ring) is not Ring:
        return None
    plan = _plan(rb)
    if plan is None or not plan.prioritized:
        return None
    slots, rows, size = plan.draw(batch_size)
    return plan, slots, rows, size


def try_prioritized(rb: Any, batch_size: Any) -> TensorDict | None:
    """``sample(batch_size)`` of every field from a buffer with the prioritized sampler
    (the caller holds the lock), or ``None`` before anything is drawn: the general path
    takes the call (and raises what it raises)."""
    found = _prioritized_rows(rb, batch_size)
    if found is None:
        return None
    plan, slots, rows, size = found
    ids = torch.from_numpy(np.empty(batch_size, dtype=np.int64))  # (~0.2 µs less than torch.empty)
    weights = draw_at(plan.sampler, rb._ring, slots, rb._generator, plan.records_at, ids.data_ptr())
    if weights is None:
        return None
    return _batch(plan, rb._ring, rows, size, {"weight": torch.from_numpy(weights)}, ids)  # the draw's ids


def draw_prioritized_rows(rb: Any, batch_size: int) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray] | None:
    """:func:`try_prioritized`'s draw, stopping before the read: ``(the drawn slots as
    NumPy rows, their float32 weights, the RecordReader whose records they index, the
    items' ids the draw wrote)``, for a :class:`~xpbank.Mixture`'s share, as
    :func:`draw_records` for a uniform source; ``None`` where :func:`try_prioritized`
    would decline. The rows are the plan's kept slot array: read them before this
    buffer's next draw. The caller holds the lock."""
    found = _prioritized_rows(rb, batch_size)
    if found is None:
        return None
    plan, slots, rows, _ = found
    ids = torch.from_numpy(np.empty(batch_size, dtype=np.int64))
    weights = draw_at(plan.sampler, rb._ring, slots, rb._generator, plan.records_at, ids.data_ptr())
    if weights is None:
        return None
    return rows, weights, plan.reader, ids.numpy()


def draw_prioritized_at(rb: Any, batch_size: int, ids_at: int, weights: np.ndarray) -> np.ndarray | None:
    """:func:`draw_prioritized_rows`' draw with the items' ids written at address
    ``ids_at`` (int64, ``batch_size`` long) and their weights into ``weights`` (float32,
    ``batch_size`` long): a :class:`~xpbank.Mixture`'s share written straight into its
    batch. Returns the drawn slots as NumPy rows (the plan's kept array: read them before
    this buffer's next draw), or ``None`` where :func:`try_prioritized` would decline
    (nothing drawn or written). The caller holds the lock."""
    found = _prioritized_rows(rb, batch_size)
    if found is None:
        return None
    plan, slots, rows, _ = found
    if draw_at(plan.sampler, rb._ring, slots, rb._generator, plan.records_at, ids_at, weights) is None:
        return None
    return rows


def draw_records(rb: Any, batch_size: int) -> tuple[np.ndarray, Any] | None:
    """:func:`try_sample`'s draw, stopping before the read: ``(the drawn slots as NumPy
    rows, the RecordReader whose records they index)``, for a :class:`~xpbank.Mixture`'s
    share (which takes several sources' records into one batch); ``None`` where
    :func:`try_sample` would decline. The rows are the plan's kept slot array: read them
    before this buffer's next draw. The caller holds the lock."""
    if type(rb._sampler) is not UniformSampler:  # (try_sample's caller checks this first too)
        return None
    drawn = _uniform_draw(rb, batch_size)
    if drawn is None:
        return None
    plan, rows, _ = drawn
    return rows, plan.reader


def try_read(
    rb: Any, slots: torch.Tensor, info: dict[str, torch.Tensor], own_ids: bool = False
) -> TensorDict | None:
    """Every field of the items in ``slots`` with the sampler's ``info``, as the general
    path reads them after another sampler's draw (the caller holds the lock and has
    checked that no n-step option or relabelling applies), or ``None``: ``slots`` or
    ``info`` are not CPU tensors of one batch dim (the general path reads them).
    ``own_ids``: the ring keeps each slot's id (a :class:`~xpbank.Table`'s ring, whose
    slots are reused out of order): the ids are read from it."""
    plan = _plan(rb)
    if plan is None or slots.ndim != 1:
        return None
    try:
        rows = slots.numpy()
    except (RuntimeError, TypeError):  # not on the CPU
        return None
    if rows.dtype != np.int64:
        return None
    for value in info.values():  # a loop, not all(...): ~0.3 µs less for one entry
        if not value.is_cpu:
            return None
    ring = rb._ring
    return _batch(plan, ring, rows, slots.shape, info, ring.ids[rows] if own_ids else None)


def try_first(rb: Any, take: Any, batch_size: Any) -> TensorDict | None:
    """Every field of the items ``take(batch_size)`` takes (a heap table's first items:
    :func:`xpbank.table.fast.take_first`, ``(slots, ids)`` or ``None``), as the general
    path reads them, or ``None`` with nothing taken where the fast path does not apply.
    The caller holds the lock and has checked that no field list or option applies."""
    if type(batch_size) is not int or batch_size > _MAX_BATCH:
        return None
    plan = _plan(rb)
    if plan is None:
        return None
    got = take(batch_size)
    if got is None:
        return None
    rows, ids = got
    return _batch(plan, rb._ring, rows, torch.Size((rows.shape[0],)), None, ids)


def read_run(rb: Any, start: int, ids: np.ndarray) -> TensorDict | None:
    """Every field of the items in slots ``start, start + 1, ...`` with ``"index"`` =
    ``ids`` (one per item), as the general path reads them (one copy of the records),
    or ``None`` where the fast path does not apply. The caller holds the lock."""
    plan = _plan(rb)
    if plan is None:
        return None
    n = ids.shape[0]
    flat = plan.reader.split(plan.reader.records[start : start + n].copy())
    flat["index"] = torch.from_numpy(ids)
    size = torch.Size((n,))
    if plan.flat:
        return flat_tensordict(flat, size, plan.device)
    return to_tensordict(flat, size, plan.device)


def try_records(rb: Any, batch_size: Any) -> TensorDict | None:
    """``sample(batch_size)`` of every field with replacement from a buffer whose sampler
    reads the records itself (``sampler.sample_records(plan, ring, batch_size,
    generator)``: a :class:`~xpbank.her.HerSampler`'s relabelled draw, see
    :mod:`xpbank.her.records`), or ``None``: the general path takes the call (the caller
    holds the lock)."""
    sample_records = getattr(rb._sampler, "sample_records", None)
    ring = rb._ring
    if sample_records is None or type(batch_size) is not int or not 0 < batch_size <= _MAX_BATCH:
        return None
    if ring.size == 0 or rb._nstep is not None or type(ring) is not Ring:
        return None
    plan = _plan(rb)
    if plan is None:
        return None
    got = sample_records(plan, ring, batch_size, rb._generator)
    if got is None:
        return None
    records, ids, info = got
    flat = plan.reader.split(records)
    flat["index"] = torch.from_numpy(ids)
    flat.update(info)
    kept = plan.draws.get(batch_size)  # (plan.draw's, without its call)
    size = (kept or plan.draw(batch_size))[2]
    if plan.flat:
        return flat_tensordict(flat, size, plan.device)
    return to_tensordict(flat, size, plan.device)


def _batch(
    plan: ReadPlan,
    ring: Any,
    rows: np.ndarray,
    size: torch.Size,
    info: dict[str, torch.Tensor] | None,
    ids: np.ndarray | torch.Tensor | None = None,
) -> TensorDict:
    """The batch of ``rows``: the fields, ``"index"``, then ``info``'s entries, as the
    general path's ``reading.gather`` orders them (``ids``: the rows' ids, a new array
    or tensor, where the draw computed them)."""
    if ids is None:
        ids = ids_of_rows(ring, rows)  # a new array: a kept slot tensor stays in this module
    flat = plan.reader.read(rows)
    flat["index"] = ids if type(ids) is torch.Tensor else torch.from_numpy(ids)
    if info:
        flat.update(info)
    if plan.flat:
        return flat_tensordict(flat, size, plan.device)
    return to_tensordict(flat, size, plan.device)


def ids_of_rows(ring: Any, rows: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The ids of the live items in slots ``rows`` (a NumPy int64 index), as
    :meth:`Ring.ids_of_slots <xpbank.ring.ids.Ring.ids_of_slots>` gives them, in a
    new array or written into ``out`` (int64, the shape of ``rows``).

    The live ids are ``[first, first + size)`` and an id's slot is ``id % capacity``, so
    a live slot ``s`` holds id ``first + (s - first) mod capacity``: two in-place NumPy
    ops on a fresh array (one where nothing has wrapped), ~1 µs less than the general
    method's ``where`` at 32 slots.
    """
    first = ring.next_id - ring.size
    offset = first % ring.capacity  # the oldest item's slot
    if offset == 0:
        return np.add(rows, first, out=out)
    ids = np.subtract(rows, offset, out=out)
    ids %= ring.capacity
    ids += first
    return ids
