"""The write fast path's side of a :class:`~xpbank.table.Table`
(:mod:`xpbank.replay.fast_write`): a batch shaped like the last good one is stored
straight into a contiguous run of free slots, then entered as :func:`ops.write
<xpbank.table.ops.write>` would enter it.

The table offers a run (:func:`run_start`) only where the full path would put the rows
in the same slots with nothing else to do first: the free slots are in the ring's order
(``TableRing.in_order``) and do not wrap, no item must leave to make room, the rate
limiter admits the rows now (no wait), no ``version_key`` value is to be read, and the
new ids count up by one to the newest. A FIFO queue (:meth:`Table.queue
<xpbank.Table.queue>`) that is drained oldest first stays in that case. Anything else
returns ``None`` and the full path takes the batch, so every wait, eviction and error is
the full path's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank.table import ops

# ``t`` is the Table (typed Any: xpbank.table.table imports this module)
Table = Any

__all__ = ["run_start", "run_written"]


def run_start(t: Table, rows: int) -> int | None:
    """Where the write fast path may store ``rows`` rows as one contiguous run now, or
    ``None`` (then the full path, :func:`ops.write <xpbank.table.ops.write>`, takes the
    batch). A run is offered only when the full path would place the rows there with no
    wait, no eviction and no value read (no ``version_key``), and their ids count up by
    one to the newest id."""
    ring = t.ring
    if ring is None or t.version_key is not None or not ring.in_order:
        return None
    head = ring.free_head
    if rows > ring.free_count or head + rows > ring.capacity:
        return None
    lim = t.limiter
    if lim is not None and not lim.can_insert(rows):
        return None
    ids = ring.ids  # the last ids written at the slots: the new ones are these + capacity
    last = int(ids[head + rows - 1]) + ring.capacity
    if last + 1 < ring.next_id or (
        rows > 1
        and (
            int(ids[head + rows - 1]) - int(ids[head]) != rows - 1
            or not bool((np.diff(ids[head : head + rows]) == 1).all())
        )
    ):
        return None
    return head


def run_written(t: Table, rows: int) -> int:
    """Enter the ``rows`` rows the fast path stored at :func:`run_start`'s slot (the
    caller holds the lock since); returns the first id (the others follow by one)."""
    ring = t.ring
    assert ring is not None
    if t.limiter is not None:
        t.limiter.inserts += rows
    head = ring.free_head
    run = slice(head, head + rows)
    slots = ring.take_free(rows)
    ids = ring.insert(slots, run)
    ops.entered(t, slots, int(t.writer_version), run)
    t.notify()
    return int(ids[0])
