"""Episodes and environments of the items in a ring: the index n-step and sequences read.

A replay buffer fed by ``E`` vector environments interleaves their steps, and each env
ends its episodes on its own steps. :class:`EpisodeIndex` keeps, per slot, what is
needed to follow one env's stream through the ring without scanning at sample time:

- ``env``: the env the item came from;
- ``prev``: the id of the item before it in the same env (``-1``: none);
- ``next``: the id of the item after it in the same episode (``-1``: the episode ended
  here, or the next step is not written yet);
- ``terminated`` / ``truncated`` (and ``is_end``, their or): whether the item ends its
  episode, read from the batch when it is written;
- ``start``: the id of the first item of its episode.

``terminated`` and ``truncated`` are the two columns of one ``[capacity, 2]`` array
(``flags``), so one two-byte read tells whether a slot ends its episode and how: in
lockstep mode that and the ring's ``next_id`` say where a window stops, without ``next``
(the n-step kernel's read, :mod:`xpbank.nstep.kernel`).

Which env an item came from: with ``num_envs=E`` each ``extend`` of ``k * E`` items is
``k`` steps of every env, time-major (item ``i`` is env ``i % E``); with a per-item
``env_id`` field the field says so (for data that does not arrive in lockstep); with
neither, the items are one stream (env 0).

Maintenance is O(1) per item, vectorized per call (a stable sort by env of the batch).
Only ids are stored, so the ring's id rules tell what is still live: an item's ``prev``
(or its episode's ``start``) that has been overwritten is below ``ring.first_id``.
``next`` of a live item is always live (a successor is newer).

A write is planned from each env's state (:mod:`~xpbank.ring.episode_plan`) and recorded
in the per-slot arrays (:mod:`~xpbank.ring.episode_slots`) once it has gone through; this
module keeps that state and answers the queries.

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

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, StaleIndexError, check_positive_int
from xpbank.ring.episode_keys import MAX_ENV_ID, EpisodeKeys, read_env_ids, read_flag, wants_episodes
from xpbank.ring.episode_pickle import PickledIndex
from xpbank.ring.episode_plan import _Plan, empty_plan, grow, plan_by_env, plan_lockstep
from xpbank.ring.episode_slots import RingView, SlotLinks, as_array, as_ids, write_slots, write_slots_lockstep
from xpbank.spec.spec import NestedKey, Spec, key_str, normalize_key

__all__ = ["EpisodeIndex", "EpisodeKeys", "wants_episodes"]


class EpisodeIndex(PickledIndex):
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

    def __init__(self, ring: RingView, num_envs: int | None = None, keys: EpisodeKeys | None = None):
        self._ring = ring
        self.num_envs = None if num_envs is None else check_positive_int("num_envs", num_envs)
        self.keys = keys if keys is not None else EpisodeKeys()
        self._resolved: tuple[NestedKey | None, NestedKey | None, NestedKey | None] | None = None
        self._resolved_for: Spec | None = None
        # the per-slot arrays (never replaced: loads write into them)
        self._arrays = a = SlotLinks.allocate(ring.capacity)
        self._env, self._prev, self._next, self._start = a.env, a.prev, a.next, a.start
        self._flags, self._term, self._trunc = a.flags, a.terminated, a.truncated
        self._envs = np.arange(self.num_envs or 1, dtype=np.int64)
        self._tiled = self._envs  # the env of each item of a lockstep batch (cached per size)
        self._links = np.zeros(0, dtype=np.int64)  # apply's reused buffer of next links
        self._strides = np.zeros((0, 1), dtype=np.int64)  # walk_slots: (num_envs * arange(n))[:, None]
        # per-slot data that readers derive from the index and the stored items (n-step's
        # WindowTable), by their key; each has reset(), called when a state is loaded
        self.derived: dict[Any, Any] = {}
        self._reset_envs(self.num_envs or 1)

    def _reset_envs(self, n: int) -> None:
        self._last_id = np.full(n, -1, dtype=np.int64)  # each env's newest item
        self._last_end = np.zeros(n, dtype=bool)  # new with any of the four: see episode_step.state_address
        self._cur_start = np.full(n, -1, dtype=np.int64)
        self._fresh = np.ones(n, dtype=bool)  # lockstep: the env's next item starts an episode

    # -- writing ---------------------------------------------------------------
    def plan(self, flat: Mapping[NestedKey, Any], n: int, spec: Spec) -> _Plan:
        """Check a validated batch of ``n`` items and compute its index entries.

        Nothing changes until :meth:`apply`, so a bad batch leaves the buffer as it was.
        The fields are tensors, or NumPy arrays and numbers of the spec's dtypes (the
        write fast path's, :mod:`xpbank.replay.fast_write`).

        Raises:
            SpecError: a batch that is not whole env steps (lockstep), or a bad env id.
        """
        if self._resolved is None or self._resolved_for is not spec:
            self._resolved = (*self.keys.resolve(spec), self._env_key(spec))
            self._resolved_for = spec
        term_key, trunc_key, env_key = self._resolved
        env = self._env_ids(flat, n, env_key)
        if n == 0:
            return empty_plan()
        term = read_flag(flat, term_key, n)
        trunc = read_flag(flat, trunc_key, n)
        first = self._ring.next_id
        ids = np.arange(first, first + n, dtype=np.int64)
        if env_key is None:
            e = self.num_envs or 1
            return plan_lockstep(
                ids, env, term, trunc, e, self._envs, self._fresh, self._last_id, self._cur_start
            )
        width = int(env.max()) + 1
        if width > self._last_id.shape[0]:  # new envs start with no history: harmless if the write fails
            self._last_id = grow(self._last_id, width, -1)
            self._last_end = grow(self._last_end, width, False)
            self._cur_start = grow(self._cur_start, width, -1)
        return plan_by_env(ids, env, term, trunc, self._last_id, self._last_end, self._cur_start)

    def apply(self, plan: _Plan) -> None:
        """Record a planned write, after the ring has advanced past it."""
        envs, last_id, last_end, start = plan.env_state
        if envs.size == 0:
            return
        if envs is self._envs:  # lockstep: every env's state is new (fresh arrays)
            self._last_id, self._last_end, self._cur_start = last_id, last_end, start
            self._fresh = last_end
        else:
            self._last_id[envs], self._last_end[envs], self._cur_start[envs] = last_id, last_end, start
        if plan.step:
            buffer = write_slots_lockstep(self._arrays, plan, self._ring, self._links)
            if buffer is not None:
                self._links = buffer
                return
        write_slots(self._arrays, plan, self._ring)

    def clear(self) -> None:
        """Every item was dropped: the next item of each env starts an episode."""
        self._reset_envs(self._last_id.shape[0])

    def restart(self) -> None:
        """Every item was dropped and the ring's ids may have moved (an empty state
        without an index was loaded): the per-env state as after :meth:`clear`, and
        the derived data (n-step's kept windows, whose ids new items may reuse) reset."""
        self.clear()
        self._reset_derived()

    def _reset_derived(self) -> None:
        for derived in self.derived.values():
            derived.reset()

    def truncate_newest(self) -> np.ndarray:
        """End each env's open episode at its newest live item, as a truncation.

        For a stream cut from outside (an env reset between two training calls): the
        next item of each env then starts an episode. Only the index changes; the
        caller updates a stored ``truncated`` field itself. Returns the ids marked
        (envs whose newest item already ends an episode are left alone).

        Example:
            >>> import torch
            >>> from xpbank import ReplayBuffer
            >>> rb = ReplayBuffer(10, num_envs=2)
            >>> _ = rb.extend({"obs": torch.zeros(2, 1), "terminated": torch.tensor([False, True])})
            >>> rb.episodes.truncate_newest().tolist()
            [0]
            >>> _ = rb.extend({"obs": torch.zeros(2, 1), "terminated": torch.tensor([False, False])})
            >>> rb.episodes.truncated([0]).tolist(), rb.episodes.episode_start([2, 3]).tolist()
            ([True], [2, 3])
        """
        live = (self._last_id >= self._ring.first_id) & ~self._last_end
        ids = self._last_id[live]
        c = self._ring.capacity
        self._trunc[ids % c] = True
        self._next[ids % c] = -1
        self._last_end = self._last_end | live  # replaced, not mutated: a plan may hold it
        self._fresh = (self._last_id < 0) | self._last_end  # as loads do: shaped like last_id
        return ids

    def _env_key(self, spec: Spec) -> NestedKey | None:
        key = normalize_key(self.keys.env)
        return key if key in spec else None

    def _env_ids(self, flat: Mapping[NestedKey, Any], n: int, key: NestedKey | None) -> np.ndarray:
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
            if self._tiled.shape[0] != n:
                self._tiled = np.tile(self._envs, n // self.num_envs)
            return self._tiled
        limit = self.num_envs if self.num_envs is not None else MAX_ENV_ID
        value = flat[key]
        value = value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))
        return read_env_ids(value, key, n, limit)

    # -- queries -----------------------------------------------------------------
    def _slots(self, ids: Any, check: bool = True) -> np.ndarray:
        arr = as_ids(ids)
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
        same = (prev >= self._ring.first_id) & (self._start[slots] != as_ids(ids))
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
        self._slots(ids)  # checks liveness
        walked, steps = self.walk(as_ids(ids), n)
        valid = np.arange(n) < steps[:, None]
        return np.where(valid, walked, -1), valid

    def walk(self, ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to ``n - 1`` steps forward in each live item's episode (not checked: the
        samplers' hot path).

        Returns:
            ``(walked, steps)``: ``walked[:, j]`` is the item ``j`` steps after ``ids``, or
            the last valid one where the window ended earlier (``[B, n]`` int64 ids, a
            transposed view of a step-major ``[n, B]`` array); ``steps`` is the window's
            length ``k`` (int64).
        """
        if self.lockstep is not None:  # the window's ids from its length
            e = self.lockstep
            _, steps = self.walk_slots(ids, n)
            ahead = np.minimum(np.arange(n, dtype=np.int64)[:, None], steps - 1)
            return (ids + e * ahead).T, steps
        b, c = ids.shape[0], self._ring.capacity
        rows = np.empty((n, b), dtype=np.int64)  # step-major: each step is one contiguous row
        rows[0] = ids
        slots = np.empty(b, dtype=np.int64)
        for j in range(1, n):
            np.remainder(rows[j - 1], c, out=slots)
            np.take(self._next, slots, out=rows[j], mode="wrap")  # "raise" would buffer `out`
            # a successor's id is larger than the item's, and -1 (ended, or not written
            # yet) smaller: the max steps forward or stays on the window's last item
            np.maximum(rows[j], rows[j - 1], out=rows[j])
        steps = np.count_nonzero(rows[1:] != rows[:-1], axis=0) + 1
        return rows.T, steps

    def walk_slots(self, ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`walk` as slots: ``(slots, steps)``, ``slots`` step-major ``[n, B]`` (not
        checked: n-step sampling's hot path).

        In lockstep mode an env's next item is ``num_envs`` ids later, so the window's
        slots are computed, not followed: one lookup of ``next`` for all of them says
        where each window stops: at its first step with no next item in its episode (the
        episode ended there, or the next step is not written yet; the slots after it may
        hold older items, whose links are never looked at).
        """
        e, c = self.lockstep, self._ring.capacity
        if e is None:
            walked, steps = self.walk(ids, n)
            return walked.T % c, steps
        if self._strides.shape[0] != n:
            self._strides = (e * np.arange(n, dtype=np.int64))[:, None]
        slots = ids + self._strides
        np.remainder(slots, c, out=slots)
        ends = np.ones(slots.shape, dtype=bool)  # the last row: a window has at most n steps
        np.less(self._next.take(slots[:-1]), 0, out=ends[:-1])
        last = ends.argmax(axis=0)  # each window's last step: the first that ends it
        for j in range(1, n):  # stay on the window's last item
            np.copyto(slots[j], slots[j - 1], where=last < j)
        return slots, last + 1

    def terminated_of_slots(self, slots: np.ndarray) -> np.ndarray:
        """:meth:`terminated` for live slots (not checked: the sampler's hot path)."""
        return self._term[slots]

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
        return SlotLinks(self._env, self._prev, self._next, self._start, self._term, self._trunc, self._flags)

    # -- state -----------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Per-slot arrays of the live slots ``[0, size)`` and per-env state, as CPU
        tensors (safe for ``torch.load(weights_only=True)``)."""
        size = self._ring.size
        return {
            "num_envs": self.num_envs,
            "env": torch.from_numpy(self._env[:size].copy()),
            "prev": torch.from_numpy(self._prev[:size].copy()),
            "next": torch.from_numpy(self._next[:size].copy()),
            "start": torch.from_numpy(self._start[:size].copy()),
            "terminated": torch.from_numpy(self._term[:size].copy()),
            "truncated": torch.from_numpy(self._trunc[:size].copy()),
            "last_id": torch.from_numpy(self._last_id.copy()),
            "last_end": torch.from_numpy(self._last_end.copy()),
            "cur_start": torch.from_numpy(self._cur_start.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (the ring is loaded first)."""
        if state["num_envs"] != self.num_envs:
            raise SpecError(f"episodes: state has num_envs={state['num_envs']}, this buffer {self.num_envs}")
        self._reset_derived()
        size = len(state["env"])
        for name, arr in (
            ("env", self._env),
            ("prev", self._prev),
            ("next", self._next),
            ("start", self._start),
            ("terminated", self._term),
            ("truncated", self._trunc),
        ):
            arr[:size] = as_array(state[name], arr.dtype)
        self._last_id = as_array(state["last_id"], np.int64).copy()
        self._last_end = as_array(state["last_end"], bool).copy()
        self._cur_start = as_array(state["cur_start"], np.int64).copy()
        self._fresh = (self._last_id < 0) | self._last_end

    def __repr__(self) -> str:
        return f"EpisodeIndex(num_envs={self.num_envs}, keys={self.keys})"
