"""The read path of a :class:`~xpbank.ReplayBuffer`: drawing a sample, reading items by
position, epochs of minibatches, and turning slots into a batch (:func:`gather`).

Each function takes the buffer (its :class:`~xpbank.replay.parts.BufferParts`); the
buffer's public methods call them holding its lock. Nothing here writes to storage.

:func:`gather` reshapes the storage's flat gather of ``[B, L]`` slots (a sequence
sampler's windows) to ``[B, L, ...]``, the only change a 2-D sampler needed; n-step
hands it the fields it already read as ``flat``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from xpbank.errors import BufferChangedError, CapacityError, EmptyBufferError, SpecError, check_positive_int
from xpbank.replay.fast_read import read_run, try_first, try_prioritized, try_read, try_records, try_sample
from xpbank.replay.parts import BufferParts
from xpbank.replay.to_device import rows_to, slots_and_ids_to
from xpbank.ring.ids import Ring
from xpbank.sampler import PrioritizedSampler, UniformSampler, epoch_plan
from xpbank.spec.batch import to_tensordict
from xpbank.spec.spec import NestedKey, check_fields
from xpbank.storage.base import check_alloc, item_bytes

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "draw",
    "draw_slots",
    "epochs",
    "gather",
    "gather_flat",
    "read_keys",
    "require_items",
    "sample",
    "sample_all",
    "sample_by_index",
    "sample_slots",
]

# past this many items sample() first checks that they fit in the device's memory
_LARGE_SAMPLE = 1 << 20


def read_keys(rb: BufferParts, fields: Sequence[Any] | None) -> list[NestedKey] | None:
    """The checked keys of ``fields`` (``None``: every field)."""
    return None if fields is None else check_fields(rb.spec, fields)


def require_items(rb: BufferParts, what: str) -> None:
    """Raise :class:`~xpbank.EmptyBufferError` (naming ``what``) if nothing is stored."""
    if rb._ring.size == 0:
        raise EmptyBufferError(f"{what}: the buffer is empty; add or extend first")


def gather(
    rb: BufferParts,
    slots: torch.Tensor,
    ids: torch.Tensor,
    keys: list[NestedKey] | None,
    info: dict[str, torch.Tensor] | None = None,
    flat: dict[Any, torch.Tensor] | None = None,
) -> TensorDict:
    """Read ``slots`` (``keys`` already checked by :func:`read_keys`) into a batch.

    ``slots`` of shape ``[B, L]`` (a sequence sampler's windows) give a ``[B, L]`` batch.
    ``flat``: the fields already read (n-step reads the items with their windows).
    """
    device, stored = rb._device, rb._storage.device
    if device.type == "cuda" and stored.type == "cpu" and flat is None and keys is None:
        rows = rows_to(rb._storage, slots, device)  # a packed block's rows to the GPU in one copy
        if rows is not None:
            flat = gather_flat(rb, slots, ids, keys, info, rows)
            flat = {key: v if v.device == device else v.to(device) for key, v in flat.items()}
            return to_tensordict(flat, tuple(slots.shape), device)
    flat = gather_flat(rb, slots, ids, keys, info, flat)
    td = to_tensordict(flat, tuple(slots.shape), stored)
    if stored != device:
        td = td.to(device, non_blocking=device.type == "cuda")
    return td


def gather_flat(
    rb: BufferParts,
    slots: torch.Tensor,
    ids: torch.Tensor,
    keys: list[NestedKey] | None,
    info: dict[str, torch.Tensor] | None = None,
    flat: dict[Any, torch.Tensor] | None = None,
) -> dict[Any, torch.Tensor]:
    """:func:`gather`'s entries before they become a TensorDict: ``{key: tensor}`` on the
    storage's device, ``"index"`` and ``info`` included (a :class:`~xpbank.Mixture` joins
    several sources' entries into one batch)."""
    device = rb._storage.device
    if flat is None:
        if device.type == "cuda":  # slots and ids to the GPU in one copy (see to_device)
            sent = slots_and_ids_to(slots, ids, device)
            if sent is not None:
                slots, ids = sent
        flat = rb._storage.gather(slots.reshape(-1) if slots.ndim > 1 else slots, keys)
        if slots.ndim > 1:
            flat = {k: v.reshape(*slots.shape, *v.shape[1:]) for k, v in flat.items()}
    # check_reserved keeps a stored field from being shadowed by "index"
    flat["index"] = ids if ids.device == device else ids.to(device)  # .to's parsing: ~1 us
    if info:
        flat.update({name: value.to(device) for name, value in info.items()})
    return flat


def sample(
    rb: BufferParts,
    batch_size: int,
    replace: bool,
    fields: Sequence[Any] | None,
    options: dict[str, Any] | None = None,
) -> TensorDict:
    """:meth:`ReplayBuffer.sample <xpbank.ReplayBuffer.sample>`'s work (the caller holds the lock).

    ``options`` go to the sampler, which names those it takes in ``sample_options``; a
    sampler with a rate limiter (``limiter``, a :class:`~xpbank.Table`'s) decides itself
    whether there is enough to draw, and may wait for it.
    """
    take = rb.__dict__.get("_take_run")  # a Table's oldest items as one run: xpbank.table.runs
    # a timeout matters only to a wait, and a run is taken only where none is needed
    if (
        take is not None
        and fields is None
        and (not options or options.keys() == {"timeout"})
        and rb.__dict__.get("_fast_read", True)
    ):
        taken = take(batch_size, replace)
        if taken is not None:
            return _read_run(rb, *taken)
    first = rb.__dict__.get("_take_first")  # a heap table's first items: xpbank.table.fast
    if first is not None and not replace and fields is None and not options:
        batch = try_first(rb, first, batch_size)
        if batch is not None:
            return batch
    if replace and fields is None and not options:
        kind = type(rb._sampler)
        if kind is UniformSampler:
            batch = try_sample(rb, batch_size)  # see fast_read.py
        elif kind is PrioritizedSampler:
            batch = try_prioritized(rb, batch_size)
        else:  # a sampler that reads the records itself (HerSampler), or None
            batch = try_records(rb, batch_size)
        if batch is not None:
            return batch
    keys, slots, info = _draw_slots(rb, batch_size, replace, fields, options)
    if keys is None and rb._nstep is None and getattr(rb._sampler, "relabel", None) is None:
        plain = type(rb._ring) is Ring
        if plain or getattr(rb._ring, "keeps_ids", False):  # a Table's ring: its own ids
            batch = try_read(rb, slots, info, not plain)  # e.g. a prioritized sample: see fast_read.py
            if batch is not None:
                return batch
    return gather(rb, *_read_plan(rb, keys, slots, info))


def _read_run(rb: BufferParts, start: int, ids: Any) -> TensorDict:
    """The batch of the items a sampler took from slots ``start, start + 1, ...`` (``ids``:
    their ids, a NumPy int64 array), as :func:`gather` reads them."""
    batch = read_run(rb, start, ids)
    if batch is not None:
        return batch
    return gather(rb, torch.arange(start, start + ids.shape[0]), torch.from_numpy(ids), None, {})


def draw(
    rb: BufferParts, batch_size: int, replace: bool, fields: Sequence[Any] | None
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    list[NestedKey] | None,
    dict[str, torch.Tensor],
    dict[Any, torch.Tensor] | None,
]:
    """:func:`sample` up to the read: ``(slots, ids, keys, info, flat)``, the arguments
    of :func:`gather` / :func:`gather_flat` (``flat``: the fields n-step or the sampler's
    ``relabel`` read already, else ``None``). The caller holds the lock."""
    return _read_plan(rb, *_draw_slots(rb, batch_size, replace, fields, None))


def draw_slots(
    rb: BufferParts, batch_size: int, replace: bool
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """:func:`sample`'s checks and the sampler's draw of every field, before the read:
    ``(slots, info)``, for a caller that reads the slots itself as :func:`sample` would
    (a :class:`~xpbank.Mixture`'s share of a plain buffer: no n-step option, no
    relabelling, the ring's own ids). The caller holds the lock."""
    return _draw_slots(rb, batch_size, replace, None, None)[1:]


def _draw_slots(
    rb: BufferParts,
    batch_size: int,
    replace: bool,
    fields: Sequence[Any] | None,
    options: dict[str, Any] | None,
) -> tuple[list[NestedKey] | None, torch.Tensor, dict[str, torch.Tensor]]:
    """The checks of a sample, then the sampler's draw: ``(keys, slots, info)``."""
    batch_size = check_positive_int("batch_size", batch_size)
    takes = getattr(rb._sampler, "sample_options", ())
    unknown = [name for name in options or () if name not in takes]
    if unknown:
        raise SpecError(
            f"sample: {rb._sampler!r} takes no option {unknown[0]!r} (it takes: {list(takes) or 'none'})"
        )
    if getattr(rb._sampler, "limiter", None) is not None:
        keys = read_keys(rb, fields) if rb.spec is not None else None  # checked before anything is drawn
        slots, info = rb._sampler.sample(rb._ring, batch_size, rb._generator, replace, **(options or {}))
        return (keys if rb.spec is None or keys is not None else read_keys(rb, fields)), slots, info
    require_items(rb, "sample")
    if batch_size > _LARGE_SAMPLE and rb.spec is not None:  # B items need B rows (+ ids) in memory
        row = 16 + item_bytes(rb.spec, read_keys(rb, fields))
        check_alloc("sample: batch_size", batch_size, row, rb._device)
    if not replace and batch_size > rb._ring.size:
        raise CapacityError(
            f"sample: {batch_size} distinct items asked for (replace=False), but only "
            f"{rb._ring.size} are stored"
        )
    keys = read_keys(rb, fields)  # checked before any randomness is drawn
    if options:
        slots, info = rb._sampler.sample(rb._ring, batch_size, rb._generator, replace, **options)
    else:
        slots, info = rb._sampler.sample(rb._ring, batch_size, rb._generator, replace)
    return keys, slots, info


def _read_plan(
    rb: BufferParts, keys: list[NestedKey] | None, slots: torch.Tensor, info: dict[str, torch.Tensor]
) -> tuple[
    torch.Tensor,
    torch.Tensor,
    list[NestedKey] | None,
    dict[str, torch.Tensor],
    dict[Any, torch.Tensor] | None,
]:
    """The drawn slots' ids and what n-step or the sampler's ``relabel`` read already."""
    ids = rb._ring.ids_of_slots(slots)
    flat = None
    if rb._nstep is not None:  # the items' fields and their n-step entries in one read
        flat = rb._nstep.gather(rb._storage, rb._ring, slots, ids, keys)
    relabel = getattr(rb._sampler, "relabel", None)  # e.g. HerSampler: hindsight goals
    if relabel is not None:
        flat = relabel(rb._storage, rb._ring, slots, ids, keys, info, flat, rb._nstep, rb._generator)
    return slots, ids, keys, info, flat


def sample_slots(rb: BufferParts, slots: torch.Tensor, fields: Sequence[Any] | None = None) -> TensorDict:
    """The live items in ``slots`` as :func:`sample` gives them (n-step entries included),
    for a front-end that picks the slots itself (SB3's ``_get_samples``). The caller holds
    the lock and has checked that every slot holds a live item."""
    require_items(rb, "sample_slots")
    keys = read_keys(rb, fields)
    ids = rb._ring.ids_of_slots(slots)
    flat = None if rb._nstep is None else rb._nstep.gather(rb._storage, rb._ring, slots, ids, keys)
    return gather(rb, slots, ids, keys, None, flat)


def sample_by_index(rb: BufferParts, indices: Any, fields: Sequence[Any] | None) -> TensorDict:
    """The items at logical positions ``indices`` (the caller holds the lock)."""
    require_items(rb, "sample_by_index")
    slots, ids = rb._ring.slots_of_positions(indices)
    return gather(rb, slots, ids, read_keys(rb, fields))


def sample_all(rb: BufferParts, fields: Sequence[Any] | None) -> TensorDict:
    """Every stored item, oldest first (the caller holds the lock: size and read are one step)."""
    require_items(rb, "sample_all")
    slots, ids = rb._ring.slots_of_positions(torch.arange(rb._ring.size))
    return gather(rb, slots, ids, read_keys(rb, fields))


def epochs(
    rb: BufferParts,
    batch_size: int,
    n_epochs: int,
    shuffle: bool,
    drop_last: bool,
    fields: Sequence[Any] | None,
) -> Iterator[TensorDict]:
    """:meth:`ReplayBuffer.epochs <xpbank.ReplayBuffer.epochs>` (the caller holds the lock).

    Bad arguments raise here, at the call. The plan and the "buffer changed" marker are
    taken here, in the caller's one locked step, so a write between this call and the
    first ``next`` stops the iteration; each minibatch (its shuffle included) is then
    made under the buffer's lock.
    """
    plan = epoch_plan(rb._ring.size, batch_size, n_epochs, shuffle, drop_last, rb._generator)
    require_items(rb, "epochs")
    return _run_plan(rb, plan, read_keys(rb, fields), _marker(rb))


def _marker(rb: BufferParts) -> tuple[int, int, int]:
    """What changes with every write or clear (a Table's ring also counts its inserts:
    a write into a full table may keep ``next_id`` and ``size``)."""
    ring = rb._ring
    return ring.next_id, ring.size, getattr(ring, "inserted", 0)


def _run_plan(
    rb: BufferParts, plan: Iterator[torch.Tensor], keys: list[NestedKey] | None, marker: tuple[int, int, int]
) -> Iterator[TensorDict]:
    """Read ``plan``'s positions batch by batch; raise if the buffer was written since ``marker``."""
    while True:
        with rb._lock:
            positions = next(plan, None)  # a new epoch's shuffle draws from the buffer's generator
            if positions is None:
                return
            if _marker(rb) != marker:
                raise BufferChangedError("epochs: the buffer was extended or cleared during iteration")
            slots, ids = rb._ring.slots_of_positions(positions)
            batch = gather(rb, slots, ids, keys)
        yield batch
