"""What one write does to a FrameStorage: the checks, and the side-store changes.

Pure planning over the batch, the episode plan of the write and the index of what is
stored: it decides, before anything is written, whether the batch obeys the frame-stack
rules, and which items need a frame or a whole stack kept aside. See
:mod:`xpbank.storage.frames` for the rules. The storage is seen through
:class:`FrameSource`, the few parts of it the planning reads.

:func:`plan_frames` plans any write; :func:`plan_step` is the vector-env step (one item
of each of ``E`` envs in lockstep, the ring holding at least ``stack`` steps): every
predecessor is the id ``E`` before, every item is its env's newest, so stacks and the
stacks to keep aside are arithmetic on ids, and the checks are
:func:`~xpbank.storage.frame_check.step_obeys` (one compiled pass with numba). It
returns the same :class:`FrameWrite` as :func:`plan_frames` (``tests/test_frames_step.py``
compares what the two store on streams with episode ends and ring wraps), or ``None``
where the batch is not such a step or fails a check: :func:`plan_frames` then plans it,
or raises.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.spec.keys import NestedKey, key_str
from xpbank.storage.dtypes import to_numpy
from xpbank.storage.frame_check import step_obeys, step_words
from xpbank.storage.frame_pool import SlotPool
from xpbank.storage.frame_step import StepWrite, compiled_write
from xpbank.storage.frame_table import FrameTable, walk_stacks

if TYPE_CHECKING:
    from xpbank.ring.episodes import _Plan
    from xpbank.ring.ids import Ring

__all__ = ["FrameSource", "FrameWrite", "plan_frames", "plan_step"]


class FrameSource(Protocol):
    """What :func:`plan_frames` reads of a :class:`~xpbank.FrameStorage`: its layout, its
    stacks kept aside, and the stored stacks of live items."""

    capacity: int
    stack: int
    pad: str
    obs_key: NestedKey
    next_key: NestedKey | None
    _stacks: SlotPool
    _last: SlotPool
    _np_frames: np.ndarray
    verify: bool

    def _frame_table(self) -> FrameTable: ...

    def _read(self, slots: np.ndarray, want_obs: bool, want_next: bool) -> list[torch.Tensor]: ...


@dataclass
class FrameWrite:
    """The side-store changes of one write (ids are item ids, rows batch rows)."""

    ids: np.ndarray  # the batch's ids
    overwritten: np.ndarray  # slots the batch overwrites
    resolved: np.ndarray  # stored items whose successor arrives now (their next frame is no longer aside)
    last_rows: np.ndarray  # rows whose next frame goes aside: episode ends, each env's newest
    rescue_rows: np.ndarray  # rows whose stack reaches frames that will not be stored
    rescue_old: np.ndarray  # stored items whose stack reaches frames this write overwrites
    kept_rows: np.ndarray  # rows stored (a batch over capacity keeps its tail)
    stack_ids: np.ndarray  # [kept, stack] ids of the kept rows' stack frames, oldest first
    pad: np.ndarray  # [kept, stack] which of them are padding
    linked: np.ndarray  # slots of stored items whose successor arrives now ...
    successors: np.ndarray  # ... and the successors' slots


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` (same shape and dtype) are equal everywhere: NumPy's
    ``array_equal`` (~12 µs for a step of 8 Atari stacks, where ``torch.equal`` takes
    ~120 µs and a per-row ``!=``/``any`` ~190 µs)."""
    return bool(np.array_equal(to_numpy(a), to_numpy(b)))


def _differs(a: torch.Tensor, b: torch.Tensor) -> np.ndarray:
    """Per row: whether ``a`` and ``b`` differ anywhere (one :func:`_same` when none does)."""
    if a.shape[0] == 0 or _same(a, b):
        return np.zeros(a.shape[0], dtype=bool)
    return (a != b).reshape(a.shape[0], -1).any(dim=1).numpy()


def _fail(st: FrameSource, key: NestedKey | None, row: int, env: int, what: str) -> SpecError:
    return SpecError(
        f"field {key_str(key or '?')!r} (FrameStorage): item {row} of the batch (env {env}) {what}; "
        "each frame is stored once, so it could not be returned bit-for-bit. Nothing was written."
    )


