"""The fast paths' side of a :class:`~xpbank.table.Table`: runs of contiguous slots.

Writes (:mod:`xpbank.replay.fast_write`): a batch shaped like the last good one is
stored straight into a contiguous run of free slots, then entered as :func:`ops.write
<xpbank.table.ops.write>` would enter it.

The table offers a run (:func:`run_start`) only where the full path would put the rows
in the same slots with nothing else to do first: the free slots are in the ring's order
(``TableRing.in_order``) and do not wrap, no item must leave to make room, the rate
limiter admits the rows now (no wait), no ``version_key`` value is to be read, and the
new ids count up by one to the newest. A FIFO queue (:meth:`Table.queue
<xpbank.Table.queue>`) that is drained oldest first stays in that case. Anything else
returns ``None`` and the full path takes the batch, so every wait, eviction and error is
the full path's.

Samples (:func:`take_run`, read by :mod:`xpbank.replay.fast_read`): a consume-once FIFO
table (a queue) whose oldest ``B`` items sit in ``B`` contiguous slots hands them out
as one run: the checks are two slice compares, the removal is slice writes (the free
queue in the ring's order stays so), and the read is one copy of the run's records.
Taken only where :func:`ops.sample <xpbank.table.ops.sample>` would take the same items
with no wait and no error, and where no other order (heap, uniform set, versions,
sum-tree) must hear of the removal; anything else returns ``None`` and the full path
samples. The full path leaves the items it took at the head of the insertion log (the
log skips them lazily); a run first skips them, so runs resume after any full sample.
Where the insertion log is the table's only order, a run's arrays are written and
checked in one compiled loop each with numba (:mod:`xpbank.table.run_kernels`; the
NumPy slices without it). With the write fast path's runs this halves a shared-memory queue reader's CPU time
per 1 KB row (``benchmarks/bench_tables.py --part a --base main``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank.table import ops, run_kernels

# ``t`` is the Table (typed Any: xpbank.table.table imports this module)
Table = Any

__all__ = ["run_start", "run_written", "take_run"]


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
    if ring.fifo_ids and head == ring.next_id % ring.capacity:
        return head  # the FIFO ring's ids: the new ones are next_id, next_id + 1, ...
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
    log, kernels = t.log, run_kernels.load()
    if kernels is not None and _log_only(t):
        if log.tail + rows > log.slots.shape[0]:
            log.compact(ring)  # as its append would
        ring.take_free(rows)
        kernels.enter_run(
            ring.ids, ring.live, ring.seq, ring.stamp, ring.times, ring.priority, ring.version,
            log.slots, log.seqs, head, rows, ring.capacity, ring.inserted, ring.stamps,
            float(t.default_priority), int(t.writer_version), log.tail,
        )  # fmt: skip
        first = ring.count_run(head, rows)
        log.tail += rows
        if t.max_times_sampled is not None:  # as ops.entered (no sum-tree: nothing stuck)
            t.budget += rows * t.max_times_sampled
    else:
        slots = ring.take_free(rows)
        first = ring.insert_run(head, rows)
        ops.entered(t, slots, int(t.writer_version), slice(head, head + rows))
    t.notify()
    return first


def _log_only(t: Table) -> bool:
    """Whether the insertion log is the table's only order (no heap, uniform set,
    versions or sum-tree must hear of an insert or a removal)."""
    return (
        t.log is not None
        and t.min_heap is None
        and t.max_heap is None
        and t.versions is None
        and t.dense is None
        and t.tree is None
    )


def take_run(t: Table, b: Any, replace: bool) -> tuple[int, np.ndarray] | None:
    """Take a sample of ``b`` as :func:`ops.sample <xpbank.table.ops.sample>` would take
    it now (no options but a ``timeout``, which only a wait reads), where that is the
    oldest ``b`` items of a consume-once FIFO table in contiguous slots: ``(first slot,
    their ids)``, the items consumed and removed; else ``None`` with nothing changed
    (the full path samples)."""
    ring, log = t.ring, t.log
    if (
        ring is None
        or t.selector != "fifo"
        or t.max_times_sampled != 1
        or type(b) is not int
        or b <= 0
        or not _log_only(t)
    ):
        return None
    lim = t.limiter
    if ring.size < b or t.budget - t.stuck < b or (lim is not None and not lim.can_sample(b)):
        return None  # the full path waits or raises
    head = log.head
    if log.tail - head < b:
        return None
    start = int(log.slots[head])
    if not (ring.live[start] and ring.seq[start] == log.seqs[head]):  # items the full path took
        log.oldest(ring, 1)  # skips the tombstones (the full path's first step too)
        head = log.head
        if log.tail - head < b:
            return None
        start = int(log.slots[head])
    stop = start + b
    # entries [head, head + b) are the oldest b live items iff slot start + i holds the
    # item of entry head + i (an item's seq is its own and it never moves): then the
    # entries before head are tombstones and these are in insertion order
    if stop > ring.capacity:
        return None
    kernels = run_kernels.load()
    if kernels is not None:  # the checks, then the items marked sampled and freed
        ids = np.empty(b, dtype=np.int64)
        if not kernels.take_run(ring.ids, ring.live, ring.seq, ring.times, log.seqs, start, b, head, ids):
            return None
    else:
        if not (ring.live[start:stop].all() and (ring.seq[start:stop] == log.seqs[head : head + b]).all()):
            return None
        ring.times[start:stop] = 1  # as ops._consume: each drawn once, used up
        ids = ring.ids[start:stop].copy()
    if lim is not None:
        lim.samples += b
    t.budget -= b
    ring.release_run(start, stop)  # as ops.remove(t, slots, used_up=True)
    if lim is not None:
        lim.deletes += b
    log.head = head + b  # now tombstones
    t.notify()
    return start, ids
