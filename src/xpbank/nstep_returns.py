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

__all__ = ["nstep_reduce", "nstep_return", "nstep_table"]


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
    returns, discounts = nstep_reduce(rewards, steps, terminated, nstep_table(rewards.shape[1], gamma))
    return returns, discounts, steps


def nstep_table(n: int, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """What :func:`nstep_reduce` needs for windows of up to ``n`` steps, made once.

    Returns:
        ``(weights, powers)``: ``weights[k, j] = gamma**j`` for ``j < k``, else 0
        (``[n + 1, n]`` float64); ``powers[k] = gamma**k`` (``[n + 1]``).

    Example:
        >>> weights, powers = nstep_table(2, 0.5)
        >>> weights.tolist(), powers.tolist()
        ([[0.0, 0.0], [1.0, 0.0], [1.0, 0.5]], [1.0, 0.5, 0.25])
    """
    powers = gamma ** np.arange(n + 1, dtype=np.float64)  # gamma**j for j = 0 .. n
    weights = np.tril(np.ones((n + 1, n)), -1) * powers[:n]
    return weights, powers


def nstep_reduce(
    rewards: np.ndarray, steps: np.ndarray, terminated: np.ndarray, table: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`nstep_return` for windows given by their lengths ``steps`` (``[B]``, each in
    ``1 .. n``) and a :func:`nstep_table`: ``(returns, discounts)``, float32 ``[B]``."""
    weights, powers = table
    returns = np.einsum("ij,ij->i", rewards, weights[steps])
    discounts = np.where(terminated, 0.0, powers[steps])
    return returns.astype(np.float32), discounts.astype(np.float32)
