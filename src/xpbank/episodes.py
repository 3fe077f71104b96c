"""Episodes and environments of the items in a ring: the index n-step and sequences read.

A replay buffer fed by ``E`` vector environments interleaves their steps, and each env
ends its episodes on its own steps. :class:`EpisodeIndex` keeps, per slot, what is
needed to follow one env's stream through the ring without scanning at sample time:

- ``env``: the env the item came from;
- ``prev`` / ``next``: the id of the item before / after it in the same env (``-1``:
  none, or not written yet);
- ``terminated`` / ``truncated`` (and ``is_end``, their or): whether the item ends its
  episode, read from the batch when it is written;
- ``start``: the id of the first item of its episode.

Which env an item came from: with ``num_envs=E`` each ``extend`` of ``k * E`` items is
``k`` steps of every env, time-major (item ``i`` is env ``i % E``); with a per-item
``env_id`` field the field says so (for data that does not arrive in lockstep); with
neither, the items are one stream (env 0).

Maintenance is O(1) per item, vectorized per call (a stable sort by env of the batch).
Only ids are stored, so the ring's id rules tell what is still live: an item's ``prev``
(or its episode's ``start``) that has been overwritten is below ``ring.first_id``.
``next`` pointers of live items always point at live items (a successor is newer).

Example:
    >>> import torch
    >>> from xpbank import ReplayBuffer
    >>> rb = ReplayBuffer(100, num_envs=2)
    >>> for t in range(3):  # env 1 terminates at t = 1
    ...     done = torch.tensor([False, t == 1])
    ...     _ = rb.extend({"obs": torch.zeros(2, 1), "terminated": done})
    >>> eps = rb.episodes
    >>> eps.env([0, 1, 2, 3]).tolist()
    [0, 1, 0, 1]
    >>> ids, valid = eps.window([0, 1], 3)
    >>> ids.tolist(), valid.tolist()
    ([[0, 2, 4], [1, 3, -1]], [[True, True, True], [True, True, False]])
    >>> eps.episode_start([4, 5]).tolist()
    [0, 5]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.errors import SpecError, StaleIndexError, check_positive_int
from xpbank.spec import NestedKey, Spec, key_str, normalize_key

if TYPE_CHECKING:
    from xpbank.ring import Ring

__all__ = ["EpisodeIndex", "EpisodeKeys"]

MAX_ENV_ID = 1 << 20  # env ids beyond this need num_envs (per-env state is an array)

_TERMINATED = (("next", "terminated"), "terminated")
_TRUNCATED = (("next", "truncated"), "truncated")
_DONE = (("next", "done"), "done")


@dataclass(frozen=True)
class EpisodeKeys:
    """Which fields say an item's env and how its episode ends.

    ``None`` finds the field by its usual names: ``("next", "terminated")`` or
    ``"terminated"``, ``("next", "truncated")`` or ``"truncated"``; without either, a
    ``"done"`` (or ``("next", "done")``) field counts as a termination (no bootstrap).
    A field that is absent under every name means "never ends".

    Example:
        >>> EpisodeKeys(terminated="term").terminated
        'term'
    """

    env: Any = "env_id"
    terminated: Any = None
    truncated: Any = None
    done: Any = None

    def resolve(self, spec: Spec) -> tuple[NestedKey | None, NestedKey | None]:
        """``(terminated_key, truncated_key)`` found in ``spec`` (``None``: absent).

        Raises:
            SpecError: a key named explicitly is not in ``spec``.
        """
        for name in ("terminated", "truncated", "done"):
            given = getattr(self, name)
            if given is not None and normalize_key(given) not in spec:
                raise SpecError(
                    f"episode_keys.{name}: field {key_str(normalize_key(given))!r} is not in the "
                    f"spec; known: {[key_str(k) for k in spec]}"
                )
        term = _find(spec, self.terminated, _TERMINATED)
        trunc = _find(spec, self.truncated, _TRUNCATED)
        if term is None and trunc is None:
            term = _find(spec, self.done, _DONE)
        return term, trunc


def _find(spec: Spec, given: Any, names: tuple[NestedKey, ...]) -> NestedKey | None:
    if given is not None:
        return normalize_key(given)
    return next((k for k in names if k in spec), None)


def wants_episodes(spec: Spec | None, keys: EpisodeKeys, num_envs: int | None, needed: bool) -> bool:
    """Whether a buffer keeps an index: asked for, or its items carry an env field."""
    return needed or num_envs is not None or (spec is not None and normalize_key(keys.env) in spec)


@dataclass
class _Plan:
    """What one write adds, computed (and checked) before anything is written."""

    ids: np.ndarray
    env: np.ndarray
    prev: np.ndarray
    start: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    env_state: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # envs, last id, last end, start


@dataclass(frozen=True)
class SlotLinks:
    """Per-slot views of an :class:`EpisodeIndex` (ids; ``-1``: none)."""

    env: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    start: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray


class EpisodeIndex:
    """Per-slot env, neighbours in the same env, episode ends and starts of a ring.

    Built by :class:`~xpbank.ReplayBuffer` (``num_envs=``, an ``env_id`` field, or a
    feature that needs it, such as ``nstep=``) and reachable as ``rb.episodes`` and as
    ``ring.episodes`` (what samplers get). Queries take item ids (ints, lists, arrays
    or tensors) and return NumPy arrays.

    Args:
        ring: the ring whose items are indexed (its ids tell what is live).
        num_envs: items per env step in lockstep mode; ``None``: an env field or one stream.
        keys: which fields hold the env id and the episode ends.
    """

    def __init__(self, ring: Ring, num_envs: int | None = None, keys: EpisodeKeys | None = None):
        self._ring = ring
        self.num_envs = None if num_envs is None else check_positive_int("num_envs", num_envs)
        self.keys = keys if keys is not None else EpisodeKeys()
        self._resolved: tuple[NestedKey | None, NestedKey | None, NestedKey | None] | None = None
        self._resolved_for: Spec | None = None
        c = ring.capacity
        self._env = np.zeros(c, dtype=np.int64)
        self._prev = np.full(c, -1, dtype=np.int64)
        self._next = np.full(c, -1, dtype=np.int64)
        self._start = np.full(c, -1, dtype=np.int64)
        self._term = np.zeros(c, dtype=bool)
        self._trunc = np.zeros(c, dtype=bool)
        self._reset_envs(self.num_envs or 1)

    def _reset_envs(self, n: int) -> None:
        self._last_id = np.full(n, -1, dtype=np.int64)  # each env's newest item
        self._last_end = np.zeros(n, dtype=bool)
        self._cur_start = np.full(n, -1, dtype=np.int64)

    # -- writing ---------------------------------------------------------------
    def plan(self, flat: dict[NestedKey, torch.Tensor], n: int, spec: Spec) -> _Plan:
        """Check a validated batch of ``n`` items and compute its index entries.

        Nothing changes until :meth:`apply`, so a bad batch leaves the buffer as it was.

        Raises:
            SpecError: a batch that is not whole env steps (lockstep), or a bad env id.
        """
        if self._resolved is None or self._resolved_for is not spec:
            self._resolved = (*self.keys.resolve(spec), self._env_key(spec))
            self._resolved_for = spec
        term_key, trunc_key, env_key = self._resolved
        env = self._env_ids(flat, n, env_key)
        if n == 0:
            none = np.zeros(0, dtype=np.int64)
            return _Plan(none, none, none, none, none != 0, none != 0, self._empty_state())
        term = _flag(flat, term_key, n)
        trunc = _flag(flat, trunc_key, n)
        first = self._ring.next_id
        ids = np.arange(first, first + n, dtype=np.int64)
        order = np.argsort(env, kind="stable")
        se, sid, send = env[order], ids[order], (term | trunc)[order]
        head = np.ones(n, dtype=bool)
        head[1:] = se[1:] != se[:-1]
        last = np.ones(n, dtype=bool)
        last[:-1] = head[1:]
        width = max(int(se[-1]) + 1, self._last_id.shape[0])
        last_id, last_end, cur_start = (_grow(a, width, fill) for a, fill in self._env_arrays())
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
        envs = se[last]
        state = (envs, sid[last], send[last], start_s[last])
        return _Plan(ids, env, prev, start, term, trunc, state)

    def _empty_state(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        none = np.zeros(0, dtype=np.int64)
        return none, none, np.zeros(0, dtype=bool), none

    def _env_arrays(self) -> list[tuple[np.ndarray, Any]]:
        return [(self._last_id, -1), (self._last_end, False), (self._cur_start, -1)]

    def apply(self, plan: _Plan) -> None:
        """Record a planned write, after the ring has advanced past it."""
        envs, last_id, last_end, start = plan.env_state
        if envs.size == 0:
            return
        width = max(int(envs.max()) + 1, self._last_id.shape[0])
        self._last_id, self._last_end, self._cur_start = (
            _grow(a, width, fill) for a, fill in self._env_arrays()
        )
        self._last_id[envs], self._last_end[envs], self._cur_start[envs] = last_id, last_end, start
        c = self._ring.capacity
        keep = slice(max(0, plan.ids.shape[0] - c), None)  # a batch over capacity keeps its tail
        slots = plan.ids[keep] % c
        self._env[slots] = plan.env[keep]
        self._prev[slots] = plan.prev[keep]
        self._start[slots] = plan.start[keep]
        self._term[slots] = plan.terminated[keep]
        self._trunc[slots] = plan.truncated[keep]
        self._next[slots] = -1
        live = plan.prev >= self._ring.first_id
        self._next[plan.prev[live] % c] = plan.ids[live]

    def clear(self) -> None:
        """Every item was dropped: the next item of each env starts an episode."""
        self._reset_envs(self._last_id.shape[0])

    def _env_key(self, spec: Spec) -> NestedKey | None:
        key = normalize_key(self.keys.env)
        return key if key in spec else None

    def _env_ids(self, flat: dict[NestedKey, torch.Tensor], n: int, key: NestedKey | None) -> np.ndarray:
        if key is None:
            if self.num_envs is None:
                return np.zeros(n, dtype=np.int64)
            if n % self.num_envs:
                raise SpecError(
                    f"batch of {n} items with num_envs={self.num_envs}: expected whole env steps "
                    f"(a multiple of {self.num_envs}, time-major); give an "
                    f"{key_str(normalize_key(self.keys.env))!r} field for items that"
                    " do not arrive in lockstep"
                )
            return np.tile(np.arange(self.num_envs, dtype=np.int64), n // self.num_envs)
        value = flat[key]
        if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
            raise SpecError(f"field {key_str(key)!r} (env id): expected an integer dtype, got {value.dtype}")
        env = value.detach().cpu().reshape(n, -1)
        if env.shape[1] != 1:
            raise SpecError(
                f"field {key_str(key)!r} (env id): expected one id per item, got shape {tuple(value.shape)}"
            )
        arr = env.numpy()[:, 0].astype(np.int64)
        limit = self.num_envs if self.num_envs is not None else MAX_ENV_ID
        if arr.size and (arr.min() < 0 or arr.max() >= limit):
            bad = int(arr[(arr < 0) | (arr >= limit)][0])
            raise SpecError(f"field {key_str(key)!r} (env id): expected ids in [0, {limit}), got {bad}")
        return arr

    # -- queries -----------------------------------------------------------------
    def _slots(self, ids: Any, check: bool = True) -> np.ndarray:
        arr = _ids(ids)
        ring = self._ring
        if check and arr.size and (arr.min() < ring.first_id or arr.max() >= ring.next_id):
            bad = int(arr[(arr < ring.first_id) | (arr >= ring.next_id)][0])
            raise StaleIndexError(
                f"ids: item {bad} is not live (live items: {ring.first_id} .. {ring.next_id - 1})"
            )
        return arr % ring.capacity

    def env(self, ids: Any) -> np.ndarray:
        """The env of each item (int64)."""
        return self._env[self._slots(ids)]

    def terminated(self, ids: Any) -> np.ndarray:
        """Whether each item ends its episode by termination (no bootstrap)."""
        return self._term[self._slots(ids)]

    def truncated(self, ids: Any) -> np.ndarray:
        """Whether each item ends its episode by truncation (bootstrap from its next obs)."""
        return self._trunc[self._slots(ids)]

    def is_end(self, ids: Any) -> np.ndarray:
        """Whether each item is the last of its episode (``terminated | truncated``)."""
        slots = self._slots(ids)
        return self._term[slots] | self._trunc[slots]

    def episode_start(self, ids: Any) -> np.ndarray:
        """The id of the first item of each item's episode (may be below ``first_id``:
        overwritten since)."""
        return self._start[self._slots(ids)]

    def predecessors(self, ids: Any) -> np.ndarray:
        """The previous item in the same episode, or ``-1`` (episode start, or overwritten)."""
        slots = self._slots(ids)
        prev = self._prev[slots]
        same = (prev >= self._ring.first_id) & (self._start[slots] != _ids(ids))
        return np.where(same, prev, -1)

    def successors(self, ids: Any, k: int = 1) -> np.ndarray:
        """The item ``k`` steps later in the same episode, or ``-1`` where the episode
        ends first or that step has not been written yet."""
        k = check_positive_int("k", k)
        win, valid = self.window(ids, k + 1)
        return np.where(valid[:, k], win[:, k], -1)

    def window(self, ids: Any, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``ids`` and the ``n - 1`` items after each in the same episode.

        Returns:
            ``(window, valid)``, both ``[B, n]``: ``window[:, 0]`` is ``ids``;
            ``window[:, j]`` is the item ``j`` steps later, or ``-1`` (``valid`` False)
            once the episode has ended (the ending item is still valid) or the step is
            not written yet. ``valid`` is a prefix in every row.

        Raises:
            StaleIndexError: an id that is not live.
        """
        n = check_positive_int("n", n)
        return self.window_of_slots(self._slots(ids), _ids(ids), n)

    def window_of_slots(self, slots: np.ndarray, ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`window` for live items given as ``(slots, ids)`` (not checked: the
        sampler's hot path)."""
        b = ids.shape[0]
        win = np.full((b, n), -1, dtype=np.int64)
        valid = np.zeros((b, n), dtype=bool)
        win[:, 0], valid[:, 0] = ids, True
        cur, ok = slots, np.ones(b, dtype=bool)
        for j in range(1, n):
            nxt = self._next[cur]
            ok = ok & (nxt >= 0) & ~(self._term[cur] | self._trunc[cur])
            win[:, j] = np.where(ok, nxt, -1)
            valid[:, j] = ok
            cur = np.where(ok, nxt, 0) % self._ring.capacity
        return win, valid

    # -- unchecked per-slot reads for samplers and storages (sequences, frames) ----
    @property
    def lockstep(self) -> int | None:
        """``num_envs`` when an env's next item is always ``num_envs`` ids later
        (lockstep mode, no env field), else ``None``."""
        if self._resolved is None or self._resolved[2] is not None:
            return None
        return self.num_envs

    def links(self) -> SlotLinks:
        """The per-slot arrays themselves (views, read-only by contract), for hot paths
        that index them by slot without the liveness checks of the queries above."""
        return SlotLinks(self._env, self._prev, self._next, self._start, self._term, self._trunc)

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Per-slot arrays of the live slots ``[0, size)`` and per-env state (NumPy)."""
        size = self._ring.size
        return {
            "num_envs": self.num_envs,
            "env": self._env[:size].copy(),
            "prev": self._prev[:size].copy(),
            "next": self._next[:size].copy(),
            "start": self._start[:size].copy(),
            "terminated": self._term[:size].copy(),
            "truncated": self._trunc[:size].copy(),
            "last_id": self._last_id.copy(),
            "last_end": self._last_end.copy(),
            "cur_start": self._cur_start.copy(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (the ring is loaded first)."""
        if state["num_envs"] != self.num_envs:
            raise SpecError(f"episodes: state has num_envs={state['num_envs']}, this buffer {self.num_envs}")
        size = len(state["env"])
        for name, arr in (
            ("env", self._env),
            ("prev", self._prev),
            ("next", self._next),
            ("start", self._start),
        ):
            arr[:size] = np.asarray(state[name], dtype=np.int64)
        self._term[:size] = np.asarray(state["terminated"], dtype=bool)
        self._trunc[:size] = np.asarray(state["truncated"], dtype=bool)
        self._last_id = np.array(state["last_id"], dtype=np.int64)
        self._last_end = np.array(state["last_end"], dtype=bool)
        self._cur_start = np.array(state["cur_start"], dtype=np.int64)

    def __repr__(self) -> str:
        return f"EpisodeIndex(num_envs={self.num_envs}, keys={self.keys})"


def _grow(arr: np.ndarray, width: int, fill: Any) -> np.ndarray:
    if arr.shape[0] >= width:
        return arr
    out = np.full(width, fill, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


def _flag(flat: dict[NestedKey, torch.Tensor], key: NestedKey | None, n: int) -> np.ndarray:
    if key is None:
        return np.zeros(n, dtype=bool)
    value = flat[key].detach().cpu().reshape(n, -1)
    if value.shape[1] != 1:
        raise SpecError(
            f"field {key_str(key)!r}: expected one episode-end flag per item, got {value.shape[1]}"
        )
    return value.numpy()[:, 0] != 0


def _ids(ids: Any) -> np.ndarray:
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    return arr.reshape(-1).astype(np.int64, copy=False)
