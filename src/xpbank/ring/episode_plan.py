"""What one write adds to an :class:`~xpbank.EpisodeIndex`, computed before anything is written.

The planning functions are pure: they read the batch's ids, envs and episode ends and
each env's state before the write (newest id, whether it ended its episode, its episode's
first id), and return a :class:`_Plan` of the new items' entries and each env's state
after the write. :meth:`EpisodeIndex.plan <xpbank.EpisodeIndex.plan>` checks the batch and
calls them; :meth:`EpisodeIndex.apply <xpbank.EpisodeIndex.apply>` records the plan once
the write has gone through, so a bad batch leaves the index as it was.

A lockstep write (``num_envs=E``, ``k`` steps) needs no sort: an item's predecessor is
the id ``E`` before it, so the plan is computed with slices, and the per-env state is
replaced, not copied (a plan may hold it); that state keeps ``fresh`` (the env's next
item starts an episode), so a one-step write needs no negation.

Example:
    >>> import numpy as np
    >>> ids, env = np.arange(4), np.array([0, 1, 0, 1])
    >>> end = np.array([False, True, False, False])
    >>> no = np.zeros(4, dtype=bool)
    >>> p = plan_by_env(ids, env, end, no, np.full(2, -1), np.zeros(2, dtype=bool), np.full(2, -1))
    >>> p.prev.tolist(), p.start.tolist()
    ([-1, -1, 0, 1], [0, 1, 0, 3])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["MINUS_ONE", "empty_plan", "grow", "plan_by_env", "plan_lockstep"]

MINUS_ONE = np.array(-1, dtype=np.int64)


@dataclass(slots=True)
class _Plan:
    """What one write adds, computed (and checked) before anything is written."""

    ids: np.ndarray
    env: np.ndarray
    prev: np.ndarray
    start: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    env_state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # envs, last id, last end, start
    link: np.ndarray | None  # the item continues its predecessor's episode (None: ~fresh)
    step: int = 0  # lockstep: items per env step (an item's prev is the id ``step`` before it); 0: not
    fresh: np.ndarray | None = None  # lockstep, one env step: ~link (the items that start an episode)


def empty_plan() -> _Plan:
    """The plan of a write of no items (it changes nothing)."""
    none = np.zeros(0, dtype=np.int64)
    state = (none, none, np.zeros(0, dtype=bool), none)
    return _Plan(none, none, none, none, none != 0, none != 0, state, none != 0)


def plan_by_env(
    ids: np.ndarray,
    env: np.ndarray,
    term: np.ndarray,
    trunc: np.ndarray,
    last_id: np.ndarray,
    last_end: np.ndarray,
    cur_start: np.ndarray,
) -> _Plan:
    """The plan of ``n > 0`` items of any envs (a stable sort by env of the batch).

    Args:
        ids: the new items' ids.
        env: each item's env, below the per-env arrays' length.
        term: whether each item ends its episode by termination.
        trunc: whether each item ends its episode by truncation.
        last_id: each env's newest item before the write (``-1``: none).
        last_end: whether that item ended its episode.
        cur_start: the first id of each env's current episode.
    """
    n = ids.shape[0]
    order = np.argsort(env, kind="stable")
    se, sid, send = env[order], ids[order], (term | trunc)[order]
    head = np.ones(n, dtype=bool)
    head[1:] = se[1:] != se[:-1]
    last = np.ones(n, dtype=bool)
    last[:-1] = head[1:]
    prev_s = np.empty(n, dtype=np.int64)
    prev_s[1:] = sid[:-1]
    prev_s[head] = last_id[se[head]]
    prev_end = np.empty(n, dtype=bool)
    prev_end[1:] = send[:-1]
    prev_end[head] = last_end[se[head]]
    is_start = (prev_s < 0) | prev_end
    value = np.where(is_start, sid, cur_start[se])
    mark = np.where(is_start | head, np.arange(n), 0)
    start_s = value[np.maximum.accumulate(mark)]
    prev, start = np.empty_like(prev_s), np.empty_like(start_s)
    prev[order], start[order] = prev_s, start_s
    link = np.empty(n, dtype=bool)
    link[order] = ~is_start
    envs = se[last]
    state = (envs, sid[last], send[last], start_s[last])
    return _Plan(ids, env, prev, start, term, trunc, state, link)


def plan_lockstep(
    ids: np.ndarray,
    env: np.ndarray,
    term: np.ndarray,
    trunc: np.ndarray,
    e: int,
    envs: np.ndarray,
    fresh: np.ndarray,
    last_id: np.ndarray,
    cur_start: np.ndarray,
) -> _Plan:
    """The plan of ``k`` time-major steps of ``e`` envs: items ``i`` and ``i + e`` are
    consecutive steps of one env, so no sort is needed.

    A handful of NumPy calls, each on same-dtype arrays (a mixed-dtype op or
    ``np.where`` costs several times a plain one at these sizes). ``envs``, ``fresh``
    (no predecessor, or it ended its episode), ``last_id`` and ``cur_start`` are the
    index's per-env arrays: :meth:`EpisodeIndex.apply <xpbank.EpisodeIndex.apply>`
    replaces (never mutates) them in lockstep mode, so the plan may hold them without
    copies.
    """
    n, end = ids.shape[0], term | trunc
    if n == e:  # one step of every env: the common vector-env write
        start1 = cur_start.copy()
        np.copyto(start1, ids, where=fresh)
        state1 = (envs, ids, end, start1)
        return _Plan(ids, env, last_id, start1, term, trunc, state1, None, e, fresh)
    link = np.empty(n, dtype=bool)
    np.logical_not(fresh, out=link[:e])
    np.logical_not(end[:-e], out=link[e:])
    prev = np.empty(n, dtype=np.int64)
    prev[:e], prev[e:] = last_id, ids[:-e]
    # an episode's first id, carried forward along time by a running max (ids grow);
    # the first step takes the env's current start where it continues one (that
    # start is older than any new id, so the max picks the right one either way)
    start = ids.copy()
    np.copyto(start, MINUS_ONE, where=link)
    np.maximum(start[:e], cur_start, out=start[:e])
    start = np.maximum.accumulate(start.reshape(n // e, e), axis=0).reshape(n)
    state = (envs, ids[-e:], end[-e:], start[-e:])
    return _Plan(ids, env, prev, start, term, trunc, state, link, e)


def grow(arr: np.ndarray, width: int, fill: Any) -> np.ndarray:
    """``arr`` extended to ``width`` entries of ``fill`` (``arr`` itself when wide enough)."""
    if arr.shape[0] >= width:
        return arr
    out = np.full(width, fill, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out
