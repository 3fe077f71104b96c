"""What a buffer's :class:`~xpbank.Table` admits now, for the backends that move items
between processes: how many rows a shared-memory pull may insert without a writer
waiting (:func:`room_now`), how many draws a sample can take without waiting
(:func:`draws_now`), and the id liveness a Ray shard checks (:func:`live_ids`).

Plain buffers (no table) admit any number of inserts (the ring overwrites) and any
number of draws once an item is stored.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank.distributed.limiter import insert_room, sample_room

__all__ = ["ANY", "draws_now", "live_ids", "room_now", "table_of"]

ANY = 1 << 40  # "any number of draws" (with replacement, no max_times_sampled)


def table_of(rb: Any) -> Any:
    """``rb``'s :class:`~xpbank.Table`, or ``None`` (a plain sampler)."""
    sampler = rb._sampler
    return sampler if hasattr(sampler, "sample_options") and hasattr(sampler, "bind_buffer") else None


def room_now(rb: Any) -> int | None:
    """Items the table's rate limiter admits as one insert now (``None``: any number;
    the caller holds ``rb.lock``)."""
    table = table_of(rb)
    limiter = None if table is None else table.limiter
    return None if limiter is None else insert_room(limiter)


def draws_now(rb: Any, replace: bool = True) -> int:
    """Draws one sample may take now without waiting (the caller holds ``rb.lock``):
    the items' draws left under ``max_times_sampled`` (distinct items with
    ``replace=False``), within what the rate limiter admits."""
    table, size = table_of(rb), rb._ring.size
    if table is None or not replace:
        k = size if not replace else (ANY if size else 0)
    elif table.max_times_sampled is not None:
        k = table.budget - table.stuck
    else:
        k = ANY if size else 0
    limiter = None if table is None else table.limiter
    if limiter is not None:
        k = min(k, sample_room(limiter))
    return max(0, int(k))


def live_ids(ring: Any, ids: np.ndarray) -> np.ndarray:
    """A mask of the issued ``ids`` (ring ids, int64) whose items are stored now: the
    FIFO ring's range, or a table ring's per-slot check (slots reused out of order)."""
    issued = (ids >= 0) & (ids < ring.next_id)
    stale = getattr(ring, "_stale", None)
    if stale is None:
        return issued & (ids >= ring.first_id)
    out = np.zeros(ids.shape[0], dtype=bool)
    out[issued] = ~stale(ids[issued])
    return out