def check_frames(
    st: FrameSource, ring: Ring, obs: torch.Tensor, nxt: torch.Tensor | None, plan: _Plan, n: int
) -> None:
    """The frame-stack rules of a batch (``obs``/``nxt`` as ``[n, stack, *frame]``):
    what :func:`plan_frames` checks when the storage verifies its writes.

    Raises:
        SpecError: the first rule broken, naming the batch row and its env.
    """
    c, s = st.capacity, st.stack
    first_new = ring.next_id
    start = plan.start == plan.ids

    if nxt is not None and s > 1:  # next obs = obs shifted by one frame
        bad = _differs(nxt[:, :-1], obs[:, 1:])
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise _fail(st, st.next_key, r, int(plan.env[r]), "is not its observation shifted by one frame")
    if s > 1 and start.any():  # an episode's first stack: padding, then its first frame
        first = torch.from_numpy(np.flatnonzero(start))
        head = obs.index_select(0, first)
        pad = head[:, -1:].expand_as(head[:, :-1]) if st.pad == "repeat" else torch.zeros_like(head[:, :-1])
        bad = _differs(head[:, :-1], pad)
        if bad.any():
            r = int(first[int(np.flatnonzero(bad)[0])])
            raise _fail(
                st, st.obs_key, r, int(plan.env[r]), f"starts an episode but is not {st.pad!r}-padded"
            )
    # a step's observation is the previous step's next observation (same env and episode)
    follow = ~start & (plan.prev >= ring.first_id)
    in_batch = follow & (plan.prev >= first_new)
    stored = follow & ~in_batch
    expected = torch.empty((n, *obs.shape[1:]), dtype=obs.dtype)
    if in_batch.any():
        src = torch.from_numpy(plan.prev[in_batch] - first_new)
        dst = torch.from_numpy(np.flatnonzero(in_batch))
        if nxt is not None:
            expected[dst] = nxt.index_select(0, src)
        else:
            expected[dst, :-1] = obs.index_select(0, src)[:, 1:]
            expected[dst, -1] = obs.index_select(0, dst)[:, -1]
    if stored.any():
        p = plan.prev[stored]
        dst = torch.from_numpy(np.flatnonzero(stored))
        if nxt is not None:
            expected[dst] = st._read(p % c, False, True)[0]
        else:
            stacks = st._read(p % c, True, False)[0]
            expected[dst, :-1] = stacks[:, 1:]
            expected[dst, -1] = obs.index_select(0, dst)[:, -1]
    check = np.flatnonzero(follow)
    bad = _differs(
        obs.index_select(0, torch.from_numpy(check)), expected.index_select(0, torch.from_numpy(check))
    )
    if bad.any():
        r = int(check[int(np.flatnonzero(bad)[0])])
        raise _fail(
            st, st.obs_key, r, int(plan.env[r]), "is not the next observation of its env's previous step"
        )


def plan_frames(
    st: FrameSource, ring: Ring, obs: torch.Tensor, nxt: torch.Tensor | None, plan: _Plan, n: int
) -> FrameWrite:
    """Check the batch (``obs``/``nxt`` as ``[n, stack, *frame]``; when the storage
    verifies its writes) and plan the write.

    Raises:
        SpecError: the batch breaks a frame-stack rule (nothing has been changed).
    """
    links = ring.episodes.links()  # type: ignore[union-attr]
    c, s = st.capacity, st.stack
    first_new = ring.next_id
    new_first = first_new + n - min(ring.size + n, c)  # oldest live id after the write
    ids = plan.ids
    rows = np.arange(n)
    start = plan.start == ids

    if st.verify:
        check_frames(st, ring, obs, nxt, plan, n)
    kept = rows >= n - min(n, c)
    ends = plan.terminated | plan.truncated
    newest = np.zeros(n, dtype=bool)
    newest[plan.env_state[1] - first_new] = True
    last_rows = np.flatnonzero(kept & (ends | newest))
    resolved = plan.prev[~start & (plan.prev >= new_first) & (plan.prev < first_new)]

    def prev_of(x: np.ndarray) -> np.ndarray:
        here = x >= first_new
        return np.where(here, plan.prev[np.clip(x - first_new, 0, n - 1)], links.prev[x % c])

    def start_of(x: np.ndarray) -> np.ndarray:
        here = x >= first_new
        return np.where(here, plan.start[np.clip(x - first_new, 0, n - 1)], links.start[x % c])

    # each new item's stack; those reaching an item that will not be stored are rescued
    stack_ids, padding = walk_stacks(ids, s, prev_of, start_of, new_first)
    rescue = kept & (stack_ids[:, 0] < new_first)
    linked = ~start & (plan.prev >= new_first)  # predecessors whose next frame arrives now
    # stored items that survive this write but whose stack reaches items it overwrites
    dying = np.arange(ring.first_id, min(new_first, first_new), dtype=np.int64)
    rescue_old = np.zeros(0, dtype=np.int64)
    if s > 1 and dying.size:
        win, steps = ring.episodes.walk(dying, s)  # type: ignore[union-attr]
        after = win[:, 1:][np.arange(1, s) < steps[:, None]]
        after = np.unique(after[(after >= new_first) & (after < first_new)])
        rescue_old = after[~st._stacks.has(after % c)]
    overwritten = ids[kept] % c
    stored = np.flatnonzero(kept)
    return FrameWrite(
        ids, overwritten, resolved, last_rows, np.flatnonzero(rescue), rescue_old,
        stored, stack_ids[stored], padding[stored], plan.prev[linked] % c, ids[linked] % c,
    )  # fmt: skip


