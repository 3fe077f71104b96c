"""The write path of a :class:`~xpbank.ReplayBuffer`: checking a batch against the spec
(:func:`conform`), storing items at the ring's cursor (:func:`add`, :func:`extend`,
:func:`write`) and rewriting stored items in place (:func:`update`, :func:`keep_last`,
and their priorities: :func:`update_priority`).

Each function takes the buffer (its :class:`~xpbank.replay.parts.BufferParts`); the
buffer's public methods call them holding its lock.

Every input is checked before the first byte is written. A batch whose signature (type,
keys, dtypes, shapes, devices) is the last good batch's goes through
:mod:`xpbank.replay.fast_write`, which stores it without the checks that depend on the
signature alone and hands anything else back to the full path here. :func:`update` of a reward
tells ``NStep.rewritten``, which drops the window results that read it. A buffer that
keeps an :class:`~xpbank.EpisodeIndex` plans each write with it (checked, computed)
before storing and applies the plan after the ring advances; a storage that declares
``needs_episodes`` is handed the ring once (``attach(ring)``) and sees each whole batch
with the plan before the first write (``prepare_write(flat, n, plan)``); both hooks are
found with ``hasattr``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import EmptyBufferError, PriorityError, SpecError
from xpbank.replay.fast_write import remember, try_write
from xpbank.replay.parts import RESERVED_KEYS, BufferParts, check_item_dims, check_reserved
from xpbank.ring.episode_update import check_episode_update
from xpbank.ring.episodes import EpisodeIndex, wants_episodes
from xpbank.sampler.priorities import check_update
from xpbank.sampler.prioritized import PrioritizedSampler
from xpbank.sampler.prioritized_fast import update_ids
from xpbank.spec.batch import flatten
from xpbank.spec.spec import NestedKey, Spec

__all__ = ["add", "conform", "extend", "keep_last", "update", "update_priority", "write"]


def add(rb: BufferParts, item: Any) -> int:
    """Store one item (no batch dim); returns its id."""
    first = try_write(rb, item, True)  # shaped like the last good item: no full checks needed
    if first is not None:
        return first
    flat = flatten(check_item_dims(item, 0), rb.spec)
    spec = rb.spec if rb.spec is not None else check_reserved(Spec.from_batch(flat, batch_ndim=0))
    _, flat = conform(rb, spec, flat, 0)
    first = int(write(rb, {k: v.unsqueeze(0) for k, v in flat.items()}, 1, spec)[0])
    remember(rb, item, 0)
    return first


def extend(rb: BufferParts, batch: Any) -> range:
    """Store a batch of items, all checked before any is written; returns their ids."""
    first = try_write(rb, batch, False)
    if first is not None:
        return range(first, rb._ring.next_id)
    flat = flatten(check_item_dims(batch, 1), rb.spec)
    spec = rb.spec if rb.spec is not None else check_reserved(Spec.from_batch(flat, batch_ndim=1))
    (n,), flat = conform(rb, spec, flat, 1)
    ids = write(rb, flat, n, spec)
    if n:
        remember(rb, batch, n)
    return ids


def conform(
    rb: BufferParts, spec: Spec, flat: dict[NestedKey, torch.Tensor], batch_ndim: int, partial: bool = False
) -> tuple[tuple[int, ...], dict[NestedKey, torch.Tensor]]:
    """Validate ``flat`` against ``spec`` (converting safe dtypes when the buffer casts)."""
    if rb._cast:
        return spec.conform(flat, batch_ndim, partial)
    return spec.validate(flat, batch_ndim, partial), flat


def write(rb: BufferParts, flat: dict[NestedKey, torch.Tensor], n: int, spec: Spec) -> range:
    """Write ``n`` checked rows at the ring's cursor (laying out a lazy storage first).

    A buffer whose sampler placed it (``rb._place``, set once by a :class:`~xpbank.Table`'s
    ``bind``) hands the rows to that hook instead: it picks the slots (evicting by its
    remover, waiting on its rate limiter) and returns the ids (a ``range`` when they count
    up by one, else a 1-D int64 tensor).
    """
    place = rb.__dict__.get("_place")
    if place is not None:
        return place(rb, flat, n, spec)
    ring, storage = rb._ring, rb._storage
    if storage.spec is None and wants_episodes(spec, rb._episode_keys, None, False):
        ring.episodes = EpisodeIndex(ring, rb._num_envs, rb._episode_keys)
    plan = ring.episodes.plan(flat, n, spec) if ring.episodes is not None else None
    if storage.spec is None:
        storage.initialize(spec)
    if plan is not None and hasattr(storage, "prepare_write"):
        storage.prepare_write(flat, n, plan)  # checks the whole batch first
    first = ring.next_id
    for slots, rows in ring.segments(n):
        part = flat if rows.stop - rows.start == n else {k: v[rows] for k, v in flat.items()}
        storage.write(slots, part)
        rb._sampler.on_write(slots, ring)
    ring.advance(n)
    if plan is not None:
        ring.episodes.apply(plan)  # type: ignore[union-attr]
    return range(first, first + n)


def update(rb: BufferParts, indices: Any, batch: Any) -> None:
    """:meth:`ReplayBuffer.update <xpbank.ReplayBuffer.update>`'s work (the caller holds the lock)."""
    if rb.spec is None:
        raise EmptyBufferError("update: the buffer is empty (nothing has been written yet)")
    slots = rb._ring.slots_of_ids(indices)
    flat = {k: v for k, v in flatten(batch, rb.spec).items() if k not in RESERVED_KEYS}
    if rb._nstep is not None and "nstep_return" in flat and "nstep_return" not in rb.spec:
        raise SpecError(
            "update: got an n-step sample (it has 'nstep_return'); its next fields are its "
            "windows' last items', so writing it back would move them onto the items: pass "
            "only the fields to rewrite, e.g. {'reward': ...}"
        )
    lead, flat = conform(rb, rb.spec, flat, 1, partial=True)
    if lead and lead[0] != slots.shape[0]:
        raise SpecError(f"update: got {slots.shape[0]} indices but {lead[0]} rows of values")
    if slots.shape[0] and torch.unique(slots).numel() != slots.shape[0]:
        slots, flat = keep_last(slots, flat)
    # an indexed item's env and episode-end flags are read once, at write time: never moved
    check_episode_update(rb._ring, rb.spec, slots, flat)
    rb._storage.write(slots, flat)
    if rb._nstep is not None:  # n-step results kept for these items' windows
        rb._nstep.rewritten(rb.spec, rb._ring, slots, flat.keys())


