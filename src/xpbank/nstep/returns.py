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

__all__ = ["nstep_reduce", "nstep_return", "nstep_sum"]

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
    by_step = rewards.T.astype(np.float64)  # [n, B], a copy we may zero
    past = np.arange(1, rewards.shape[1])[:, None] >= steps
    return nstep_sum(by_step, past, steps, terminated, powers)


def nstep_sum(
    by_step: np.ndarray, past: np.ndarray, steps: np.ndarray, terminated: np.ndarray, powers: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nstep_reduce` for a step-major window whose steps past each window's end
    are flagged (n-step sampling's hot path: a window read as slots flags them for free).

    Args:
        by_step: ``[n, B]`` rewards, step-major; ZEROED IN PLACE past each window's end
            (pass a copy you own). Any float dtype: the sum runs in float64.
        past: ``[n - 1, B]`` bool, ``past[j]``: step ``j + 1`` is past the window's end.
        steps: ``[B]`` each window's length ``k`` (``past`` says the same).
        terminated: ``[B]`` whether each window's last step terminated its episode.
        powers: ``gamma ** arange(n + 1)`` (float64).

    Returns:
        ``(returns, discounts)``, float32 ``[B]`` each.

    Example:
        >>> import numpy as np
        >>> r = np.array([[1.0, 1.0], [1.0, 2.0], [1.0, np.inf]])  # [n = 3, B = 2]
        >>> past = np.array([[False, False], [False, True]])
        >>> ret, disc = nstep_sum(r, past, np.array([3, 2]), np.array([False, True]), 0.5 ** np.arange(4.0))
        >>> ret.tolist(), disc.tolist()
        ([1.75, 2.0], [0.125, 0.0])
    """
    np.copyto(by_step[1:], 0, where=past)
    # float64 sums, one step after another from step 0: the compiled kernel's order, bit
    # for bit (np.dot's BLAS blocks and fuses the multiply-adds: the last bit differs)
    acc = np.zeros(by_step.shape[1:], dtype=np.float64)
    for j in range(by_step.shape[0]):
        acc += powers[j] * by_step[j].astype(np.float64, copy=False)
    returns = acc.astype(np.float32)
    discounts = powers[steps].astype(np.float32)
    np.copyto(discounts, _ZERO, where=terminated)
    return returns, discounts
