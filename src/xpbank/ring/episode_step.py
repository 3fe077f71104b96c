"""One env step of lockstep envs recorded in an :class:`~xpbank.EpisodeIndex` in one
compiled call: the write fast path's index upkeep (:mod:`xpbank.replay.fast_write`).

With ``num_envs=E`` (or one stream, ``E = 1``) and no env field, one step of every env
is ``E`` items whose ids follow the ring's ``next_id``; item ``i`` is env ``i``, its
predecessor is env ``i``'s newest item, and nothing about it can be refused (the
batch's shape already says it is one whole step). Its entries are then arithmetic on
the id and the env's state, which :func:`step_kernel` writes item by item: the same
entries as :meth:`EpisodeIndex.plan <xpbank.EpisodeIndex.plan>` then :meth:`apply
<xpbank.EpisodeIndex.apply>` (the NumPy reference, ~15 NumPy calls of ~0.3 µs at this
size), in one call. Without numba, :func:`lockstep_step` says no and the caller plans
and applies.

Example:
    >>> import numpy as np, torch
    >>> from xpbank import ReplayBuffer
    >>> rb = ReplayBuffer(8, num_envs=2)
    >>> _ = rb.extend({"obs": np.zeros((2, 1), np.float32), "terminated": np.array([False, True])})
    >>> _ = rb.extend({"obs": np.zeros((2, 1), np.float32), "terminated": np.array([False, False])})
    >>> rb.episodes.episode_start([2, 3]).tolist(), rb.episodes.predecessors([2, 3]).tolist()
    ([0, 3], [0, -1])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from xpbank import _jit
from xpbank.spec.spec import NestedKey, Spec

if TYPE_CHECKING:
    from xpbank.ring.episodes import EpisodeIndex

__all__ = ["lockstep_step", "record_step", "step_kernel"]


def step_kernel(
    env: np.ndarray,
    prev: np.ndarray,
    nxt: np.ndarray,
    start: np.ndarray,
    flags: np.ndarray,
    last_id: np.ndarray,
    last_end: np.ndarray,
    cur_start: np.ndarray,
    fresh: np.ndarray,
    term: np.ndarray,
    trunc: np.ndarray,
    first: int,
    first_id: int,
) -> None:
    """Record items ``first .. first + E - 1`` (item ``i`` of env ``i``) after the ring
    advanced past them (``first_id``: its oldest live id then), and each env's state."""
    c = env.shape[0]
    for i in range(last_id.shape[0]):
        item = first + i
        s = item % c
        pred = last_id[i]
        begins = fresh[i]
        env[s] = i
        prev[s] = pred
        first_of_episode = item if begins else cur_start[i]
        start[s] = first_of_episode
        flags[s, 0] = term[i]
        flags[s, 1] = trunc[i]
        nxt[s] = -1
        if not begins and pred >= first_id:  # a live predecessor in the same episode
            nxt[pred % c] = item
        end = term[i] or trunc[i]
        last_id[i] = item
        cur_start[i] = first_of_episode
        last_end[i] = end
        fresh[i] = end


_compiled = _jit.compile_kernels(step_kernel)


def lockstep_step(
    index: EpisodeIndex, spec: Spec, n: int
) -> tuple[NestedKey | None, NestedKey | None] | None:
    """The ``(terminated, truncated)`` keys :func:`record_step` reads where a write of
    ``n`` items of ``spec`` is one lockstep env step it can record, else ``None`` (no
    numba, an env field, not one step, or the index has not planned a write of ``spec``)."""
    if _compiled is None or index._resolved_for is not spec or index._resolved is None:
        return None
    term_key, trunc_key, env_key = index._resolved
    if env_key is not None or n != (index.num_envs or 1) or index._last_id.shape[0] != n:
        return None
    return term_key, trunc_key


def record_step(index: EpisodeIndex, terminated: Any, truncated: Any, first: int) -> None:
    """Record one lockstep step (see :func:`lockstep_step`) written at ids ``first ..``,
    after the ring advanced past it, from its ``terminated`` / ``truncated`` values
    (NumPy arrays, or one item's numbers; ``None``: no such field). The per-env state
    arrays are written in place: no plan holds them between two calls of this path."""
    n = index._last_id.shape[0]
    a = index._arrays
    _compiled[0](  # type: ignore[index]
        a.env, a.prev, a.next, a.start, a.flags, index._last_id, index._last_end, index._cur_start,
        index._fresh, _flags(terminated, n), _flags(truncated, n), first, index._ring.first_id,
    )  # fmt: skip


_ONE = (np.zeros(1, dtype=bool), np.ones(1, dtype=bool))


def _flags(value: Any, n: int) -> np.ndarray:
    """``n`` episode-end flags as bool (the sizes were checked when the batch's signature
    was: :func:`~xpbank.ring.episode_keys.read_flag`'s rules)."""
    if value is None:
        return np.zeros(n, dtype=bool)
    if type(value) is not np.ndarray:  # one item's number
        return _ONE[bool(value != 0)]
    arr = value.reshape(n) if value.ndim != 1 else value
    return arr if arr.dtype == np.bool_ else arr != 0
