"""The prioritized sampler's compiled paths (NumPy trees, numba), and the buffer's small calls.

A ``sample(32)`` and an update of 32 priorities were each a chain of small steps (a
fresh uniform tensor and its NumPy view, the draw kernel, the weights, the checks, the
update kernel, each with its Python glue), ~0.5-1 µs apiece against a C++ library's one
call. Here each is what it must be:

- a draw (:func:`draw_at`): the stratified uniforms from the buffer's generator into
  a float64 tensor kept per batch size (:class:`DrawArrays`: the same draws as
  ``torch.rand(B, dtype=torch.float64)``), one compiled call at addresses
  (:func:`~xpbank.sampler.prioritized_calls.draw`: after a write the top's prefix sums
  into a kept array, then fractions, descent, the weights' bases, the ids; the drawn
  records prefetched for the read) writing the slots into the caller's tensor and the
  ids at the caller's address, then the weights' power (NumPy's, see
  :func:`~xpbank.sampler.priorities.power`) into a new array or the caller's.
  :meth:`PrioritizedSampler.sample <xpbank.PrioritizedSampler.sample>` (through
  :func:`draw_into`: new ids and weights tensors), the buffer's read fast path
  (:mod:`xpbank.replay.fast_read`) and a :class:`~xpbank.Mixture`'s share (ids and
  weights written into its batch) all draw through it: same slots, weights and
  schedule position;
- an update (:func:`update_ids`) of two plain CPU tensors (``batch["index"]`` and a TD
  error): their dtypes, shapes, device, layout and bits checked in Python, then one
  compiled call at their ``data_ptr()`` checks the ids' liveness and the values, adds
  ``eps`` and finds the slots (:func:`~xpbank.sampler.prioritized_calls.check`), NumPy's
  power, and one more writes both trees and the min-tree
  (:func:`~xpbank.sampler.prioritized_calls.write`). Other arrays (NumPy) take the same
  steps through the array kernels (:func:`~xpbank.sampler.sumtree_numba.live_priorities`,
  then :func:`write`, which the sampler's own ``update_priority`` also ends with).
  Anything those checks do not accept (a stale or never issued id, a bad value, other
  dtypes, shapes or devices, a view with a negative bit, the torch trees) returns
  ``False`` before anything is written, and the buffer's general path takes the call:
  its checks raise the errors they raise, or skip stale ids.

Where a step's time goes (``sample(32)`` + ``update_priority`` of its ids, 100k
CartPole-sized items, thread CPU time): the draw's own work is ~1.5-3 µs (the uniforms
from torch's generator ~1, the descent's cache misses; the top searched for the whole
batch in lockstep, :func:`~xpbank.sampler.sumtree_numba.search_right_all`), the
weights' power ~1-2 (NumPy raises 32 values one by one where it has no vector
routine), the new ids and weights tensors ~1.5; the rest is the batch the uniform
sampler's read builds too (records, TensorDict) and the update's Python checks (~1.2)
around its two calls.

Without numba every function here declines or is not called: the NumPy path is the
reference, unchanged. ``sampler`` is a :class:`~xpbank.PrioritizedSampler` throughout
(typed ``Any``: that module imports this one); these functions read and keep its trees.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.sampler import prioritized_calls, sumtree, sumtree_numba
from xpbank.sampler.priorities import host_arrays, power, power_into
from xpbank.sampler.prioritized_calls import TreeCalls

if TYPE_CHECKING:
    from xpbank.ring.ids import Ring

__all__ = ["DrawArrays", "draw_at", "draw_into", "tree_calls", "update_ids", "write"]


class DrawArrays:
    """A sample's reused arrays for one batch size: the uniforms (a float64 tensor and
    its NumPy view) and the weights' bases. Never pickled (rebuilt on use)."""

    def __init__(self) -> None:
        self.size = -1
        self.uniforms = torch.empty(0, dtype=torch.float64)
        self.draws = self.uniforms.numpy()
        self.ratios = np.empty(0)
        self.draws_at = self.ratios_at = 0  # their addresses (prioritized_calls.draw)

    def of(self, batch_size: int) -> DrawArrays:
        """These arrays, sized for ``batch_size`` (reallocated only when it changes)."""
        if self.size != batch_size:
            self.uniforms = torch.empty(batch_size, dtype=torch.float64)
            self.draws, self.ratios = self.uniforms.numpy(), np.empty(batch_size)
            self.draws_at, self.ratios_at = self.uniforms.data_ptr(), int(self.ratios.ctypes.data)
            self.size = batch_size
        return self

    def fill(self, generator: torch.Generator) -> np.ndarray:
        """New uniforms in ``[0, 1)``, bit for bit ``torch.rand(B, generator=generator,
        dtype=torch.float64)``; returns their NumPy view."""
        self.uniforms.uniform_(generator=generator)
        return self.draws

    def __reduce__(self) -> tuple[Any, ...]:
        return (DrawArrays, ())