def keep_last(
    slots: torch.Tensor, flat: dict[NestedKey, torch.Tensor]
) -> tuple[torch.Tensor, dict[NestedKey, torch.Tensor]]:
    """Drop earlier rows of repeated slots, so the last row for a slot wins."""
    s = slots.numpy()
    _, first_in_reversed = np.unique(s[::-1], return_index=True)
    keep = torch.from_numpy(np.sort(len(s) - 1 - first_in_reversed))
    return slots[keep], {k: v.index_select(0, keep.to(v.device)) for k, v in flat.items()}


def update_priority(rb: BufferParts, indices: Any, priorities: Any, stale: str) -> None:
    """:meth:`ReplayBuffer.update_priority <xpbank.ReplayBuffer.update_priority>`'s work
    (the caller holds the lock): the prioritized sampler's compiled small-call update
    where it takes the call (:func:`~xpbank.sampler.prioritized_fast.update_ids`; a
    table's: :func:`~xpbank.table.fast.update_ids`), else
    every input checked (:func:`~xpbank.sampler.priorities.check_update`), then the
    sampler's ``update_priority``."""
    sampler = rb._sampler
    if type(sampler) is PrioritizedSampler and update_ids(sampler, rb._ring, indices, priorities, stale):
        return
    table_update = rb.__dict__.get("_update_ids")  # a Table's compiled update: xpbank.table.fast
    if table_update is not None and table_update(indices, priorities, stale):
        return
    update = getattr(sampler, "update_priority", None)
    if update is None:
        raise PriorityError(
            f"update_priority: {sampler!r} keeps no priorities; build the buffer "
            "with sampler=PrioritizedSampler()"
        )
    update(*check_update(rb._ring, indices, priorities, stale))
