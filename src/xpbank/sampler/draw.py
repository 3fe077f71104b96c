"""A set of slots that changes at write time and is drawn from uniformly at sample time.

:class:`SlotSet` keeps the members as a dense array plus each slot's position in it;
adding appends, removing moves the last members into the holes, vectorized over NumPy
arrays of slots (no Python loop over items). A uniform draw is one random position:
O(1), whatever the capacity. (Weighted draws use :mod:`xpbank.sampler.sumtree`.)
"""

from __future__ import annotations

import numpy as np

__all__ = ["SlotSet"]


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
