"""An optional compiled kernel (numba) for n-step sampling: window, return, discount.

:meth:`NStep.gather <xpbank.NStep.gather>` walks each sampled item's window
(:meth:`EpisodeIndex.walk_slots <xpbank.EpisodeIndex.walk_slots>`), reads the window's
rewards and reduces them (:func:`~xpbank.nstep_returns.nstep_sum`): a dozen NumPy calls,
each costing its per-call overhead. With numba installed (``pip install xpbank[fast]``)
the whole of it is one compiled loop over the batch, :func:`nstep_window`, with the same
results: the same slots, steps and flags, and the return summed in float64 in the order
of ``np.dot(powers, by_step)`` (step 0 first), then cast to float32.

The NumPy path stays the reference and runs where numba is missing, where the
environment variable ``XPBANK_NO_NUMBA=1`` is set (read once, at this module's import),
or where the reward field has no NumPy host view of dtype float32/float64.

Example:
    >>> import numpy as np
    >>> from xpbank.nstep_kernel import kernel, nstep_window
    >>> nxt = np.array([2, 3, 4, -1, -1, -1])  # [6 slots] env 0: 0 -> 2 -> 4; env 1: 1 -> 3
    >>> term = np.array([0, 0, 0, 1, 0, 0], dtype=bool)
    >>> reward = np.ones(6, dtype=np.float32)
    >>> # (pair, steps, returns, discounts, terminated) of items 0 and 1, where numba is installed
    >>> kernel() is None or [a.tolist() for a in nstep_window(
    ...     np.array([0, 1]), 2, 6, nxt, term, reward, 0.5 ** np.arange(4.0))] == [
    ...     [0, 1, 4, 3], [3, 2], [1.75, 1.5], [0.125, 0.0], [False, True]]
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xpbank import _jit

__all__ = ["kernel", "nstep_window"]

DISABLED = not _jit.ENABLED  # read once, at import (xpbank._jit)
_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call


def kernel() -> Callable[..., Any] | None:
    """The compiled kernel (numba, ``cache=True``; compiled on first use), or ``None``
    where numba is missing or ``XPBANK_NO_NUMBA=1`` was set: callers then take the
    NumPy path."""
    if not _compiled:
        kernels = _jit.compile_kernels(_nstep_window)
        _compiled.append(None if kernels is None else kernels[0])
    return _compiled[0]


def nstep_window(
    ids: np.ndarray,
    lockstep: int,
    capacity: int,
    nxt: np.ndarray,
    term: np.ndarray,
    reward: np.ndarray,
    powers: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each item's n-step window and its reduction, in one pass over the batch.

    Args:
        ids: ``[B]`` live item ids (int64; not checked).
        lockstep: ``num_envs`` in lockstep mode (an env's next item is that many ids
            later), or ``0``: follow the ``next`` links.
        capacity: the ring's capacity (slot = id % capacity).
        nxt: the per-slot ``next`` ids of the episode index (``-1``: none).
        term: the per-slot ``terminated`` flags.
        reward: the reward of every slot (a NumPy view, strided or not; float32/float64).
        powers: ``gamma ** arange(n + 1)`` (float64): ``n = len(powers) - 1``.

    Returns:
        ``(pair, steps, returns, discounts, terminated)``: ``pair`` ``[2B]`` int64 the
        items' slots then their windows' last slots; ``steps`` int64 ``[B]``; float32
        ``returns`` and ``discounts`` (0 where the last step terminated); bool
        ``terminated`` ``[B]``. Equal to the NumPy path's.

    Raises:
        RuntimeError: numba is not available (see :func:`kernel`).
    """
    fn = kernel()
    if fn is None:
        raise RuntimeError("nstep_window: numba is not available (pip install xpbank[fast])")
    b = ids.shape[0]
    pair = np.empty(2 * b, dtype=np.int64)
    steps = np.empty(b, dtype=np.int64)
    ret = np.empty(b, dtype=np.float32)
    disc = np.empty(b, dtype=np.float32)
    done = np.empty(b, dtype=np.bool_)
    fn(ids, lockstep, capacity, nxt, term, reward, powers, pair, steps, ret, disc, done)
    return pair, steps, ret, disc, done


def _nstep_window(
    ids: Any,
    lockstep: Any,
    capacity: Any,
    nxt: Any,
    term: Any,
    reward: Any,
    powers: Any,
    pair: Any,
    steps: Any,
    ret: Any,
    disc: Any,
    done: Any,
) -> None:  # pragma: no cover - compiled by numba; run only through kernel()
    """The kernel (numba nopython; outputs written in place). Mirrors ``walk_slots``:
    lockstep windows stop at the first step whose ``next`` is ``-1`` (the slots after
    it are never read); link-following windows step to ``next`` until it is ``-1``."""
    b = ids.shape[0]
    n = powers.shape[0] - 1
    for i in range(b):
        item = ids[i]
        slot = item % capacity
        pair[i] = slot
        acc = 0.0
        k = 1
        while True:
            acc += powers[k - 1] * np.float64(reward[slot])
            if k == n:
                break
            after = nxt[slot]
            if after < 0:
                break
            slot = (item + lockstep * k) % capacity if lockstep > 0 else after % capacity
            k += 1
        pair[b + i] = slot
        steps[i] = k
        ret[i] = np.float32(acc)
        ended = term[slot]
        done[i] = ended
        disc[i] = np.float32(0.0) if ended else np.float32(powers[k])
