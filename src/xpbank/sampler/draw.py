"""Sets of slots that change at write time and are drawn from at sample time.

Two structures, both O(1) or O(log capacity) per change and per draw, vectorized over
NumPy arrays of slots (no Python loop over items):

- :class:`SlotSet`: a set of slots kept as a dense array plus each slot's position in
  it; adding appends, removing moves the last members into the holes. A uniform draw
  is one random position: O(1), whatever the capacity.
- :class:`SumTree`: one non-negative weight per slot in a binary tree of partial sums;
  a draw descends from the root, level by level for the whole batch: O(log capacity).
  Weights of 0 are never drawn.
"""

from __future__ import annotations

import numpy as np

__all__ = ["SlotSet", "SumTree"]


class SlotSet:
    """A set of slots in ``[0, capacity)`` with O(1) add, remove and uniform draw.

    Example:
        >>> import numpy as np
        >>> s = SlotSet(8)
        >>> s.add(np.array([1, 5, 6]))
        >>> s.remove(np.array([5, 2]))
        >>> sorted(s.members().tolist()), len(s)
        ([1, 6], 2)
    """

    def __init__(self, capacity: int):
        self.items = np.empty(capacity, dtype=np.int64)
        self.where = np.full(capacity, -1, dtype=np.int64)
        self.n = 0

    def __len__(self) -> int:
        return self.n

    def members(self) -> np.ndarray:
        return self.items[: self.n]

    def add(self, slots: np.ndarray) -> None:
        """Add distinct ``slots`` (those already members are skipped)."""
        slots = slots[self.where[slots] < 0]
        k = slots.shape[0]
        self.items[self.n : self.n + k] = slots
        self.where[slots] = np.arange(self.n, self.n + k)
        self.n += k

    def remove(self, slots: np.ndarray) -> None:
        """Remove distinct ``slots`` (non-members are skipped)."""
        slots = slots[self.where[slots] >= 0]
        k = slots.shape[0]
        if k == 0:
            return
        new_n = self.n - k
        pos = self.where[slots]
        self.where[slots] = -1
        holes = pos[pos < new_n]
        tail = self.items[new_n : self.n]
        movers = tail[self.where[tail] >= 0]  # tail members that stay
        self.items[holes] = movers
        self.where[movers] = holes
        self.n = new_n

    def clear(self) -> None:
        self.where[self.items[: self.n]] = -1
        self.n = 0


class SumTree:
    """Per-slot non-negative weights; draws slots with probability weight / total.

    Example:
        >>> import numpy as np
        >>> t = SumTree(4)
        >>> t.set(np.array([0, 3]), np.array([1.0, 3.0]))
        >>> t.total, t.find(np.array([0.5, 1.5, 3.9])).tolist()
        (4.0, [0, 3, 3])
    """

    def __init__(self, capacity: int):
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[slots + self.leaves]

    def set(self, slots: np.ndarray, weights: np.ndarray) -> None:
        """Set the weights of distinct ``slots`` and refresh their ancestors."""
        if slots.shape[0] == 0:
            return
        pos = slots + self.leaves
        self.tree[pos] = weights
        while self.leaves > 1:  # a repeated parent is recomputed to the same sum
            pos = pos // 2
            self.tree[pos] = self.tree[2 * pos] + self.tree[2 * pos + 1]
            if pos[0] == 1:
                break

    def find(self, mass: np.ndarray) -> np.ndarray:
        """The slot where each cumulative ``mass`` (in ``[0, total)``) falls."""
        i = np.ones(mass.shape[0], dtype=np.int64)
        u = mass.astype(np.float64, copy=True)
        while i.shape[0] and i[0] < self.leaves:
            left = self.tree[2 * i]
            # rounding can leave u >= left with an empty right subtree: stay left then
            right = (u >= left) & (self.tree[2 * i + 1] > 0)
            u = np.where(right, u - left, u)
            i = 2 * i + right
        return i - self.leaves

    def clear(self) -> None:
        self.tree[:] = 0.0
