"""The storage of :mod:`xpbank.table.heap`'s tournament trees: the arrays, their layout
(:func:`IndexedHeap`), and the keys' int64 order (:func:`order_bits`). The compiled
kernels that read and change them are in :mod:`~xpbank.table.heap`."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from xpbank.table.slots import TableRing

__all__ = ["B", "EMPTY", "MASK", "NONE", "RUNNER", "SHIFT", "USED", "IndexedHeap", "order_bits"]

B = 16  # children per node: 16 int64 keys are two cache lines
SHIFT = 4  # log2(B)
EMPTY = np.iinfo(np.int64).max  # the key and seq of a slot not in the tree
MASK = np.int64(0x7FFF_FFFF_FFFF_FFFF)  # all bits but the sign
USED = -2  # a leaf group's runner-up slot once its winner was taken (stale until recomputed)
NONE = np.empty(0, dtype=np.int64)  # no ids to read, no times to count
RUNNER = 4  # int64s per leaf group's runner-up entry (key, seq, slot, unused): 2 to a line


def order_bits(keys: Any) -> np.ndarray:
    """Finite float keys as int64s in the same order (``-0.0`` as ``0.0``): the float's
    bits, those of a negative one with all but the sign flipped; equal floats, equal ints.

    Example:
        >>> order_bits(np.array([-2.0, -0.0, 0.0, 1e-300, 3.0])).argsort(kind="stable").tolist()
        [0, 1, 2, 3, 4]
    """
    bits = (np.asarray(keys, dtype=np.float64) + 0.0).view(np.int64)  # + 0.0: -0.0 becomes 0.0
    return bits ^ ((bits >> 63) & MASK)


def _aligned(n: int) -> np.ndarray:
    """``n`` int64 entries starting on a 128-byte boundary (a group of 16 in two lines)."""
    raw = np.empty(n + B, dtype=np.int64)
    skip = (-raw.ctypes.data % 128) // 8
    return raw[skip : skip + n]


def _offsets(capacity: int) -> np.ndarray:
    """Where each level of nodes starts in the node arrays, bottom up, plus the end; every
    level is padded to whole groups of 16 (empty nodes), the top one a single node."""
    off, size, at = [0], capacity, 0
    while True:
        size = -(-size // B)
        at += -(-size // B) * B
        off.append(at)
        if size == 1:
            return np.array(off, dtype=np.int64)


class IndexedHeap:
    """The priority queue a :class:`~xpbank.table.Table` keeps with numba: same calls as
    :class:`~xpbank.table.orders.LazyHeap`, plus :meth:`remove` (eager). ``t`` holds the
    arrays the kernels share: each slot's key and seq (``lk``, ``lq``), each node's
    winner (``nk``, ``nq``, ``ns``; levels from the leaf groups up, starting at ``off``),
    each leaf group's runner-up (``rk``, ``rq``, ``rs``: strided views of one
    ``[groups, RUNNER]`` array, so that a group's three share a cache line), and the taken items (each
    slot's index among them or -1, written only where a call needs it; their slots, keys
    and seqs). ``n``: items in the tree, items taken, whether their indices are unwritten."""

    def __init__(self, capacity: int, kernels: SimpleNamespace):
        self.k = kernels
        off = _offsets(capacity)
        groups = -(-capacity // B)
        arrays = [_aligned(size) for size in (groups * B,) * 2 + (int(off[-1]),) * 3]
        runners = _aligned(int(off[1]) * RUNNER).reshape(-1, RUNNER)  # one line, not three, per pop
        arrays += [runners[:, 0], runners[:, 1], runners[:, 2]]
        taken = [np.empty(capacity, dtype=np.int64) for _ in range(4)]
        self.t = (*arrays, off, *taken)
        self.n = np.zeros(3, dtype=np.int64)
        self.out = np.zeros(capacity, dtype=np.int64)
        self.runners = runners  # the block rk, rq, rs view
        self.ctx = np.zeros(21, dtype=np.int64)  # context(): the arrays' addresses and lengths
        self.ring_arrays: tuple[np.ndarray, np.ndarray] | None = None
        self.clear()

    def clear(self) -> None:
        for a in self.t[:8]:
            a[:] = EMPTY
        for a in (self.t[4], self.t[7], self.t[9]):  # no winner, no runner-up, none taken
            a[:] = -1
        self.n[:] = 0

    def push(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        self.k.push(self.t, self.n, slots, np.ascontiguousarray(keys, dtype=np.float64), ring.seq[slots])

    def rekey(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        self.k.rekey(self.t, self.n, slots, np.ascontiguousarray(keys, dtype=np.float64))

    def remove(self, ring: TableRing, slots: np.ndarray) -> None:
        self.k.remove(self.t, self.n, slots)

    def rebuild(self, ring: TableRing, keys: np.ndarray) -> None:
        live = np.flatnonzero(ring.live)
        self.clear()
        self.t[0][live], self.t[1][live] = order_bits(keys[live]), ring.seq[live]
        self.n[0] = live.shape[0]
        self.k.build(self.t)

    def best(self, ring: TableRing, k: int) -> np.ndarray:
        m = self.k.first(self.t, self.n, k, self.out, NONE, NONE, NONE)
        return self.out[:m].copy()

    def __getstate__(self) -> dict[str, Any]:
        """Pickling leaves the context out (its addresses are this object's)."""
        state = self.__dict__.copy()
        state["ring_arrays"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        """The runner-ups' views unpickle as three arrays: back into one block (and a
        heap pickled before ``n`` had three entries gets its third)."""
        self.__dict__.update(state)
        if self.n.shape[0] < 3:
            self.n = np.append(self.n, 0)
        runners = _aligned(self.runners.size).reshape(-1, RUNNER)
        t = list(self.t)
        for i in range(3):
            runners[:, i] = t[5 + i]
        t[5:8] = runners[:, 0], runners[:, 1], runners[:, 2]
        self.t, self.runners = tuple(t), runners

    def context(self, ring: TableRing) -> np.ndarray | None:
        """The addresses and lengths of the arrays :meth:`take` reads and writes (the
        tree's, never replaced, and ``ring``'s ids and draw counts, refreshed when the
        ring's arrays change): what the compiled ``first_at`` reads them from; ``None``
        where the ring's are not C-contiguous int64 (then ``first`` takes the arrays)."""
        ids, times = ring.ids, ring.times
        if self.ring_arrays is None or self.ring_arrays[0] is not ids or self.ring_arrays[1] is not times:
            for a in (ids, times):
                if a.dtype != np.int64 or not a.flags.c_contiguous or a.shape[0] != ids.shape[0]:
                    return None
            lk, lq, nk, nq, ns, _, _, _, off, *kept = self.t
            arrays = (lk, lq, nk, nq, ns, self.runners, off, *kept, self.n, self.out)
            lengths = (lk.shape[0], nk.shape[0], self.runners.shape[0], off.shape[0], kept[0].shape[0])
            self.ctx[:] = [
                *(a.ctypes.data for a in arrays),
                *lengths,
                ids.ctypes.data,
                times.ctypes.data,
                ids.shape[0],
            ]
            self.ring_arrays = (ids, times)
        return self.ctx

    def take(self, ring: TableRing, k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`best`, and the items' ids (``ring.ids``), each counted as sampled once
        (``ring.times``), in the same compiled call: ``(slots, ids)``."""
        ids = np.empty(k, dtype=np.int64)
        ctx = self.context(ring)
        if ctx is None:
            m = self.k.first(self.t, self.n, k, self.out, ring.ids, ring.times, ids)
        else:
            m = self.k.first_at(ctx, k, ids)
        return self.out[:m].copy(), ids[:m]

    def below(self, ring: TableRing, bound: float) -> np.ndarray:
        m = self.k.below(self.t, self.n, order_bits(np.array([bound]))[0], self.out)
        return self.out[:m].copy()
