"""Reverb's tables without TensorFlow: selectors, removers, ``max_times_sampled``, rate
limiters, queues and stacks, policy versions and staleness.

A :class:`Table` is a *component*, not a buffer: give it to any
:class:`~xpbank.ReplayBuffer` (or a subclass: ``ShmReplayBuffer``, a Ray shard, which
rebuild it from ``table.config()`` through the sampler registry, name ``"table"``)::

    rb = ReplayBuffer(capacity, sampler=Table("uniform", "fifo", max_times_sampled=4))
    rb = ReplayBuffer(capacity, sampler=Table.queue())      # FIFO, consume once, blocking
    rb = ReplayBuffer(capacity, sampler=Table.stack())      # LIFO, consume once, blocking

API note (for the backends built on it):

- ``Table.bind_buffer(rb)`` (called once from ``ReplayBuffer.__init__`` through
  :func:`xpbank.replay.parts.bind_sampler`) checks the buffer (no n-step, no episode
  index, no ``FrameStorage``), replaces ``rb._ring`` with a
  :class:`~xpbank.table.slots.TableRing` (ids and free slots) and sets ``rb._place``,
  the hook :func:`xpbank.replay.writing.write` hands every checked batch to
  (:func:`xpbank.table.ops.write`: waits on the limiter, evicts by the remover, picks the
  slots, writes the storage). The write fast path (:mod:`xpbank.replay.fast_write`)
  stores a batch shaped like the last one straight into a contiguous run of free slots
  where the table offers one (:mod:`xpbank.table.runs`: slots in the ring's order, no
  wait, no eviction, no ``version_key``), else hands it to ``ops.write``. The read side
  of the same idea: a consume-once FIFO table hands out its oldest items as one run of
  slots (``runs.take_run``, compiled in :mod:`xpbank.table.run_kernels`; one copy of the
  records through ``fast_read.read_run``) where the full path would take the same items.
- ``rb.sample(B, replace, fields, timeout=, max_staleness=, current_version=)``: the
  buffer passes the options (``Table.sample_options``) to ``Table.sample``, which waits
  on the limiter (a ``threading.Condition`` on ``rb.lock``, rebuilt when the buffer
  replaces its lock), removes stale items, draws, counts the draws and removes the items
  used up, all in the caller's one locked step. Every wait ends by ``timeout`` with
  :class:`~xpbank.RateLimitTimeout`, having changed nothing.
- ``table.notify()`` wakes waiters (call it holding ``rb.lock`` after anything that adds
  room or items from outside the buffer's own calls, e.g. rows pulled from shared memory).
  A backend whose items arrive without a call on the buffer sets ``table.poll_interval``
  (seconds) and ``table.on_wait`` (called holding ``rb.lock`` at every wake-up, e.g. to
  pull published rows); a ``Condition`` re-acquires the lock without the
  ``PullingLock``'s pull. ``timeout=0`` fails at once instead of waiting (a client that
  must not block an actor can poll).
- State: ``rb.state_dict()`` holds the ring (``next_id``, ``size``), the storage rows
  ``[0, ring.rows)`` and ``table.state_dict()`` (the slots' arrays, the uniform packing,
  counters, the limiter's counts); ``xpbank.save`` / ``load`` keep all of it.
- Ids: ``slot = id % capacity``; the item written into slot ``s`` gets the previous id
  at ``s`` plus ``capacity`` (a plain ring's ids under FIFO use); an id is live iff its
  slot is live and holds it. ``extend`` returns a ``range`` when the ids count up by
  one, else a 1-D int64 tensor.

Semantics (Reverb's, stated and tested):

- a batch of ``B`` is ``B`` successive single samples: an item is never returned more
  often than ``max_times_sampled`` allows, also within one batch; the FIFO selector
  without a limit returns the oldest item ``B`` times, as Reverb's does;
- an item leaves after its ``max_times_sampled``-th sample, when the remover picks it
  (a write to a full table, without a limiter that makes writers wait), or when it is
  staler than ``max_staleness``;
- a write that finds too little room removes, by the remover, from the items stored
  before the call (a batch is placed as a whole, not item by item);
- a consume-once queue hands each item to exactly one sample, across threads.

Modules: :mod:`~xpbank.table.table` (the class, presets, binding),
:mod:`~xpbank.table.options` (names, limiter configs), :mod:`~xpbank.table.ops` (write
and sample paths, waits), :mod:`~xpbank.table.select` (batch semantics),
:mod:`~xpbank.table.orders` (FIFO/LIFO log, heapq's lazy heaps, dense uniform set),
:mod:`~xpbank.table.heap` (16-ary tournament trees compiled with numba),
:mod:`~xpbank.table.slots` (ids, free slots), :mod:`~xpbank.table.runs` (the write
fast path's runs of slots), :mod:`~xpbank.table.state`.

Costs (one process, ``OMP_NUM_THREADS=1``): at 1M items a heap selector's sample of
256 plus a priority update of 256 runs in compiled loops (a 16-ary tournament tree: the
first ``k`` items are taken out one by one, each path replayed, and set aside until the
next read of the order, so the update of those ``k`` replays each path once, and
consuming them, ``max_times_sampled=1``, only drops them). A table whose free
slots are in the ring's order (a FIFO queue drained oldest first, a FIFO-removal ring)
places writes as contiguous runs (slices, no lookups), and a batch shaped like the last
one takes the write fast path (:mod:`~xpbank.table.runs`); anything else goes through
the full checks and :func:`~xpbank.table.ops.write`.
"""

from __future__ import annotations

from xpbank.table.table import REMOVERS, SELECTORS, Table

__all__ = ["REMOVERS", "SELECTORS", "Table"]
