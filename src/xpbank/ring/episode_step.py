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
    links: np.ndarray,
    flags: np.ndarray,
    state: np.ndarray,
    term: np.ndarray,
    trunc: np.ndarray,
    first: int,
    first_id: int,
) -> None:
    """Record items ``first .. first + E - 1`` (item ``i`` of env ``i``) after the ring
    advanced past them (``first_id``: its oldest live id then), and each env's state.

    ``links``: the index's ``[4, capacity]`` env, prev, next and start rows; ``flags``
    its ``[capacity, 2]`` end flags; ``state``: the per-env state packed as bytes (see
    :func:`_packed`). Few arguments: numba's call costs ~0.2 µs per array."""
    e = term.shape[0]
    last_id = state[: 8 * e].view(np.int64)
    cur_start = state[8 * e : 16 * e].view(np.int64)
    last_end = state[16 * e : 17 * e].view(np.bool_)
    fresh = state[17 * e : 18 * e].view(np.bool_)
    env, prev, nxt, start = links[0], links[1], links[2], links[3]
    c = env.shape[0]
    for i in range(e):
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
_kernel = None if _compiled is None else _compiled[0]


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
    p = index.__dict__.get("_packed")
    if (
        p is None
        or index._last_end is not p[3]
        or index._fresh is not p[4]
        or index._last_id is not p[1]
        or index._cur_start is not p[2]
    ):  # first call, or the other paths replaced the arrays since
        p = _packed(index)
    n, ring = p[5], index._ring
    _kernel(p[6], p[7], p[0], _flags(terminated, n), _flags(truncated, n), first, ring.next_id - ring.size)  # type: ignore[misc]


def _packed(index: EpisodeIndex) -> tuple[Any, ...]:
    """The index's per-env state (``last_id``, ``cur_start``: int64; ``last_end``,
    ``fresh``: bool) moved into one byte array, the index's arrays replaced by views of
    it (the other paths replace them, never mutate them: a plan may hold the old ones).
    Returns ``(bytes, *the four views, E, the index's [4, capacity] rows, its flags)``."""
    e = index._last_id.shape[0]
    state = np.empty(18 * e, dtype=np.uint8)
    views = (
        state[: 8 * e].view(np.int64),
        state[8 * e : 16 * e].view(np.int64),
        state[16 * e : 17 * e].view(np.bool_),
        state[17 * e :].view(np.bool_),
    )
    for view, old in zip(
        views, (index._last_id, index._cur_start, index._last_end, index._fresh), strict=True
    ):
        view[...] = old
    index._last_id, index._cur_start, index._last_end, index._fresh = views
    packed = (state, *views, e, index._arrays.rows, index._arrays.flags)
    index.__dict__["_packed"] = packed
    return packed


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
