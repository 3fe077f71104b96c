"""The orders a :class:`~xpbank.table.Table` selects and removes by, over its
:class:`~xpbank.table.slots.TableRing`'s slots.

- :class:`InsertionLog` (FIFO and LIFO): the slots in insertion order, as a deque of
  ``(slot, seq)`` entries in a NumPy array. A removed item's entry stays behind as a
  tombstone (its slot is no longer live, or holds a later item: another ``seq``), and is
  skipped, vectorized, when the oldest or newest ``k`` are asked for; the deque is
  compacted (its live entries moved to the front, in order) when it reaches twice the
  capacity, so each entry is moved O(1) times.
- :class:`LazyHeap` (min- and max-heap by priority, and the versions' min-heap): a
  ``heapq`` of ``(key, seq, check, slot)`` tuples, ties broken by insertion order
  (``seq``). A priority update pushes a new entry; an entry whose slot no longer holds
  the same item (``check``: the item's ``seq``, or its priority ``stamp``) is dropped
  when it reaches the top. O(log N) per push and pop (heapq's C code, one call per item);
  rebuilt (``heapify``, O(N)) when stale entries make it twice the capacity.
- :class:`Dense` (uniform): the live slots packed in ``[0, count)`` with each slot's
  position, so a uniform draw is one ``randint``; removal swaps the last entries into
  the holes (vectorized).

Each is rebuilt from the ring's arrays after a state is loaded: the state holds no
order of its own except :class:`Dense`'s packing, which a uniform draw depends on.
"""

from __future__ import annotations

import heapq
from typing import Any

import numpy as np

from xpbank.table.slots import TableRing

__all__ = ["Dense", "InsertionLog", "LazyHeap"]


class InsertionLog:
    """Live slots in insertion order; oldest and newest first in O(k) amortized."""

    def __init__(self, capacity: int):
        self.slots = np.zeros(2 * capacity + 2, dtype=np.int64)
        self.seqs = np.zeros(2 * capacity + 2, dtype=np.int64)
        self.head = self.tail = 0

    def clear(self) -> None:
        self.head = self.tail = 0

    def _valid(self, ring: TableRing, lo: int, hi: int) -> np.ndarray:
        s = self.slots[lo:hi]
        return ring.live[s] & (ring.seq[s] == self.seqs[lo:hi])

    def append(self, ring: TableRing, slots: np.ndarray) -> None:
        """Record newly inserted ``slots`` (in their insertion order)."""
        n = slots.shape[0]
        if self.tail + n > self.slots.shape[0]:
            self.compact(ring)
        self.slots[self.tail : self.tail + n] = slots
        self.seqs[self.tail : self.tail + n] = ring.seq[slots]
        self.tail += n

    def compact(self, ring: TableRing) -> None:
        """Keep only the live entries, in order, at the front: every live item's entry is
        in ``[head, tail)`` (those before ``head`` are tombstones), so no sort is needed
        (:meth:`rebuild` sorts every live slot by ``seq``: ~10x the time at 64k items)."""
        keep = np.flatnonzero(self._valid(ring, self.head, self.tail)) + self.head
        k = keep.shape[0]
        self.slots[:k] = self.slots[keep]
        self.seqs[:k] = self.seqs[keep]
        self.head, self.tail = 0, k

    def rebuild(self, ring: TableRing, exclude: np.ndarray | None = None) -> None:
        """Keep only the live entries (``exclude``: slots about to be appended)."""
        live = ring.live_slots()
        if exclude is not None and exclude.size:
            live = live[~np.isin(live, exclude)]
        self.head, self.tail = 0, live.shape[0]
        self.slots[: self.tail] = live
        self.seqs[: self.tail] = ring.seq[live]

    def oldest(self, ring: TableRing, k: int) -> np.ndarray:
        """The ``k`` oldest live slots (fewer if fewer are live), oldest first."""
        span = max(2 * k, 64)
        while True:
            hi = min(self.tail, self.head + span)
            found = np.flatnonzero(self._valid(ring, self.head, hi))
            if found.shape[0] >= k or hi == self.tail:
                out = self.slots[self.head + found[:k]]
                self.head = self.head + int(found[0]) if found.size else hi  # drop leading tombstones
                return out
            span *= 2

    def newest(self, ring: TableRing, k: int) -> np.ndarray:
        """The ``k`` newest live slots (fewer if fewer are live), newest first."""
        span = max(2 * k, 64)
        while True:
            lo = max(self.head, self.tail - span)
            found = np.flatnonzero(self._valid(ring, lo, self.tail))[::-1]
            if found.shape[0] >= k or lo == self.head:
                out = self.slots[lo + found[:k]]
                self.tail = lo + int(found[0]) + 1 if found.size else lo  # drop trailing tombstones
                return out
            span *= 2


