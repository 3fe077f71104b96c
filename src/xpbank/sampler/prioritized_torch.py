"""The torch backend of :class:`~xpbank.PrioritizedSampler`: both trees on one device.

When a buffer's storage is on CUDA the sampler keeps its sum-tree and min-tree as
float64 tensors on that device (:mod:`~xpbank.sampler.sumtree_torch`), so a sample's
slots and weights are made where the data is and a priority update is one host-to-device
copy of the checked slots and values. The min-tree is updated eagerly with the sum-tree
(its leaves are the stored priorities with 0 as ``inf``: items that cannot be drawn do
not count), which costs a second pass per level but no host decision per write.
The sampler's bookkeeping (``max_priority``, the schedule, input checks) stays on the
host; :class:`TorchTrees` holds only the trees.

The uniform draws still come from the buffer's CPU generator and move to the device
once; a sample syncs with the host once (the all-zero check).

Example:
    >>> import numpy as np, torch
    >>> trees = TorchTrees(8, "cpu")
    >>> trees.write_range(0, 4, 1.0)
    >>> trees.write(np.array([1, 2]), np.array([3.0, 0.0]))
    >>> trees.totals()
    (5.0, 1.0)
    >>> slots, stored, total = trees.draw(torch.tensor([0.1, 0.5], dtype=torch.float64))
    >>> slots.tolist(), stored.tolist(), float(total)
    ([0, 1], [1.0, 3.0], 5.0)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.sampler import sumtree_torch as st

__all__ = ["TorchTrees"]


class TorchTrees:
    """A sum-tree and a min-tree over ``capacity`` leaves on ``device``.

    Args:
        capacity: leaves (slots).
        device: where the trees live (a torch device or its name).
    """

    def __init__(self, capacity: int, device: Any) -> None:
        self.device = torch.device(device)
        self.sum = st.new_tree(capacity, "sum", self.device)
        self.min = st.new_tree(capacity, "min", self.device)
        self._cums: torch.Tensor | None = None  # the sum-tree's top prefix sums, until a write

    @property
    def capacity(self) -> int:
        """Leaves, padded."""
        return int(self.sum[0].shape[0])

    def write_range(self, start: int, stop: int, value: float) -> None:
        """Leaves ``[start, stop)`` get ``value`` (new items)."""
        st.set_range(self.sum, start, stop, value, "sum")
        st.set_range(self.min, start, stop, value if value > 0 else float("inf"), "min")
        self._cums = None

    def write(self, slots: Any, values: Any) -> None:
        """Leaves ``slots`` get ``values`` (a repeated slot keeps its last); NumPy arrays
        or tensors, moved to the device once."""
        s = torch.as_tensor(slots, dtype=torch.int64).to(self.device)
        v = torch.as_tensor(values, dtype=torch.float64).to(self.device)
        if s.numel() == 0:
            return
        if v.dim() == 0 or v.numel() == 1:
            v = v.reshape(1).expand(s.shape[0])
        unique, where = st.last_of_each(s)
        kept = v[where]
        self.sum[0][unique] = kept
        st.refresh_leaves(self.sum, unique, "sum")
        self.min[0][unique] = st.positive(kept)
        st.refresh_leaves(self.min, unique, "min")
        self._cums = None

    def draw(self, fractions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(slots, stored priorities, total)`` at ``fractions`` of the total, on the device."""
        slots, total = st.find_prefix_sum(self.sum, fractions.to(self.device), self._top())
        return slots, self.sum[0][slots], total

    def total(self) -> float:
        """What sampling draws against (the top's prefix sum; one host sync)."""
        return float(self._top()[-1])

    def _top(self) -> torch.Tensor:
        """The sum-tree's top prefix sums, computed once per write."""
        if self._cums is None:
            self._cums = st.top_prefix(self.sum)
        return self._cums

    def smallest(self) -> torch.Tensor:
        """The smallest positive stored priority (``inf`` if none), 0-d on the device."""
        return st.total(self.min, "min")

    def totals(self) -> tuple[float, float]:
        """``(sum, smallest positive)`` of the leaves, on the host."""
        return float(st.total(self.sum, "sum")), float(self.smallest())

    def leaves(self, count: int) -> torch.Tensor:
        """The first ``count`` leaves, copied to the CPU."""
        return self.sum[0][:count].cpu().clone()

    def priority(self, slots: np.ndarray) -> np.ndarray:
        """The stored priorities of ``slots``, on the host."""
        index = torch.from_numpy(slots).to(self.device)
        return self.sum[0][index].cpu().numpy()

    def load(self, leaves: torch.Tensor) -> None:
        """Set the first leaves to ``leaves`` (the rest keep their identity) and rebuild."""
        n = leaves.shape[0]
        values = leaves.to(self.device, torch.float64)
        self.sum[0][:n] = values
        self.min[0][:n] = st.positive(values)
        st.rebuild(self.sum, "sum")
        st.rebuild(self.min, "min")
        self._cums = None
