"""The prioritized sampler's compiled paths (NumPy trees, numba), and the buffer's small calls.

A ``sample(32)`` and an update of 32 priorities were each a chain of small steps (a
fresh uniform tensor and its NumPy view, the draw kernel, the weights, the checks, the
update kernel, each with its Python glue), ~0.5-1 µs apiece against a C++ library's one
call. Here each is what it must be:

- a draw (:func:`draw_into`): the stratified uniforms from the buffer's generator into
  a float64 tensor kept per batch size (:class:`DrawArrays`: the same draws as
  ``torch.rand(B, dtype=torch.float64)``), one compiled call
  (:func:`~xpbank.sampler.sumtree_numba.draw_fresh`: after a write the top's prefix sums
  into a kept array, then fractions, descent, the weights' bases) writing the slots
  where the caller wants them, then the weights' power (NumPy's, see
  :func:`~xpbank.sampler.priorities.power`). :meth:`PrioritizedSampler.sample
  <xpbank.PrioritizedSampler.sample>` and the buffer's read fast path
  (:mod:`xpbank.replay.fast_read`) both draw through it: same slots, weights and
  schedule position;
- an update (:func:`update_ids`): the ids' liveness and the values checked, ``eps``
  added and the slots found in one compiled pass
  (:func:`~xpbank.sampler.sumtree_numba.live_priorities`), the power, then both trees'
  upkeep in one compiled call (:func:`write`, which the sampler's own
  ``update_priority`` also ends with). Anything that pass does not accept (a stale or
  never issued id, a bad value, other dtypes or shapes, the torch trees) returns
  ``False`` before anything is written, and the buffer's general path takes the call:
  its checks raise the errors they raise, or skip stale ids.

Without numba every function here declines or is not called: the NumPy path is the
reference, unchanged. ``sampler`` is a :class:`~xpbank.PrioritizedSampler` throughout
(typed ``Any``: that module imports this one); these functions read and keep its trees.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.sampler import sumtree, sumtree_numba
from xpbank.sampler.priorities import host_arrays, power

if TYPE_CHECKING:
    from xpbank.ring.ids import Ring

__all__ = ["DrawArrays", "draw_into", "update_ids", "write"]


class DrawArrays:
    """A sample's reused arrays for one batch size: the uniforms (a float64 tensor and
    its NumPy view) and the weights' bases. Never pickled (rebuilt on use)."""

    def __init__(self) -> None:
        self.size = -1
        self.uniforms = torch.empty(0, dtype=torch.float64)
        self.draws = self.uniforms.numpy()
        self.ratios = np.empty(0)
        self.cums = np.empty(0)  # the top's prefix sums, rewritten in place by draw_fresh

    def prefix(self, length: int) -> np.ndarray:
        """The kept array for a top's prefix sums (``length``: the top's length + 1)."""
        if self.cums.shape[0] != length:
            self.cums = np.empty(length)
        return self.cums

    def of(self, batch_size: int) -> DrawArrays:
        """These arrays, sized for ``batch_size`` (reallocated only when it changes)."""
        if self.size != batch_size:
            self.uniforms = torch.empty(batch_size, dtype=torch.float64)
            self.draws, self.ratios = self.uniforms.numpy(), np.empty(batch_size)
            self.size = batch_size
        return self

    def fill(self, generator: torch.Generator) -> np.ndarray:
        """New uniforms in ``[0, 1)``, bit for bit ``torch.rand(B, generator=generator,
        dtype=torch.float64)``; returns their NumPy view."""
        self.uniforms.uniform_(generator=generator)
        return self.draws

    def __reduce__(self) -> tuple[Any, ...]:
        return (DrawArrays, ())


def _weights(sampler: Any, ratios: np.ndarray) -> np.ndarray:
    """The weights of the bases ``ratios`` (a new float32 array); the schedule moves on."""
    weights = power(ratios, -sampler.beta).astype(np.float32)  # NumPy's power, as importance_weights
    sampler._samples += 1
    return weights


def draw_into(
    sampler: Any, ring: Ring, slots: np.ndarray, generator: torch.Generator
) -> tuple[np.ndarray, torch.Tensor] | None:
    """:meth:`PrioritizedSampler.sample <xpbank.PrioritizedSampler.sample>` with
    replacement into ``slots`` (int64, the batch size long); returns the items' ids (a
    new array) and weights, or ``None`` before any draw where the sampler's own
    ``sample`` must take the call (no numba, the torch trees, nothing written, every
    priority 0: it raises)."""
    kernels = sumtree_numba.load()
    levels = sampler._levels
    if kernels is None or sampler._trees is not None or not levels:
        return None
    cums = sampler._cums
    fresh = cums is None  # a write since the last sample: the kernel sums the top first
    if sampler.normalize_weights:
        scale, divisor = 1.0, sampler._smallest.value
        if not divisor < math.inf:  # no positive leaf: the total is 0 (the sampler raises)
            return None
        if fresh:
            cums = sampler._cums = sampler._arrays.prefix(levels[-1].shape[0] + 1)
    else:
        if fresh:
            cums = sampler._cums = sumtree.top_prefix(sampler._sum)
            fresh = False
        scale, divisor = float(ring.size), float(cums[-1])
        if not divisor > 0:
            return None
    b = slots.shape[0]
    arrays = sampler._arrays.of(b)
    arrays.fill(generator)
    ids = np.empty(b, dtype=np.int64)
    first = ring.next_id - ring.size
    kernels.draw_fresh(
        levels, cums, fresh, arrays.draws, scale, divisor, slots, arrays.ratios, ids, first, ring.capacity
    )
    return ids, torch.from_numpy(_weights(sampler, arrays.ratios))


def write(sampler: Any, kernels: Any, slots: np.ndarray, shifted: np.ndarray) -> None:
    """Store ``shifted ** alpha`` (``shifted``: ``p + eps``, float64) at ``slots`` (kept
    by the sampler's :class:`~xpbank.sampler.lazymin.LazyMin` until its next flush) in
    one compiled call: leaves, ancestors, the largest priority, the smallest's upkeep."""
    stored = power(shifted, sampler.alpha)  # NumPy's power on every path (priorities.power)
    largest, low, hit = kernels.update(sampler._levels, slots, shifted, stored, sampler._smallest.kept)
    if largest > sampler.max_priority:
        sampler.max_priority = largest
    sampler._smallest.noted(slots, low, hit)
    sampler._cums = None


def update_ids(sampler: Any, ring: Ring, indices: Any, priorities: Any, stale: str) -> bool:
    """``rb.update_priority(indices, priorities, stale)`` for the usual call: CPU int64
    ids, all live, float32/float64 priorities, finite, ``>= 0``, one per id, at least
    one. Returns whether it wrote them; ``False``: nothing was checked to the end or
    written, and the general path (its checks, then ``sampler.update_priority``) takes
    the call."""
    kernels = sumtree_numba.load()
    if kernels is None or sampler._trees is not None or not sampler._levels or stale not in ("raise", "skip"):
        return False
    arrays = host_arrays(indices, priorities)
    if arrays is None:
        return False
    ids, values = arrays
    n = ids.shape[0]
    if n == 0:
        return False
    slots, shifted = np.empty(n, dtype=np.int64), np.empty(n)
    first, stop, capacity = ring.first_id, ring.next_id, ring.capacity
    if not kernels.live_priorities(ids, values, first, stop, capacity, sampler.eps, slots, shifted):
        return False
    write(sampler, kernels, slots, shifted)
    return True