class LazyHeap:
    """A min-heap of live slots by ``(key, seq)`` with lazy deletion (see the module docstring).

    Args:
        capacity: the ring's.
        check: ``"seq"`` (entries lapse when the item leaves) or ``"stamp"`` (also when
            its key changes: a priority).
    """

    def __init__(self, capacity: int, check: str):
        self.capacity, self.check = capacity, check
        self.heap: list[tuple[Any, ...]] = []

    def clear(self) -> None:
        self.heap = []

    def push(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        """Enter ``slots`` (live) under ``keys``."""
        if len(self.heap) + slots.shape[0] > 2 * self.capacity + 64:
            self.rebuild(ring, None)  # the new entries follow
        checks = getattr(ring, self.check)[slots]
        for entry in zip(
            keys.tolist(), ring.seq[slots].tolist(), checks.tolist(), slots.tolist(), strict=True
        ):
            heapq.heappush(self.heap, entry)

    def rekey(self, ring: TableRing, slots: np.ndarray, keys: np.ndarray) -> None:
        """New keys for live ``slots`` (restamped): new entries; the old ones lapse."""
        self.push(ring, slots, keys)

    def remove(self, ring: TableRing, slots: np.ndarray) -> None:
        """Nothing to do: the entries of items that left lapse."""

    def rebuild(self, ring: TableRing, keys: np.ndarray | None) -> None:
        """Keep the valid entries (``keys``: per slot, to rebuild from the arrays instead)."""
        if keys is not None:
            live = np.flatnonzero(ring.live)
            checks = getattr(ring, self.check)[live]
            self.heap = list(
                zip(keys[live].tolist(), ring.seq[live].tolist(), checks.tolist(), live.tolist(), strict=True)
            )
        else:
            self.heap = [e for e in self.heap if self._valid(ring, e)]
        heapq.heapify(self.heap)

    def _valid(self, ring: TableRing, entry: tuple[Any, ...]) -> bool:
        slot = entry[3]
        return bool(ring.live[slot]) and int(getattr(ring, self.check)[slot]) == entry[2]

    def _pop(self, ring: TableRing) -> tuple[Any, ...] | None:
        """The top valid entry, popped (``None``: empty); drops stale ones on the way."""
        heap = self.heap
        while heap:
            entry = heapq.heappop(heap)
            if self._valid(ring, entry):
                return entry
        return None

    def best(self, ring: TableRing, k: int) -> np.ndarray:
        """The ``k`` first live slots by ``(key, seq)`` (fewer if fewer are live); the heap is unchanged."""
        taken: list[tuple[Any, ...]] = []
        while len(taken) < k:
            entry = self._pop(ring)
            if entry is None:
                break
            taken.append(entry)
        for entry in taken:
            heapq.heappush(self.heap, entry)
        return np.array([e[3] for e in taken], dtype=np.int64)

    def below(self, ring: TableRing, bound: float) -> np.ndarray:
        """The live slots with a key below ``bound``, left in the heap (for removal)."""
        taken: list[int] = []
        while self.heap:
            entry = self._pop(ring)
            if entry is None:
                break
            if entry[0] >= bound:
                heapq.heappush(self.heap, entry)
                break
            taken.append(entry[3])
        return np.array(taken, dtype=np.int64)


class Dense:
    """The live slots packed in ``slots[:count]`` (a uniform draw is one index)."""

    def __init__(self, capacity: int):
        self.slots = np.zeros(capacity, dtype=np.int64)
        self.where = np.zeros(capacity, dtype=np.int64)
        self.count = 0

    def clear(self) -> None:
        self.count = 0

    def add(self, slots: np.ndarray) -> None:
        n, c = slots.shape[0], self.count
        self.slots[c : c + n] = slots
        self.where[slots] = np.arange(c, c + n)
        self.count = c + n

    def remove(self, slots: np.ndarray) -> None:
        """Remove distinct live ``slots``: the last entries not removed fill the holes."""
        m = self.count - slots.shape[0]
        pos = self.where[slots]
        tail = self.slots[m : self.count]
        movers = tail[~np.isin(tail, slots)]
        holes = np.sort(pos[pos < m])
        self.slots[holes] = movers
        self.where[movers] = holes
        self.count = m

    def state(self) -> np.ndarray:
        return self.slots[: self.count].copy()

    def load(self, packed: np.ndarray) -> None:
        self.count = 0
        self.add(packed.astype(np.int64))
