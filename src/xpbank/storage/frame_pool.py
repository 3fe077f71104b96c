"""A small side store keyed by slot: at most one tensor per slot, for a few slots.

:class:`~xpbank.storage.frames.FrameStorage` keeps most frames once, in a ring; a few
items need more: the true final observation of an episode, the next observation of each
env's newest item (its successor is not written yet), the whole stack of an item whose
older frames were overwritten. Those go here: ``index[slot]`` is the entry of a slot
(``-1``: none), entries are reused through a free list, and the store doubles when full.
Entries are copied with NumPy (a vector step puts a handful of frames per call: torch's
``index_copy_`` of 8 Atari frames costs ~7x NumPy's fancy assignment). The free list is
a stack (``free[:nfree]``, the next entry taken from its top) in an array as long as the
store, so the compiled step write (:mod:`~xpbank.storage.frame_step`) can take and give
back entries in place.

Example:
    >>> import numpy as np, torch
    >>> pool = SlotPool(10, (2,), torch.uint8)
    >>> pool.put(np.array([3, 7]), torch.tensor([[1, 2], [3, 4]], dtype=torch.uint8))
    >>> pool.get(np.array([7])).tolist(), len(pool)
    ([[3, 4]], 2)
    >>> pool.drop(np.array([3, 5]))
    >>> len(pool), pool.has(np.array([3, 7])).tolist()
    (1, [False, True])
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from xpbank.storage.dtypes import as_torch, to_numpy

__all__ = ["WORDS", "SlotPool"]

WORDS = {8: np.uint64, 4: np.uint32, 2: np.uint16, 1: np.uint8}  # unsigned words by width in bytes


class SlotPool:
    """One ``shape``/``dtype`` tensor for any slot of ``[0, capacity)`` that has one."""

    def __init__(self, capacity: int, shape: tuple[int, ...], dtype: torch.dtype):
        self.shape, self.dtype = shape, dtype
        self.index = np.full(capacity, -1, dtype=np.int64)
        self.data = torch.empty((0, *shape), dtype=dtype)
        self._np = to_numpy(self.data)  # a view of data
        self.free = np.zeros(0, dtype=np.int64)  # free entries: free[:nfree], taken from the top
        self.nfree = 0
        self._words: dict[int, np.ndarray | None] = {}  # views of _np as words, by width

    def __len__(self) -> int:
        return int(self.data.shape[0] - self.nfree)

    def has(self, slots: np.ndarray) -> np.ndarray:
        return self.index[slots] >= 0

    def words(self, width: int) -> np.ndarray | None:
        """The entries as ``[entries, words]`` unsigned words of ``width`` bytes (``None``:
        their start is not aligned to it); kept until the store grows."""
        if width not in self._words:
            a, view = self._np, None
            row = math.prod(a.shape[1:])
            if row * a.itemsize % width == 0 and a.flags.c_contiguous:
                view = a.reshape(a.shape[0], row).view(WORDS[width])
            self._words[width] = view if view is not None and view.flags.aligned else None
        return self._words[width]

    def get(self, slots: np.ndarray) -> torch.Tensor:
        """The tensors of ``slots`` (each must have one)."""
        return as_torch(self.get_numpy(slots), self.dtype)

    def get_numpy(self, slots: np.ndarray) -> np.ndarray:
        """:meth:`get` as a NumPy array (dtypes NumPy lacks as same-width ints)."""
        return self._np.take(self.index[slots], axis=0)

    def put(self, slots: np.ndarray, values: torch.Tensor | np.ndarray, fresh: bool = False) -> None:
        """Store ``values`` for distinct ``slots`` (replacing what they had; ``fresh``: the
        caller dropped them already); an array is taken as
        :func:`~xpbank.storage.dtypes.to_numpy` gives the tensor."""
        k = slots.shape[0]
        if k == 0:
            return
        if not fresh:
            self.drop(slots)
        self.reserve(k)
        self.nfree -= k
        entries = self.free[self.nfree : self.nfree + k]
        self.index[slots] = entries
        self._np[entries] = values if isinstance(values, np.ndarray) else to_numpy(values.detach().cpu())

    def reserve(self, k: int) -> None:
        """Grow the store (by half its size, or more) so that ``k`` entries are free."""
        if self.nfree >= k:
            return
        old = self.data.shape[0]
        grow = max(k - self.nfree, old // 2, 8)
        data = torch.empty((old + grow, *self.shape), dtype=self.dtype)
        data[:old] = self.data
        self.data, self._np, self._words = data, to_numpy(data), {}
        free = np.empty(old + grow, dtype=np.int64)
        free[: self.nfree] = self.free[: self.nfree]
        free[self.nfree : self.nfree + grow] = np.arange(old, old + grow, dtype=np.int64)
        self.free, self.nfree = free, self.nfree + grow

    def drop(self, slots: np.ndarray) -> None:
        """Forget the tensors of distinct ``slots`` (slots without one are skipped)."""
        if slots.shape[0] == 0:
            return
        entries = self.index[slots]
        had = entries[entries >= 0]  # distinct, as the slots are
        if had.shape[0]:
            self.free[self.nfree : self.nfree + had.shape[0]] = had
            self.nfree += had.shape[0]
            self.index[slots] = -1

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the views of ``data`` (a pickled view comes back as a private
        copy): made again on arrival."""
        return {k: v for k, v in self.__dict__.items() if k not in ("_np", "_words")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._np, self._words = to_numpy(self.data), {}

    def clear(self) -> None:
        self.index[:] = -1
        self.free = np.arange(self.data.shape[0], dtype=np.int64)
        self.nfree = self.free.shape[0]

    def nbytes(self) -> int:
        return int(self.data.numel() * self.data.element_size() + self.index.nbytes)

    def state_dict(self) -> dict[str, Any]:
        """The slots that have a tensor and those tensors (compact, no free entries)."""
        slots = np.flatnonzero(self.index >= 0)
        return {"slots": slots, "data": self.get(slots).clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.clear()
        slots = np.asarray(state["slots"], dtype=np.int64)
        self.put(slots, torch.as_tensor(state["data"]).to(self.dtype).reshape(-1, *self.shape))