def plan_step(
    st: FrameSource,
    ring: Ring,
    obs: torch.Tensor | np.ndarray,
    nxt: torch.Tensor | np.ndarray | None,
    plan: _Plan,
    n: int,
) -> FrameWrite | StepWrite | None:
    """:func:`plan_frames` for one lockstep step of ``n`` envs, or ``None`` (not such a
    step, or a check fails: :func:`plan_frames` then says which). With numba, a
    :class:`~xpbank.storage.frame_step.StepWrite` instead: the checked step, which
    :func:`~xpbank.storage.frame_step.apply_step` writes in one compiled call.

    Few NumPy calls, as each costs a microsecond or more: every predecessor is the id
    ``n`` before (``plan.step``), ``plan.fresh`` says which items start an episode, and
    the ring holds ``stack`` steps or more, so no item this write overwrites is a
    predecessor or in a new item's stack.
    """
    c, s, size = st.capacity, st.stack, ring.size
    start = plan.fresh  # the items that start an episode
    if start is None or plan.step != n or nxt is None or min(size + n, c) < max(s, 2) * n:
        return None  # stacks or predecessors could be items this write overwrites: the general plan
    ids, prev, first_new = plan.ids, plan.prev, ring.next_id
    begins = bool(start.any())
    follow = ~start if begins else slice(None)
    slots = prev[follow] % c  # the predecessors (all live: see above)
    o = obs if type(obs) is np.ndarray else to_numpy(obs)  # type: ignore[arg-type]  # arrays: the write fast path's
    x = nxt if type(nxt) is np.ndarray else to_numpy(nxt)  # type: ignore[arg-type]
    obeys = not st.verify or step_obeys(st, o, x, start if begins else None, slots)
    views = step_words(st, o, x) if obeys and compiled_write() else None  # as the check's
    st.__dict__.pop("_step_views", None)  # step_words' answer kept for this call: it holds the step
    if not obeys:
        return None
    if views is not None:  # one compiled call writes the step
        return StepWrite(o, x, views, plan, first_new, ring.first_id, size)
    # each new item's stack: the ids 0 .. s - 1 steps back, none before its episode's first
    walked = ids[:, None] - _steps_back(n, s)
    first = plan.start[:, None]
    rescue_old = _rescue(st, ring, n, first_new + n - min(size + n, c))
    linked = prev[follow]
    rows = np.arange(n)
    return FrameWrite(
        ids, ids % c, linked, rows, rows[:0], rescue_old, rows, np.maximum(walked, first),
        walked < first, slots, ids[follow] % c,
    )  # fmt: skip


@functools.lru_cache(maxsize=64)
def _steps_back(n: int, s: int) -> np.ndarray:
    """``[[(s - 1) n, ..., n, 0]]``: how far back each column of a lockstep stack is
    (read-only: cached)."""
    out = (n * np.arange(s - 1, -1, -1, dtype=np.int64))[None, :]
    out.flags.writeable = False
    return out


def _rescue(st: FrameSource, ring: Ring, n: int, new_first: int) -> np.ndarray:
    """The stored items that survive a lockstep step but whose stack reaches an item it
    overwrites (ids ``[first_id, new_first)``), not kept aside yet: the items up to
    ``stack - 1`` steps after each, in its episode (started no later), in id order (all
    written before this step: the ring holds ``stack`` steps or more)."""
    dying = np.arange(ring.first_id, new_first, dtype=np.int64)
    if st.stack == 1 or dying.shape[0] == 0:
        return dying[:0]
    after = dying + _steps_back(n, st.stack)[0, -2::-1, None]  # [s - 1, dying]: 1 .. s - 1 steps on
    slots = after % st.capacity
    starts = ring.episodes.links().start  # type: ignore[union-attr]
    return after[(starts.take(slots) <= dying) & (st._stacks.index.take(slots) < 0)]