def _weights(sampler: Any, ratios: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The weights of the bases ``ratios`` (a new float32 array, or written into ``out``:
    float32, the same values); the schedule moves on."""
    beta = sampler.beta0 if sampler.beta_steps is None else sampler.beta
    if out is None:
        weights = power(ratios, -beta).astype(np.float32)  # NumPy's power, as importance_weights
    else:
        out[...] = power(ratios, -beta)  # (the same cast to float32 as astype's)
        weights = out
    sampler._samples += 1
    return weights


def tree_calls(sampler: Any) -> TreeCalls | None:
    """The sampler's :class:`~xpbank.sampler.prioritized_calls.TreeCalls` for its
    current NumPy trees (made anew after they were replaced), or ``None``: no compiled
    small calls, the torch trees, or no trees yet."""
    calls = sampler._calls
    if calls.levels is not sampler._levels or calls.smallest is not sampler._smallest:
        if sampler._trees is not None or not sampler._levels or prioritized_calls.load() is None:
            return None
        calls = sampler._calls = TreeCalls(sampler._levels, sampler._smallest)
        sampler._cums = None  # (a copy's kept sums are not these calls' array) summed anew
    return calls if calls.draw is not None else None


def draw_into(
    sampler: Any,
    ring: Ring,
    slots: torch.Tensor,
    generator: torch.Generator,
    records: tuple[int, int] = (0, 0),
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:meth:`PrioritizedSampler.sample <xpbank.PrioritizedSampler.sample>` with
    replacement into ``slots`` (a CPU int64 tensor, dense, the batch size long) in one
    compiled call (:func:`draw_at`); returns the items' ids (a new tensor) and weights,
    or ``None`` before any draw where the sampler's own ``sample`` must take the call
    (no numba, the torch trees, nothing written, every priority 0: it raises).
    ``records``: the address and row size of the records the batch reads next
    (prefetched), or ``(0, 0)``."""
    ids = torch.from_numpy(np.empty(slots.shape[0], dtype=np.int64))  # (~0.2 µs less than torch.empty)
    weights = draw_at(sampler, ring, slots, generator, records, ids.data_ptr())
    return None if weights is None else (ids, torch.from_numpy(weights))


def draw_at(
    sampler: Any,
    ring: Ring,
    slots: torch.Tensor,
    generator: torch.Generator,
    records: tuple[int, int],
    ids_at: int,
    weights: np.ndarray | None = None,
) -> np.ndarray | None:
    """:func:`draw_into`'s draw with the items' ids written at address ``ids_at`` (int64,
    the batch size long) and their weights returned (a new float32 array, or written
    into ``weights``: float32, the batch size long, e.g. a slice of a
    :class:`~xpbank.Mixture`'s batch), or ``None`` before any draw, as :func:`draw_into`.
    One compiled call (:func:`~xpbank.sampler.prioritized_calls.draw`), then the
    weights' power."""
    calls = sampler._calls
    if calls.levels is not sampler._levels or calls.smallest is not sampler._smallest or calls.draw is None:
        calls = tree_calls(sampler)
        if calls is None:
            return None
    fresh = sampler._cums is None  # a write since the last sample: the kernel sums the top first
    if sampler.normalize_weights:
        smallest = sampler._smallest
        scale, divisor = 1.0, smallest._value if smallest._known else smallest.value  # (LazyMin.value)
        if not divisor < math.inf:  # no positive leaf: the total is 0 (the sampler raises)
            return None
    else:
        if fresh:
            calls.cums[...] = sumtree.top_prefix(sampler._sum)
            fresh = False
        scale, divisor = float(ring.size), float(calls.cums[-1])
        if not divisor > 0:
            return None
    b = slots.shape[0]
    arrays = sampler._arrays
    if arrays.size != b:
        arrays.of(b)
    arrays.uniforms.uniform_(generator=generator)  # (DrawArrays.fill, inline: one call less)
    calls.draw(
        calls.address, arrays.draws_at, arrays.ratios_at, slots.data_ptr(), ids_at, b,
        fresh, scale, divisor, ring.next_id - ring.size, ring.capacity, *records,
    )  # fmt: skip
    sampler._cums = calls.cums  # the top's prefix sums, until the next write
    return _weights(sampler, arrays.ratios, weights)


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
    if type(indices) is torch.Tensor and type(priorities) is torch.Tensor and stale in ("raise", "skip"):
        done = _update_tensors(sampler, ring, indices, priorities)
        if done is not None:
            return done
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


def _update_tensors(sampler: Any, ring: Ring, ids: torch.Tensor, values: torch.Tensor) -> bool | None:
    """:func:`update_ids` of two plain torch tensors where both are dense on the CPU
    (int64 ids, float32/float64 values, one dim, one value per id, at least one): two
    compiled calls at their ``data_ptr()`` (:mod:`~xpbank.sampler.prioritized_calls`:
    the checks, then the trees' upkeep) around NumPy's power. ``None`` for any other
    tensor (the array path then looks at it), ``False`` where the checks say no."""
    kind = values.dtype
    if ids.dtype is not torch.int64 or (kind is not torch.float32 and kind is not torch.float64):
        return None
    if ids.dim() != 1 or values.shape != ids.shape or values.requires_grad:
        return None  # (requires_grad: numpy() refuses it; the general path reads it)
    if not (ids.is_cpu and values.is_cpu and ids.is_contiguous() and values.is_contiguous()):
        return None
    if values.is_neg() or ids.is_neg():  # a negative view's bytes are not its values
        return None
    n = ids.shape[0]
    calls = sampler._calls
    if calls.levels is not sampler._levels or calls.smallest is not sampler._smallest or calls.draw is None:
        calls = tree_calls(sampler)
        if calls is None:
            return None
    if calls.size != n:
        if n == 0:
            return None
        calls.update_arrays(n)
    stop = ring.next_id  # (and stop - size: ring.first_id, inline)
    if not calls.check(
        ids.data_ptr(), values.data_ptr(), kind is torch.float32, n, stop - ring.size, stop,
        ring.capacity, sampler.eps, calls.slots_at, calls.shifted_at,
    ):  # fmt: skip
        return False
    power_into(calls.shifted, sampler.alpha, calls.stored)  # NumPy's power, as write's
    smallest = sampler._smallest
    in_sync = smallest._count == 0 and not smallest._rebuild  # (LazyMin.in_sync, inline)
    largest, low, hit, exact = calls.write(
        calls.address, calls.slots_at, calls.shifted_at, calls.stored_at, n, smallest._value, in_sync
    )
    if largest > sampler.max_priority:
        sampler.max_priority = largest
    smallest.kept_up(low, hit, exact)  # the min-tree kept up to date by the call
    sampler._cums = None
    return True
