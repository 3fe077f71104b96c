"""An indexed 4-ary min-heap of slots by ``(key, seq)``, in compiled loops (numba).

With numba (the ``fast`` extra) a :class:`~xpbank.table.Table`'s heaps (min- and
max-heap selectors and removers, the versions' index) are this: the heap array, each
slot's position in it, and each slot's key, so a priority update moves the item in
place (O(log N), no stale entries left behind) and a removal takes it out. Keys sit
beside the slots in the heap's own arrays, and 4 children per node halve the depth: at
1M items a sift reads about 10 cache lines instead of 60 (a binary heap reading each
slot's key elsewhere). A whole
batch (256 updates, ``k`` first items) is one compiled call. Ties are broken by the
ring's ``seq`` (insertion order), so the order is total: the same items come first
as from :class:`~xpbank.table.orders.LazyHeap` (``heapq``, the path without numba,
and the reference the tests compare this one with).

The kernels below are plain Python over NumPy arrays (``n`` is a one-element array: the
heap's size, changed in place); :func:`load` compiles them once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank.table.slots import TableRing

__all__ = ["IndexedHeap", "load"]


D = 4  # children per node: a 4-ary heap is half as deep, and a node's children share a cache line


def _less(i: Any, j: Any, hk: Any, hs: Any) -> Any:
    """Whether the entry at position ``i`` comes before the one at ``j``: ``(key, seq)``."""
    return hk[i] < hk[j] or (hk[i] == hk[j] and hs[i] < hs[j])


def _move(heap: Any, pos: Any, hk: Any, hs: Any, src: Any, dst: Any) -> None:
    heap[dst], hk[dst], hs[dst] = heap[src], hk[src], hs[src]
    pos[heap[dst]] = dst


def _up(heap: Any, pos: Any, hk: Any, hs: Any, i: Any) -> None:
    s, k, q = heap[i], hk[i], hs[i]
    while i > 0:
        parent = (i - 1) // D
        if not (k < hk[parent] or (k == hk[parent] and q < hs[parent])):
            break
        _move(heap, pos, hk, hs, parent, i)
        i = parent
    heap[i], hk[i], hs[i] = s, k, q
    pos[s] = i


def _down(heap: Any, pos: Any, hk: Any, hs: Any, i: Any, n: Any) -> None:
    s, k, q = heap[i], hk[i], hs[i]
    while True:
        child = D * i + 1
        if child >= n:
            break
        best = child
        for c in range(child + 1, min(child + D, n)):
            if _less(c, best, hk, hs):
                best = c
        if not (hk[best] < k or (hk[best] == k and hs[best] < q)):
            break
        _move(heap, pos, hk, hs, best, i)
        i = best
    heap[i], hk[i], hs[i] = s, k, q
    pos[s] = i


def push(heap: Any, pos: Any, hk: Any, hs: Any, n: Any, slots: Any, keys: Any, seqs: Any) -> None:
    """Enter ``slots`` (not in the heap) under ``keys``, ties by ``seqs``."""
    for j in range(slots.shape[0]):
        i = n[0]
        heap[i], hk[i], hs[i] = slots[j], keys[j], seqs[j]
        pos[slots[j]] = i
        n[0] += 1
        _up(heap, pos, hk, hs, i)


def rekey(heap: Any, pos: Any, hk: Any, hs: Any, n: Any, slots: Any, keys: Any) -> None:
    """Give ``slots`` (in the heap) new ``keys``, in order (a repeated slot keeps its last)."""
    for j in range(slots.shape[0]):
        s = slots[j]
        hk[pos[s]] = keys[j]
        _up(heap, pos, hk, hs, pos[s])
        _down(heap, pos, hk, hs, pos[s], n[0])


def remove(heap: Any, pos: Any, hk: Any, hs: Any, n: Any, slots: Any) -> None:
    """Take ``slots`` out of the heap (those not in it are skipped)."""
    for j in range(slots.shape[0]):
        s = slots[j]
        i = pos[s]
        if i < 0:
            continue
        pos[s] = -1
        n[0] -= 1
        last = n[0]
        if i == last:
            continue
        _move(heap, pos, hk, hs, last, i)
        moved = heap[i]
        _up(heap, pos, hk, hs, i)
        _down(heap, pos, hk, hs, pos[moved], n[0])


def _cand_up(cand: Any, hk: Any, hs: Any, i: Any) -> None:
    while i > 0:
        parent = (i - 1) // 2
        if not _less(cand[i], cand[parent], hk, hs):
            break
        cand[i], cand[parent] = cand[parent], cand[i]
        i = parent


def _cand_down(cand: Any, hk: Any, hs: Any, c: Any) -> None:
    i = 0
    while True:
        child = 2 * i + 1
        if child >= c:
            break
        if child + 1 < c and _less(cand[child + 1], cand[child], hk, hs):
            child += 1
        if not _less(cand[child], cand[i], hk, hs):
            break
        cand[i], cand[child] = cand[child], cand[i]
        i = child


def first(heap: Any, hk: Any, hs: Any, n: Any, k: Any, out: Any, cand: Any) -> Any:
    """The ``k`` first slots in order into ``out`` (fewer if the heap holds fewer), the
    heap untouched: a best-first walk from the root with a small binary heap of
    candidate positions (``cand``, room for ``(D - 1) * k + 1``), so only the nodes
    near the top are read. Returns how many."""
    m = min(k, n[0])
    if m == 0:
        return 0
    cand[0] = 0
    c = 1
    for j in range(m):
        top = cand[0]
        out[j] = heap[top]
        c -= 1
        if c > 0:
            cand[0] = cand[c]
            _cand_down(cand, hk, hs, c)
        for child in range(D * top + 1, min(D * top + D + 1, n[0])):
            cand[c] = child
            c += 1
            _cand_up(cand, hk, hs, c - 1)
    return m


def below(heap: Any, pos: Any, hk: Any, hs: Any, n: Any, bound: Any, out: Any) -> Any:
    """Pop every slot with a key below ``bound`` into ``out``; returns how many."""
    m = 0
    while n[0] > 0 and hk[0] < bound:
        out[m] = heap[0]
        pos[heap[0]] = -1
        m += 1
        n[0] -= 1
        if n[0] > 0:
            _move(heap, pos, hk, hs, n[0], 0)
            _down(heap, pos, hk, hs, 0, n[0])
    return m


def heapify(heap: Any, pos: Any, hk: Any, hs: Any, n: Any) -> None:
    """Order ``heap[:n]`` (with its keys) bottom-up, O(N)."""
    for i in range(n[0]):
        pos[heap[i]] = i
    for i in range((n[0] - 2) // D, -1, -1):
        _down(heap, pos, hk, hs, i, n[0])


_KERNELS: SimpleNamespace | None = None
_LOADED = False


def load() -> SimpleNamespace | None:
    """The compiled kernels (compiled on first use), or ``None`` without numba."""
    global _KERNELS, _LOADED
    if not _LOADED:
        fns = _jit.compile_kernels(
            push,
            rekey,
            remove,
            first,
            below,
            heapify,
            helpers=(_less, _move, _up, _down, _cand_up, _cand_down),
        )
        names = ("push", "rekey", "remove", "first", "below", "heapify")
        _KERNELS = None if fns is None else SimpleNamespace(**dict(zip(names, fns, strict=True)))
        _LOADED = True
    return _KERNELS


class IndexedHeap:
    """The heap a :class:`~xpbank.table.Table` keeps with numba: same calls as
    :class:`~xpbank.table.orders.LazyHeap`, plus :meth:`remove` (eager). Each position
    holds its slot, key and seq side by side (``heap``, ``hk``, ``hs``); ``pos`` maps a
    slot to its position (-1: not in the heap)."""

    def __init__(self, capacity: int, kernels: SimpleNamespace):
        self.k = kernels
        self.heap = np.zeros(capacity, dtype=np.int64)
        self.hk = np.zeros(capacity, dtype=np.float64)
        self.hs = np.zeros(capacity, dtype=np.int64)
        self.pos = np.full(capacity, -1, dtype=np.int64)
        self.n = np.zeros(1, dtype=np.int64)
        self.out = np.zeros(capacity, dtype=np.int64)
        self.cand = np.zeros((D - 1) * capacity + 1, dtype=np.int64)

    def clear(self) -> None:
        self.pos[:] = -1
        self.n[0] = 0

    def push(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        k = keys.astype(np.float64)
        self.k.push(self.heap, self.pos, self.hk, self.hs, self.n, slots, k, ring.seq[slots])

    def rekey(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        self.k.rekey(self.heap, self.pos, self.hk, self.hs, self.n, slots, keys.astype(np.float64))

    def remove(self, ring: TableRing, slots: np.ndarray) -> None:
        self.k.remove(self.heap, self.pos, self.hk, self.hs, self.n, slots)

    def rebuild(self, ring: TableRing, keys: np.ndarray) -> None:
        live = np.flatnonzero(ring.live)
        self.clear()
        m = live.shape[0]
        self.heap[:m], self.hk[:m], self.hs[:m] = live, keys[live], ring.seq[live]
        self.n[0] = m
        self.k.heapify(self.heap, self.pos, self.hk, self.hs, self.n)

    def best(self, ring: TableRing, k: int) -> np.ndarray:
        m = self.k.first(self.heap, self.hk, self.hs, self.n, k, self.out, self.cand)
        return self.out[:m].copy()

    def below(self, ring: TableRing, bound: float) -> np.ndarray:
        m = self.k.below(self.heap, self.pos, self.hk, self.hs, self.n, float(bound), self.out)
        return self.out[:m].copy()
