"""A :class:`~xpbank.table.Table`'s small calls on its compiled heaps (numba): a
priority update, and the first items of a heap selector.

``rb.update_priority(ids, p)`` on a heap table was a chain of small NumPy steps (the
values' checks, the ids' never-issued and liveness checks, the repeated-slot check, the
priority write, the restamp, the heaps' keys), ~50 µs of glue around a ~9 µs heap
kernel for 256 ids. :func:`update_ids` does the checks and the writes in one compiled
pass (:func:`live_table`), with the keys the heaps' taken items keep (after a sample of
a heap's first items, all of them: no heap call), else then the heaps' rekey, the way
:func:`xpbank.sampler.prioritized_fast.update_ids` does for the prioritized sampler.

It takes the usual call only: CPU int64 ids, all live and distinct, float32/float64
priorities, finite, ``>= 0``, one per id, at least one, and a table without a sum-tree
(the prioritized selector and remover keep their own path). Anything else returns
``False`` with nothing written, and the general path (:func:`~xpbank.sampler.priorities.check_update`, then
:func:`~xpbank.table.ops.set_priorities`) takes the call and raises what it raises. Both
paths leave the same arrays: the same priorities (float64), stamps and heap keys.

:func:`take_first` is a heap selector's ``sample(B, replace=False)`` without the general
path's steps around the heap: the first ``B`` items, each counted once, and their ids,
as :func:`~xpbank.table.ops.sample` takes them (no rate limiter, no draw limit: nothing
to wait for or remove); anything else returns ``None`` with nothing taken The ids and the
draw counts come from the heap's own compiled call (:meth:`IndexedHeap.take
<xpbank.table.heap_store.IndexedHeap.take>`).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank._jit.prefetch import prefetch
from xpbank.sampler.priorities import host_arrays
from xpbank.table.heap_store import MASK, NONE

__all__ = ["live_table", "take_first", "update_ids"]

AHEAD = 8  # the check prefetches the lines of the id this far ahead


def live_table(
    ids: Any,
    values: Any,
    ring_ids: Any,
    live: Any,
    next_id: Any,
    priority: Any,
    stamp: Any,
    stamps: Any,
    slots: Any,
    keys: Any,
    old: Any,
    taken: Any,
    kept: Any,
    lists: Any,
    counts: Any,
) -> Any:
    """Check a priority update and write it: every id issued (``< next_id``) and live
    (its slot's id), every value finite and ``>= 0``, no slot twice; then each slot's
    priority (into ``keys`` too) and stamp (``stamps + j``), and for each heap's taken
    items (``taken``: a min-heap's then a max-heap's, each slot's index among them or
    -1; empty: no such heap) the key they keep (``kept``, :func:`~xpbank.table.heap_store.order_bits`
    of the priority, a max-heap's of minus it; ``lists``, ``counts``: each heap's taken
    slots in order and its ``n`` (how many are taken, and whether their ``taken``
    entries are unwritten: then written here before the first is read), so that an
    update of the sample just taken, in its order, reads no ``taken`` entry). Returns
    how many (slot, heap) pairs were not taken (their heap rekeys them), or -1: nothing
    written (``old``: the stamps, kept to put back on a repeat)."""
    n = ids.shape[0]
    capacity = live.shape[0]
    lines = (ring_ids.ctypes.data, live.ctypes.data, stamp.ctypes.data, priority.ctypes.data)
    for j in range(n):
        if j + AHEAD < n:  # the slot's lines a few ids ahead, so that their misses overlap
            s = ids[j + AHEAD] % capacity
            prefetch(lines[0] + s * 8)
            prefetch(lines[1] + s)
            prefetch(lines[2] + s * 8)
            prefetch(lines[3] + s * 8)
        i = ids[j]
        v = np.float64(values[j])
        if i < 0 or i >= next_id or not (v >= 0.0 and v < np.inf):
            return -1
        s = i % capacity
        if not live[s] or ring_ids[s] != i:
            return -1
        slots[j] = s
        keys[j] = v
    for j in range(n):  # issued stamps are below ``stamps``: one at or above it is this call's
        s = slots[j]
        if stamp[s] >= stamps:  # a repeated slot: the stamps written so far put back
            for r in range(j - 1, -1, -1):
                stamp[slots[r]] = old[r]
            return -1
        old[j] = stamp[s]
        stamp[s] = stamps + j
    for j in range(n):
        priority[slots[j]] = keys[j]
    rest = 0
    for h in range(2):
        if taken[h].shape[0] > 0:
            bits = ((keys if h == 0 else -keys) + 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0
            bits ^= (bits >> 63) & MASK
            c = counts[h]  # the heap's n: items in the tree, taken, whether their indices are unwritten
            for j in range(n):  # the usual update: the ids of the sample just taken, in its order
                i = j
                if j >= c[1] or lists[h][j] != slots[j]:
                    if c[2]:  # a pop leaves the taken items' indices unwritten (heap._index)
                        for r in range(c[1]):
                            if lists[h][r] >= 0:
                                taken[h][lists[h][r]] = r
                        c[2] = 0
                    i = taken[h][slots[j]]
                if i >= 0:
                    kept[h][i] = bits[j]
                rest += i < 0
    return rest


def live_at(ctx: Any, ids: Any, values: Any, next_id: Any, stamps: Any) -> Any:
    """:func:`live_table` on the arrays whose addresses and lengths ``ctx`` holds
    (:func:`_context`: the ring's, the heaps' taken indices and kept keys, the work
    rows): three arrays for numba to unbox, not 13 (~1 µs a call less)."""
    c, m = ctx[0], ids.shape[0]
    ring_ids, live = _carray(_int64s(ctx[4]), c), _carray(_uint8s(ctx[5]), c)
    priority, stamp = _carray(_float64s(ctx[6]), c), _carray(_int64s(ctx[7]), c)
    taken = (_carray(_int64s(ctx[8]), ctx[1]), _carray(_int64s(ctx[9]), ctx[2]))
    kept = (_carray(_int64s(ctx[10]), ctx[1]), _carray(_int64s(ctx[11]), ctx[2]))
    slots, keys, old = (
        _carray(_int64s(ctx[12]), m),
        _carray(_float64s(ctx[13]), m),
        _carray(_int64s(ctx[14]), m),
    )
    lists = (_carray(_int64s(ctx[15]), ctx[1]), _carray(_int64s(ctx[16]), ctx[2]))
    counts = (_carray(_int64s(ctx[17]), 3), _carray(_int64s(ctx[18]), 3))
    return live_table(
        ids,
        values,
        ring_ids,
        live,
        next_id,
        priority,
        stamp,
        stamps,
        slots,
        keys,
        old,
        taken,
        kept,
        lists,
        counts,
    )


# the memory at an address as a pointer to int64, uint8, float64; numba.carray (set by _kernel)
_int64s: Any = _jit.compiled_only
_uint8s: Any = _jit.compiled_only
_float64s: Any = _jit.compiled_only
_carray: Any = _jit.compiled_only
_KERNEL: list[Any] = []


def _kernel() -> Any:
    """The compiled :func:`live_at` (compiled on first use), or ``None`` without numba."""
    global _int64s, _uint8s, _float64s, _carray
    if not _KERNEL:
        ptrs, fns = _jit.pointers("int64", "uint8", "float64"), None
        if ptrs is not None:
            from numba import carray  # type: ignore[import-untyped, unused-ignore]

            (_int64s, _uint8s, _float64s), _carray = ptrs, carray  # live_at's globals
            fns = _jit.compile_kernels(live_at, helpers=(live_table,))
        _KERNEL.append(None if fns is None else fns[0])
    return _KERNEL[0]


_NO_COUNT = np.zeros(3, dtype=np.int64)  # no heap: none taken
_CONTEXTS: weakref.WeakKeyDictionary[Any, tuple[tuple[Any, ...], np.ndarray, np.ndarray]] = (
    weakref.WeakKeyDictionary()
)


def _context(t: Any, n: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Table ``t``'s context for :func:`live_at` and its ``[3, rows]`` work rows (slots,
    keys as float64, old stamps; ``rows >= n``), rebuilt where an array it names was
    replaced or the rows are short; ``None`` where the ring's arrays are not what it
    reads. Kept per table object (weakly): a pickled copy builds its own."""
    ring = t.ring
    got = _CONTEXTS.get(t)
    if got is not None:
        a = got[0]
        if (
            a[0] is ring.ids and a[1] is ring.live and a[2] is ring.priority and a[3] is ring.stamp
            and a[4] is t.min_heap and a[5] is t.max_heap and got[1][3] >= n
        ):  # fmt: skip
            return got[1], got[2]
    heaps = (t.min_heap, t.max_heap)
    arrays = (ring.ids, ring.live, ring.priority, ring.stamp, *heaps)  # a heap's arrays are never replaced
    for a, dtype in zip(arrays[:4], (np.int64, np.bool_, np.float64, np.int64), strict=True):
        if a.dtype != dtype or not a.flags.c_contiguous or a.shape[0] != ring.capacity:
            return None
    rows = max(n, 256)
    work = np.empty((3, rows), dtype=np.int64)
    taken = [NONE if h is None else h.t[9] for h in heaps]
    kept = [NONE if h is None else h.t[11] for h in heaps]
    lists = [NONE if h is None else h.t[10] for h in heaps]
    counts = [_NO_COUNT if h is None else h.n for h in heaps]
    at = [a.ctypes.data for a in (*arrays[:4], *taken, *kept, *work, *lists, *counts)]
    ctx = np.array([ring.capacity, taken[0].shape[0], taken[1].shape[0], rows, *at], dtype=np.int64)
    _CONTEXTS[t] = (arrays, ctx, work)
    return ctx, work


def update_ids(t: Any, indices: Any, priorities: Any, stale: str) -> bool:
    """``rb.update_priority(indices, priorities, stale)`` on table ``t`` for the usual
    call (see the module docstring). Returns whether it wrote them; ``False``: the
    general path takes the call."""
    ring = t.ring
    if t.tree is not None or t._heap_kernels is None or stale not in ("raise", "skip") or ring is None:
        return False
    arrays = host_arrays(indices, priorities)
    if arrays is None or arrays[0].shape[0] == 0:
        return False
    kernel = _kernel()
    ids, values = arrays
    n = ids.shape[0]
    context = None if kernel is None else _context(t, n)
    if context is None:
        return False
    ctx, work = context
    rest = kernel(ctx, ids, values, ring.next_id, ring.stamps)
    if rest < 0:
        return False
    ring.stamps += n
    if rest:  # some are in a heap's tree (not taken): the heap rekeys them
        slots, keys = work[0, :n], work[1, :n].view(np.float64)
        if t.min_heap is not None:
            t.min_heap.rekey(ring, slots, keys)
        if t.max_heap is not None:
            t.max_heap.rekey(ring, slots, -keys)
    return True


def take_first(t: Any, batch_size: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``sample(batch_size, replace=False)`` on table ``t`` as :func:`ops.sample
    <xpbank.table.ops.sample>` takes it, where that is the first ``batch_size`` items of
    a compiled heap selector without a rate limiter or ``max_times_sampled``: ``(slots,
    ids)``, each item counted as drawn once; else ``None`` with nothing taken (the
    general path samples, or raises)."""
    ring = t.ring
    if (
        ring is None
        or t._heap_kernels is None
        or t.limiter is not None
        or t.max_times_sampled is not None
        or type(batch_size) is not int
        or not 0 < batch_size <= ring.size
    ):
        return None
    kind = t.selector
    if kind == "max_heap":
        got = t.max_heap.take(ring, batch_size)
    elif kind == "min_heap":
        got = t.min_heap.take(ring, batch_size)
    else:
        return None
    t.notify()
    return got
