"""Proportional prioritized sampling (Schaul et al. 2016) over a sum-tree and a lazy min.

For CPU storage both trees are NumPy arrays on the CPU (for CUDA storage, torch tensors
on its device: see below). A batch is drawn with stratified segments: the
total priority is cut into ``batch_size`` equal segments and one point is drawn
uniformly in each, then the whole batch descends the sum-tree level by level. Priority
updates write the leaves and recompute their ancestors level by level. Neither loops
over items: O(B log N) in a few NumPy calls per level. The smallest stored priority (for
the weights' normalization) is kept by :class:`~xpbank.sampler.lazymin.LazyMin`, whose
min-tree is only brought up to date when a write raised the minimum's leaf. The top's
prefix sums are kept between samples until the next write.

With numba (the ``fast`` extra; ``XPBANK_NO_NUMBA=1`` turns it off) a sample is one
compiled call (:func:`~xpbank.sampler.prioritized_calls.draw`: fractions, descent,
weights' bases, ids) and so is a priority update's tree write
(:func:`~xpbank.sampler.sumtree_numba.update`, or for the buffer's tensor update
:func:`~xpbank.sampler.prioritized_calls.write`, which keeps the min-tree up to date
too), with the same slots, weights and trees as the NumPy path, which stays the
reference. Those calls and the buffer's small-call paths (a sample's draw into kept
arrays, an update checked and written in two compiled calls) are in
:mod:`~xpbank.sampler.prioritized_fast`; the kernels that take addresses, and the
context of a tree's addresses they read (``_calls``, made anew with new trees), in
:mod:`~xpbank.sampler.prioritized_calls`.

With ``tree_device`` a torch device the trees are torch tensors there instead
(:class:`~xpbank.sampler.prioritized_torch.TorchTrees`: the same levels, an eager
min-tree, no numba): ``sample`` returns slots and weights on that device and
``update_priority`` copies the host-checked slots and values there once. A CUDA storage
keeps the NumPy trees by default: measured on an H200 (``benchmarks/bench_cuda.py``), a
descent with a kernel launch per level cost several times the compiled host draw and
the copy of its ids. The state is the same either way (CPU tensors), so it moves between
backends and devices.

``config()`` gives the JSON-able constructor arguments; ``state_dict()`` holds the stored
priorities of the written slots, the largest priority and the schedule position, and
the trees are rebuilt on load. Whatever writes the sum-tree's leaves must tell
``LazyMin`` (``changed`` or ``reset``) and drop the cached top prefix sums (``_cums``).
"""

from __future__ import annotations

import math
from typing import Any, NoReturn

import numpy as np
import torch

from xpbank.errors import PriorityError, check_positive_int
from xpbank.ring.ids import Ring
from xpbank.sampler import sumtree, sumtree_numba
from xpbank.sampler.lazymin import LazyMin
from xpbank.sampler.priorities import beta_at, importance_weights, power
from xpbank.sampler.prioritized_calls import TreeCalls
from xpbank.sampler.prioritized_fast import DrawArrays, draw_into, write
from xpbank.sampler.prioritized_torch import TorchTrees
from xpbank.sampler.registry import register_sampler
from xpbank.storage.base import Slots

__all__ = ["PrioritizedSampler"]


def _check_tree_device(value: Any) -> str | None:
    """``tree_device`` as ``None``, ``"numpy"`` or a torch device's name."""
    if value is None or value == "numpy":
        return value
    try:
        return str(torch.device(value))
    except (RuntimeError, TypeError) as exc:
        raise PriorityError(
            f"tree_device: expected None, 'numpy' or a torch device ('cpu', 'cuda:0'), got {value!r}"
        ) from exc


def _check_number(name: str, value: Any, low: float, strict: bool = False) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int past 1e308
        number = math.nan
    if isinstance(value, bool) or not math.isfinite(number) or number < low or (strict and number == low):
        sign = ">" if strict else ">="
        raise PriorityError(f"{name}: expected a finite number {sign} {low}, got {value!r}")
    return number


