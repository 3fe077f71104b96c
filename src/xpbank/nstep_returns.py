"""The n-step return of a window of rewards: a pure function over NumPy arrays.

For an item ``t`` and the ``k <= n`` steps of its window (``t`` and the items after it
in the same env, cut after the step that ends the episode or at the newest item
written):

    return   = sum_{j < k} gamma**j * r_{t+j}
    discount = gamma**k, or 0 when step ``t+k-1`` terminated the episode

so a learner's target is ``return + discount * V(obs after step t+k-1)``: truncation ends
the sum but keeps the bootstrap (from the true final observation); termination ends both.

Example:
    >>> import numpy as np
    >>> rewards = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 9.0]])
    >>> valid = np.array([[True, True, True], [True, True, False]])
    >>> ret, disc, steps = nstep_return(rewards, valid, np.array([False, True]), 0.5)
    >>> ret.tolist(), disc.tolist(), steps.tolist()
    ([1.75, 2.0], [0.125, 0.0], [3, 2])
"""

from __future__ import annotations

import numpy as np

__all__ = ["nstep_reduce", "nstep_return"]

_ZERO = np.float32(0.0)


def nstep_return(
    rewards: np.ndarray, valid: np.ndarray, terminated: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Discounted sums of window rewards and the discount left for the bootstrap.

    Args:
        rewards: ``[B, n]`` rewards of each window's steps (any value where not valid).
        valid: ``[B, n]`` bool, a prefix of True per row (at least the first step).
        terminated: ``[B]`` whether each window's last valid step terminated its episode.
        gamma: the discount per step.

    Returns:
        ``(returns, discounts, steps)``: float32 ``[B]``, float32 ``[B]`` and int64 ``[B]``
        (``k``, the number of valid steps).
    """
    steps = np.count_nonzero(valid, axis=1).astype(np.int64, copy=False)
    powers = gamma ** np.arange(rewards.shape[1] + 1, dtype=np.float64)
    returns, discounts = nstep_reduce(rewards, steps, terminated, powers)
    return returns, discounts, steps


def nstep_reduce(
    rewards: np.ndarray, steps: np.ndarray, terminated: np.ndarray, powers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nstep_return` for windows given by their lengths.

    Args:
        rewards: ``[B, n]`` (fastest as the transposed view of a step-major ``[n, B]``
            array); entries past a window's length are ignored (not read as numbers: an
            inf there does not leak in).
        steps: ``[B]`` each window's length ``k`` in ``1 .. n``.
        terminated: ``[B]`` whether each window's last step terminated its episode.
        powers: ``gamma ** arange(n + 1)`` (float64), made once by the caller.

    Returns:
        ``(returns, discounts)``, float32 ``[B]`` each.

    Example:
        >>> import numpy as np
        >>> r = np.array([[1.0, 1.0, 1.0], [1.0, 2.0, np.inf]])
        >>> ret, disc = nstep_reduce(r, np.array([3, 2]), np.array([False, True]), 0.5 ** np.arange(4.0))
        >>> ret.tolist(), disc.tolist()
        ([1.75, 2.0], [0.125, 0.0])
    """
    n = rewards.shape[1]
    by_step = rewards.T.astype(np.float64)  # [n, B], a copy we may zero
    np.copyto(by_step, 0.0, where=np.arange(n)[:, None] >= steps)
    returns = np.dot(powers[:n], by_step).astype(np.float32)
    discounts = powers.astype(np.float32)[steps]  # float32 of float64: as rounding once
    np.copyto(discounts, _ZERO, where=terminated)
    return returns, discounts
