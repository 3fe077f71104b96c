"""The math and the input checks of prioritized replay, as pure functions.

Proportional prioritization (Schaul et al. 2016): an item of priority ``p`` (a TD error
magnitude plus ``eps``) is stored as ``p ** alpha`` and drawn with probability
``P(i) = p_i ** alpha / sum_k p_k ** alpha``. Its importance weight is
``(N * P(i)) ** -beta``, normalized by the largest weight of any stored item (that of
the smallest ``P``) so that weights only scale updates down.

Example:
    >>> import numpy as np
    >>> importance_weights(np.array([1.0, 4.0]), total=5.0, smallest=1.0, n=2, beta=1.0).tolist()
    [1.0, 0.25]
    >>> importance_weights(np.array([1.0, 4.0]), 5.0, 1.0, 2, 1.0, normalize=False).tolist()
    [2.5, 0.625]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import PriorityError, StaleIndexError, XpbankIndexError
from xpbank.ring.ids import Ring, _as_index_array, _to_numpy
from xpbank.sampler import sumtree_numba

__all__ = [
    "beta_at",
    "check_update",
    "check_values",
    "host_arrays",
    "importance_weights",
    "power",
    "power_into",
    "weight_ratio",
]

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))  # native byte order
_INT64 = np.dtype(np.int64)


def importance_weights(
    stored: Any, total: Any, smallest: Any, n: int, beta: float, normalize: bool = True
) -> Any:
    """``(n * P(i)) ** -beta`` for items of stored priority ``stored`` (``p ** alpha``).

    Elementwise arithmetic only: NumPy arrays and floats (the NumPy trees), or tensors on
    the trees' device (the torch trees, :class:`~xpbank.sampler.prioritized_torch.TorchTrees`).

    Args:
        stored: the drawn items' stored priorities.
        total: the sum of every stored priority (``P(i) = stored / total``).
        smallest: the smallest stored priority of any live item.
        n: the number of live items.
        beta: the correction exponent (0: no correction, 1: full).
        normalize: divide by the largest weight, ``(n * smallest / total) ** -beta``.
    """
    return power(weight_ratio(stored, total, smallest, n, normalize), -beta)


def weight_ratio(stored: Any, total: Any, smallest: Any, n: int, normalize: bool = True) -> Any:
    """The base of :func:`importance_weights`: ``stored / smallest`` (normalized) or
    ``n * stored / total``, so that the weight is ``power(ratio, -beta)``."""
    if normalize:
        return stored / smallest
    return n * stored / total


def power(x: Any, y: float) -> Any:
    """``x ** y`` elementwise: the one routine that raises stored priorities
    (``(p + eps) ** alpha``) and importance weights (``** -beta``) on every path.

    ``x``: a NumPy array (float64, contiguous, as every caller passes) or a tensor (the
    torch trees). NumPy picks its power routine by CPU (a vector routine on AVX-512
    machines, the C library's ``pow`` elsewhere) and the two differ in the last bit of
    about one value in 20, so the compiled kernels
    (:mod:`~xpbank.sampler.sumtree_numba`) raise no power of their own: with or without
    them, stored priorities and weights are this function's, bit for bit, on any CPU.

    Example:
        >>> import numpy as np
        >>> power(np.array([4.0, 9.0]), 0.5).tolist()
        [2.0, 3.0]
    """
    return x**y


# exponents NumPy's ``x ** y`` may route to another routine than its power (square,
# sqrt, reciprocal ...): power_into takes ``x ** y`` itself for them
_SPECIAL = frozenset((-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0))


def power_into(x: np.ndarray, y: float, out: np.ndarray) -> np.ndarray:
    """:func:`power` of a float64 array written into ``out`` (float64, ``x``'s shape, not
    overlapping it): the same values, bit for bit (NumPy's power ufunc, which ``x ** y``
    calls for any other exponent), without a new array."""
    if y in _SPECIAL:
        out[...] = x**y
        return out
    return np.power(x, y, out=out)


def beta_at(beta0: float, steps: int | None, done: int) -> float:
    """A linear schedule from ``beta0`` to 1 over ``steps`` samples (constant without ``steps``)."""
    if steps is None:
        return beta0
    return beta0 + (1.0 - beta0) * min(1.0, done / steps)


def check_values(indices: Any, priorities: Any, stale: str) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, priorities)`` of a priority update as int64 / float64 arrays, checked
    without a ring: ``stale`` is a known mode, ids are integers, priorities finite,
    ``>= 0`` and one per id (what :func:`check_update` checks before the ids' liveness).

    Raises:
        PriorityError: as :func:`check_update`.
        XpbankIndexError: ids that are not 1-D integers.
    """
    if stale not in ("raise", "skip"):
        raise PriorityError(f"stale: expected 'raise' or 'skip', got {stale!r}")
    ids = _as_index_array(indices, "indices")
    values = _to_numpy(priorities)
    if values.dtype.kind not in "iufc":  # np.number's kinds (bool is "b")
        raise PriorityError(f"priorities: expected numbers, got dtype {values.dtype}")
    if values.ndim <= 1 or values.shape[1:] == (1,):  # float64, copied only if it is not already
        values = values.astype(np.float64, copy=False).reshape(-1)
    if values.ndim != 1 or values.shape[0] != ids.shape[0]:
        raise PriorityError(
            f"priorities: expected one per index ({ids.shape[0]}), got shape {tuple(np.shape(priorities))}"
        )
    if values.size == 0:
        return ids, values
    if not (values.min() >= 0 and values.max() < np.inf):  # one pass each; NaN fails both
        i = int(np.argmax(~np.isfinite(values) | (values < 0)))
        raise PriorityError(
            f"priorities: expected finite values >= 0, got {values[i]} at position {i}; nothing was updated"
        )
    return ids, values


def check_update(ring: Ring, indices: Any, priorities: Any, stale: str) -> tuple[np.ndarray, np.ndarray]:
    """The slots and priorities of a priority update, every input checked first.

    Returns:
        ``(slots, priorities)`` of the live ids (``stale="skip"`` drops the others),
        priorities as float64.

    Raises:
        PriorityError: ``stale`` is not ``"raise"``/``"skip"``; priorities that are NaN,
            infinite or negative, or not one per index.
        XpbankIndexError: an id that was never issued (negative, or not written yet).
        StaleIndexError: with ``stale="raise"``, an id whose item has been overwritten
            or cleared.
    """
    table_ids = getattr(ring, "check_ids", None)  # a Table's ring: slots reused out of order
    if table_ids is not None:
        return table_ids(*check_values(indices, priorities, stale), stale)
    fast = _all_live(ring, indices, priorities, stale)
    if fast is not None:
        return fast
    ids, values = check_values(indices, priorities, stale)
    if values.size == 0:
        return ids % ring.capacity, values
    low, high = int(ids.min()), int(ids.max())
    if low >= ring.first_id and high < ring.next_id:  # the usual case: every id is live
        return ids % ring.capacity, values
    if low < 0 or high >= ring.next_id:
        never = ids[(ids < 0) | (ids >= ring.next_id)][0]
        raise XpbankIndexError(
            f"indices: item {int(never)} was never issued (ids so far: 0 .. {ring.next_id - 1}); "
            "nothing was updated"
        )
    if low < ring.first_id:
        live = ids >= ring.first_id
        if stale == "raise":
            raise StaleIndexError(
                f"indices: item {int(ids[~live][0])} has been overwritten or cleared (live items: "
                f"{ring.first_id} .. {ring.next_id - 1}); nothing was updated. Pass stale='skip' "
                "to drop such updates and write the rest."
            )
        ids, values = ids[live], values[live]
    return ids % ring.capacity, values


def _all_live(ring: Ring, indices: Any, priorities: Any, stale: str) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`check_update`'s result in one compiled pass (numba) for the usual update:
    int64 ids, all live, float32/float64 priorities, finite, ``>= 0``, one per id, as
    CPU tensors or arrays. ``None`` for anything else (or without numba): the NumPy
    checks then decide, and name what is wrong."""
    kernels = sumtree_numba.load()
    if kernels is None or stale not in ("raise", "skip"):
        return None
    arrays = host_arrays(indices, priorities)
    if arrays is None:
        return None
    ids, values = arrays
    slots = np.empty(ids.shape[0], dtype=np.int64)
    if not kernels.live_slots(ids, values, ring.first_id, ring.next_id, ring.capacity, slots):
        return None
    return slots, values.astype(np.float64, copy=False)


def host_arrays(indices: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(ids, values)``: NumPy views of a priority update's inputs where they are what
    the compiled checks take (CPU tensors or arrays; int64 ids of one dim, float32 or
    float64 values of the same shape), else ``None`` (the NumPy checks convert or refuse)."""
    try:
        ids = indices.numpy() if isinstance(indices, torch.Tensor) else indices
        values = priorities.numpy() if isinstance(priorities, torch.Tensor) else priorities
    except (RuntimeError, TypeError):  # requires grad, not on the CPU, bfloat16
        return None
    if (
        isinstance(ids, np.ndarray)
        and isinstance(values, np.ndarray)
        and ids.dtype is _INT64  # NumPy's native dtypes are singletons: `is` spares ~0.1 µs
        and (values.dtype is _FLOATS[1] or values.dtype is _FLOATS[0])
        and ids.ndim == 1
        and values.shape == ids.shape
    ):
        return ids, values
    return None