@register_sampler("prioritized")
class PrioritizedSampler:
    """Draw items with probability proportional to ``priority ** alpha``.

    New items get the largest priority seen so far (at least ``max_priority``), so each
    is likely to be drawn once before its TD error is known. Send new priorities back
    with ``rb.update_priority(batch["index"], td_error.abs())``.

    Each sampled batch carries ``"weight"`` (float32): the importance weights
    ``(N * P(i)) ** -beta``, divided by the largest weight of any stored item that can
    be drawn (``P > 0``) unless ``normalize_weights=False``.

    Args:
        alpha: how strongly priorities shape sampling (0: uniform).
        beta: the importance-correction exponent, or its start value with ``beta_steps``.
        eps: added to every priority so that no item becomes impossible to draw.
        max_priority: the priority of the first items written.
        beta_steps: anneal ``beta`` linearly to 1 over this many ``sample`` calls.
        normalize_weights: divide weights by the largest possible one.
        tree_device: where the trees live: ``None`` (default) and ``"numpy"``: NumPy
            on the CPU (compiled draws and updates), also for a CUDA storage, whose
            ids and weights are then copied to it with the batch; any torch device
            (``"cpu"``, ``"cuda:1"``): the torch backend on that device. On H200
            machines with the data on the GPU, a sample(256) + update(256) at 1M
            items took 0.37-0.90 ms with NumPy trees and 2.4-5.5 ms with trees on the
            GPU (kernel launches per level; ``benchmarks/bench_cuda.py``).

    Example:
        >>> import torch
        >>> from xpbank import PrioritizedSampler, ReplayBuffer
        >>> rb = ReplayBuffer(1000, sampler=PrioritizedSampler(alpha=1.0, beta=1.0), seed=0)
        >>> rb.extend({"obs": torch.randn(4, 3)})
        range(0, 4)
        >>> rb.update_priority([0, 1, 2, 3], [1.0, 1.0, 1.0, 5.0])
        >>> batch = rb.sample(8)
        >>> batch["weight"].dtype, round(float(batch["weight"].min()), 2)
        (torch.float32, 0.2)
    """

    needs_episodes = False

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        max_priority: float = 1.0,
        *,
        beta_steps: int | None = None,
        normalize_weights: bool = True,
        tree_device: Any = None,
    ):
        self.alpha = _check_number("alpha", alpha, 0.0)
        self.beta0 = _check_number("beta", beta, 0.0)
        self.eps = _check_number("eps", eps, 0.0)
        self.max_priority = _check_number("max_priority", max_priority, 0.0, strict=True)
        self.beta_steps = None if beta_steps is None else check_positive_int("beta_steps", beta_steps)
        self.normalize_weights = bool(normalize_weights)
        self.tree_device = _check_tree_device(tree_device)
        self._trees: TorchTrees | None = None  # the torch backend's trees, when in use
        self._initial_max = self.max_priority
        self._samples = 0  # sample() calls so far: the schedule's position
        self._filled = 0  # slots [0, filled) have been written since the last clear
        self._sum: sumtree.Tree = []
        self._levels: tuple[np.ndarray, ...] = ()
        self._smallest = LazyMin(np.zeros(0))  # the smallest positive stored priority
        self._cums: np.ndarray | None = None  # the sum-tree's top prefix sums, until a write
        self._arrays = DrawArrays()  # a sample's uniforms (torch.rand's bits) and weights' bases, reused
        self._calls = TreeCalls()  # the trees' compiled small calls (prioritized_calls), made on use

    @property
    def beta(self) -> float:
        """The ``beta`` the next sample uses."""
        return beta_at(self.beta0, self.beta_steps, self._samples)

    def config(self) -> dict[str, Any]:
        """The constructor arguments, JSON-able: ``PrioritizedSampler(**s.config())``."""
        return {
            "alpha": self.alpha,
            "beta": self.beta0,
            "eps": self.eps,
            "max_priority": self._initial_max,
            "beta_steps": self.beta_steps,
            "normalize_weights": self.normalize_weights,
            "tree_device": self.tree_device,
        }

    def bind_device(self, device: Any) -> None:
        """Where the buffer's storage lives (called by :class:`~xpbank.ReplayBuffer`):
        trees already built move to the backend ``tree_device`` names now (their
        leaves are kept); the storage's device itself does not choose the backend.
        """
        built = self._trees.device if self._trees is not None else None
        if self._allocated() and self._backend_device() != built:
            self.load_state_dict(self.state_dict())

    def _backend_device(self) -> torch.device | None:
        """The torch backend's device, or ``None`` for the NumPy trees."""
        if self.tree_device is None or self.tree_device == "numpy":
            return None
        return torch.device(self.tree_device)

    def _allocated(self) -> bool:
        return bool(self._sum) or self._trees is not None

    def _allocate(self, capacity: int) -> None:
        device = self._backend_device()
        self._trees = None if device is None else TorchTrees(capacity, device)
        self._cums = None
        if self._trees is not None:  # no NumPy trees
            self._sum, self._levels, self._smallest = [], (), LazyMin(np.zeros(0))
            return
        self._sum = sumtree.new_tree(capacity, np.add)
        self._levels = tuple(self._sum)  # what the compiled kernels take
        self._smallest = LazyMin(self._sum[0])
        self._cums = None

    @property
    def _min(self) -> sumtree.Tree:
        """The min-tree of the stored priorities (0 as ``inf``), brought up to date."""
        return self._smallest.tree if self._sum else []

    # -- the Sampler protocol ------------------------------------------------------
    def sample(
        self, ring: Ring, batch_size: int, generator: torch.Generator, replace: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        if not replace:
            raise PriorityError(
                "replace=False: prioritized sampling draws with replacement (one stratified "
                "point per segment of the total priority); sample with replace=True"
            )
        if self._trees is not None:
            return self._sample_torch(self._trees, ring, batch_size, generator)
        kept = torch.empty(batch_size, dtype=torch.int64)
        drawn = draw_into(self, ring, kept, generator)  # the same draw in one compiled call
        if drawn is not None:
            return kept, {"weight": drawn[1]}
        if self._cums is None:  # without numba (or nothing to draw: raised below)
            self._cums = sumtree.top_prefix(self._sum)
        if not self._cums[-1] > 0:
            self._nothing_to_draw()
        draws = self._arrays.of(batch_size).fill(generator)  # bit for bit torch.rand(B, dtype=float64)
        fractions = (np.arange(batch_size) + draws) / batch_size
        slots, total = sumtree.find_prefix_sum(self._sum, fractions, self._cums)
        stored = self._sum[0][slots]
        smallest = self._smallest.value if self.normalize_weights else math.inf  # unused if not
        weights = importance_weights(stored, total, smallest, ring.size, self.beta, self.normalize_weights)
        self._samples += 1
        return torch.from_numpy(slots), {"weight": torch.from_numpy(weights.astype(np.float32))}

    def _nothing_to_draw(self) -> NoReturn:
        raise PriorityError(
            f"sample: every stored priority is 0 (alpha={self.alpha}, eps={self.eps}), so no item "
            "can be drawn; use eps > 0 or give some item a positive priority"
        )

    def _sample_torch(
        self, trees: TorchTrees, ring: Ring, batch_size: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """:meth:`sample` on the torch trees: the same draws (from the CPU generator, moved
        to the trees' device once), descent and weights there."""
        if not trees.total() > 0:  # one host sync
            self._nothing_to_draw()
        draws = torch.rand(batch_size, generator=generator, dtype=torch.float64)
        fractions = (torch.arange(batch_size, dtype=torch.float64) + draws) / batch_size
        slots, stored, total = trees.draw(fractions)
        smallest = trees.smallest() if self.normalize_weights else math.inf  # unused if not
        weights = importance_weights(stored, total, smallest, ring.size, self.beta, self.normalize_weights)
        self._samples += 1
        return slots, {"weight": weights.to(torch.float32)}

    def on_write(self, slots: Slots, ring: Ring) -> None:
        """New items start at the largest priority so far."""
        if not self._allocated():
            self._allocate(ring.capacity)
        value = power(np.full(1, self.max_priority), self.alpha)
        if self._trees is not None:
            self._filled = max(self._filled, self._write_torch(self._trees, slots, float(value[0])))
            return
        leaves = self._sum[0]
        if isinstance(slots, slice):
            stop = slots.stop
            self._smallest.changed(slots, leaves[slots], value)  # the old values, before the write
            sumtree.set_range(self._sum, slots.start, stop, float(value[0]), np.add)
        else:
            s = slots.cpu().numpy()
            self._smallest.changed(s, leaves[s], value)
            sumtree.set_leaves(self._sum, s, np.full(s.shape, value[0]), np.add)
            stop = int(s.max()) + 1 if s.size else 0
        self._filled = max(self._filled, stop)
        self._cums = None

    @staticmethod
    def _write_torch(trees: TorchTrees, slots: Slots, value: float) -> int:
        """:meth:`on_write` on the torch trees; returns the end of the slots written."""
        if isinstance(slots, slice):
            trees.write_range(slots.start, slots.stop, value)
            return int(slots.stop)
        if slots.numel() == 0:
            return 0
        trees.write(slots, value)
        return int(slots.max()) + 1

    def on_clear(self) -> None:
        if self._allocated():
            self._allocate(self._trees.capacity if self._trees is not None else self._sum[0].shape[0])
        self._filled = 0

    def update_priority(self, slots: np.ndarray, priorities: np.ndarray) -> None:
        """Set the priorities of live ``slots`` (a repeated slot keeps its last value).

        Inputs are checked by the buffer (:func:`~xpbank.sampler.priorities.check_update`).
        """
        if slots.size == 0:
            return
        p = priorities + self.eps
        kernels = None if self._trees is not None else sumtree_numba.load()
        if kernels is not None:  # the same writes in one compiled call
            write(self, kernels, slots, p)
            return
        stored = power(p, self.alpha)  # NumPy's power on every path (priorities.power)
        self.max_priority = max(self.max_priority, float(p.max()))
        if self._trees is not None:  # checked on the host, written on the device
            self._trees.write(slots, stored)
            return
        leaves = self._sum[0]
        old = leaves[slots]
        sumtree.set_leaves(self._sum, slots, stored, np.add)
        self._smallest.changed(slots, old, leaves[slots])  # read back: a repeated slot keeps its last
        self._cums = None

    def totals(self) -> tuple[float, float]:
        """``(sum, smallest)`` of the stored priorities (``(0.0, inf)`` before any write).

        The sum is what sampling draws against; the smallest counts only items that can
        be drawn (priority > 0). A sharded buffer adds the sums and takes the smallest
        of every shard to weight a sample as one buffer would.
        """
        if self._trees is not None:
            return self._trees.totals()
        if not self._sum:
            return 0.0, math.inf
        return sumtree.top_reduce(self._sum, np.add), self._smallest.value

    def priority(self, slots: Any) -> np.ndarray:
        """The stored priorities (``(p + eps) ** alpha``) of ``slots`` (0: never written)."""
        if isinstance(slots, torch.Tensor):  # e.g. a CUDA sample's slots
            slots = slots.cpu()
        slots = np.asarray(slots, dtype=np.int64)
        if self._trees is not None:
            return self._trees.priority(slots)
        return self._sum[0][slots] if self._sum else np.zeros(slots.shape)

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The stored priorities of the written slots, the largest priority, the schedule
        (CPU tensors and numbers whichever backend: a state loads into either)."""
        if self._trees is not None:
            leaves, capacity = self._trees.leaves(self._filled), self._trees.capacity
        else:
            leaves = torch.from_numpy(self._sum[0][: self._filled].copy() if self._sum else np.zeros(0))
            capacity = self._sum[0].shape[0] if self._sum else 0
        return {
            "capacity": capacity,  # leaves, padded
            "priorities": leaves,
            "max_priority": self.max_priority,
            "samples": self._samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`; both trees are rebuilt from the leaves."""
        saved = state["priorities"]
        host = saved.cpu().numpy() if isinstance(saved, torch.Tensor) else np.asarray(saved)
        leaves = host.astype(np.float64)
        if leaves.ndim != 1 or not 0 <= leaves.shape[0] <= int(state["capacity"]):
            raise PriorityError(f"priorities: {leaves.shape} leaves for capacity {state['capacity']!r}")
        if not np.isfinite(leaves).all() or (leaves < 0).any():  # what update_priority refuses
            raise PriorityError("priorities: NaN, infinite or negative stored priorities")
        _check_number("max_priority", state["max_priority"], 0.0, strict=True)
        if int(state["capacity"]):
            self._allocate(int(state["capacity"]))
            if self._trees is not None:
                self._trees.load(torch.from_numpy(leaves))
            else:
                self._sum[0][: leaves.shape[0]] = leaves
                sumtree.rebuild(self._sum, np.add)
                self._smallest.reset()
        self._filled = leaves.shape[0]
        self.max_priority = float(state["max_priority"])
        self._samples = int(state["samples"])

    def __repr__(self) -> str:
        return (
            f"PrioritizedSampler(alpha={self.alpha}, beta={self.beta:.3g}, eps={self.eps}, "
            f"max_priority={self.max_priority:.3g})"
        )
