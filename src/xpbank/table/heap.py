"""An indexed binary min-heap of slots by ``(key, seq)``, in compiled loops (numba).

With numba (the ``fast`` extra) a :class:`~xpbank.table.Table`'s heaps (min- and
max-heap selectors and removers, the versions' index) are this: the heap array, each
slot's position in it, and each slot's key, so a priority update moves the item in
place (O(log N), no stale entries left behind) and a removal takes it out. A whole
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


def _less(a: Any, b: Any, key: Any, seq: Any) -> Any:
    return key[a] < key[b] or (key[a] == key[b] and seq[a] < seq[b])


def _up(heap: Any, pos: Any, key: Any, seq: Any, i: Any) -> None:
    s = heap[i]
    while i > 0:
        parent = (i - 1) // 2
        p = heap[parent]
        if not _less(s, p, key, seq):
            break
        heap[i] = p
        pos[p] = i
        i = parent
    heap[i] = s
    pos[s] = i


def _down(heap: Any, pos: Any, key: Any, seq: Any, i: Any, n: Any) -> None:
    s = heap[i]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        if child + 1 < n and _less(heap[child + 1], heap[child], key, seq):
            child += 1
        c = heap[child]
        if not _less(c, s, key, seq):
            break
        heap[i] = c
        pos[c] = i
        i = child
    heap[i] = s
    pos[s] = i


def push(heap: Any, pos: Any, key: Any, seq: Any, n: Any, slots: Any, keys: Any) -> None:
    """Enter ``slots`` (not in the heap) under ``keys``."""
    for j in range(slots.shape[0]):
        s = slots[j]
        key[s] = keys[j]
        heap[n[0]] = s
        pos[s] = n[0]
        n[0] += 1
        _up(heap, pos, key, seq, n[0] - 1)


def rekey(heap: Any, pos: Any, key: Any, seq: Any, n: Any, slots: Any, keys: Any) -> None:
    """Give ``slots`` (in the heap) new ``keys``, in order (a repeated slot keeps its last)."""
    for j in range(slots.shape[0]):
        s = slots[j]
        key[s] = keys[j]
        _up(heap, pos, key, seq, pos[s])
        _down(heap, pos, key, seq, pos[s], n[0])


def remove(heap: Any, pos: Any, key: Any, seq: Any, n: Any, slots: Any) -> None:
    """Take ``slots`` out of the heap (those not in it are skipped)."""
    for j in range(slots.shape[0]):
        s = slots[j]
        i = pos[s]
        if i < 0:
            continue
        pos[s] = -1
        n[0] -= 1
        if i == n[0]:
            continue
        last = heap[n[0]]
        heap[i] = last
        pos[last] = i
        _up(heap, pos, key, seq, i)
        _down(heap, pos, key, seq, pos[last], n[0])


def _cand_up(cand: Any, heap: Any, key: Any, seq: Any, i: Any) -> None:
    while i > 0:
        parent = (i - 1) // 2
        if not _less(heap[cand[i]], heap[cand[parent]], key, seq):
            break
        cand[i], cand[parent] = cand[parent], cand[i]
        i = parent


def _cand_down(cand: Any, heap: Any, key: Any, seq: Any, c: Any) -> None:
    i = 0
    while True:
        child = 2 * i + 1
        if child >= c:
            break
        if child + 1 < c and _less(heap[cand[child + 1]], heap[cand[child]], key, seq):
            child += 1
        if not _less(heap[cand[child]], heap[cand[i]], key, seq):
            break
        cand[i], cand[child] = cand[child], cand[i]
        i = child


def first(heap: Any, pos: Any, key: Any, seq: Any, n: Any, k: Any, out: Any, cand: Any) -> Any:
    """The ``k`` first slots in order into ``out`` (fewer if the heap holds fewer), the
    heap untouched: a best-first walk from the root with a small heap of candidate
    positions (``cand``, room for ``k + 1``), so only about ``2k`` nodes near the top are
    read. Returns how many."""
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
            _cand_down(cand, heap, key, seq, c)
        for child in (2 * top + 1, 2 * top + 2):
            if child < n[0]:
                cand[c] = child
                c += 1
                _cand_up(cand, heap, key, seq, c - 1)
    return m


def below(heap: Any, pos: Any, key: Any, seq: Any, n: Any, bound: Any, out: Any) -> Any:
    """Pop every slot with a key below ``bound`` into ``out``; returns how many."""
    m = 0
    while n[0] > 0 and key[heap[0]] < bound:
        s = heap[0]
        out[m] = s
        m += 1
        pos[s] = -1
        n[0] -= 1
        if n[0] > 0:
            heap[0] = heap[n[0]]
            pos[heap[0]] = 0
            _down(heap, pos, key, seq, 0, n[0])
    return m


def heapify(heap: Any, pos: Any, key: Any, seq: Any, n: Any) -> None:
    """Order ``heap[:n]`` (positions set) bottom-up, O(N)."""
    for i in range(n[0]):
        pos[heap[i]] = i
    for i in range(n[0] // 2 - 1, -1, -1):
        _down(heap, pos, key, seq, i, n[0])


_KERNELS: SimpleNamespace | None = None
_LOADED = False


def load() -> SimpleNamespace | None:
    """The compiled kernels (compiled on first use), or ``None`` without numba."""
    global _KERNELS, _LOADED
    if not _LOADED:
        fns = _jit.compile_kernels(
            push, rekey, remove, first, below, heapify, helpers=(_less, _up, _down, _cand_up, _cand_down)
        )
        names = ("push", "rekey", "remove", "first", "below", "heapify")
        _KERNELS = None if fns is None else SimpleNamespace(**dict(zip(names, fns, strict=True)))
        _LOADED = True
    return _KERNELS


class IndexedHeap:
    """The heap a :class:`~xpbank.table.Table` keeps with numba: same calls as
    :class:`~xpbank.table.orders.LazyHeap`, plus :meth:`remove` (eager)."""

    def __init__(self, capacity: int, kernels: SimpleNamespace):
        self.k = kernels
        self.heap = np.zeros(capacity, dtype=np.int64)
        self.pos = np.full(capacity, -1, dtype=np.int64)
        self.key = np.zeros(capacity, dtype=np.float64)
        self.n = np.zeros(1, dtype=np.int64)
        self.out = np.zeros(capacity, dtype=np.int64)
        self.cand = np.zeros(capacity + 1, dtype=np.int64)

    def clear(self) -> None:
        self.pos[:] = -1
        self.n[0] = 0

    def push(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        self.k.push(self.heap, self.pos, self.key, ring.seq, self.n, slots, keys.astype(np.float64))

    def rekey(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        self.k.rekey(self.heap, self.pos, self.key, ring.seq, self.n, slots, keys.astype(np.float64))

    def remove(self, ring: TableRing, slots: np.ndarray) -> None:
        self.k.remove(self.heap, self.pos, self.key, ring.seq, self.n, slots)

    def rebuild(self, ring: TableRing, keys: np.ndarray) -> None:
        live = np.flatnonzero(ring.live)
        self.clear()
        self.heap[: live.shape[0]] = live
        self.key[live] = keys[live]
        self.n[0] = live.shape[0]
        self.k.heapify(self.heap, self.pos, self.key, ring.seq, self.n)

    def best(self, ring: TableRing, k: int) -> np.ndarray:
        m = self.k.first(self.heap, self.pos, self.key, ring.seq, self.n, k, self.out, self.cand)
        return self.out[:m].copy()

    def below(self, ring: TableRing, bound: float) -> np.ndarray:
        m = self.k.below(self.heap, self.pos, self.key, ring.seq, self.n, float(bound), self.out)
        return self.out[:m].copy()
