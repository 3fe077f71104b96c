"""One lockstep step's write into a FrameStorage, in one compiled call.

:func:`~xpbank.storage.frame_write.plan_step` checks a step of ``E`` envs in lockstep
(the checks stay there: :func:`~xpbank.storage.frame_check.step_obeys`); the write that
follows changes, per item, a few rows of the frame table, a few entries of the side
stores and one frame, each a NumPy call of a microsecond or more on a handful of rows.
With numba (the ``fast`` extra), :func:`step_kernel` does all of it in one call, in the
order :meth:`FrameStorage.prepare_write <xpbank.FrameStorage.prepare_write>` applies a
:class:`~xpbank.storage.frame_write.FrameWrite` and then
:meth:`~xpbank.FrameStorage.write` stores the newest frames:

1. the stacks kept aside (``_stacks``) of the stored items that survive the step but
   whose stack reaches an item it overwrites (``frame_write._rescue``'s items, in its
   order), their table rows marked;
2. the next frames kept aside (``_last``) of the overwritten slots and of the
   predecessors dropped, the stacks kept aside of the overwritten slots dropped;
3. each new item's next frame kept aside, its table row (its stack, padding), its
   predecessor's row linked to it, and its newest frame stored in the frame array.

Of the step it reads the newest frame of each observation (the check has just read it:
from cache) and of each next observation. The NumPy path (``FrameWrite``) is the reference: the kernel leaves
the same frames, table and side-store contents per slot (``tests/test_frame_step.py``;
which free entry a side store hands out may differ, which nothing reads).

A side store too small for the step is grown first, by the rule
:meth:`SlotPool.put <xpbank.storage.frame_pool.SlotPool.put>` follows: the kernel's
first pass only counts (it changes nothing) and says how many entries it needs.

Example:
    >>> positions(np.int64(9), 8, 10), positions(np.int64(9), 1, 10)
    (11, 9)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from xpbank import _jit
from xpbank.storage.dtypes import to_numpy
from xpbank.storage.frame_check import FrameSource, held_words, step_words

if TYPE_CHECKING:
    from xpbank.ring.episodes import _Plan
    from xpbank.ring.ids import Ring

__all__ = [
    "PickledWithoutViews", "StepTarget", "StepWrite", "apply_step", "compiled_write", "copy", "positions",
    "step_kernel",
]  # fmt: skip

_VIEWS = ("_np_frames", "_frame_words", "_step_views")  # FrameStorage's NumPy views and their caches


class PickledWithoutViews:
    """FrameStorage's pickling (SB3's ``save_replay_buffer`` pickles the buffer): its
    NumPy views of the frame tensor (and the word views cached by the checks and this
    module's write) are left out, as a pickled view comes back as a private copy that
    writes would go to and reads would not; they are made again on arrival."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in _VIEWS}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if "_frames" in state:
            self.__dict__["_np_frames"] = to_numpy(state["_frames"])


class StepTarget(FrameSource, Protocol):
    """What :func:`apply_step` reaches of a :class:`~xpbank.FrameStorage`: what the
    checks read, and the ring it is attached to."""

    def _links_ring(self) -> Ring: ...


@dataclass
class StepWrite:
    """A checked lockstep step, written by :func:`apply_step` (``plan_step``'s answer
    where the kernel runs): ``obs`` / ``nxt`` as ``[n, stack, *frame]`` arrays."""

    obs: np.ndarray
    nxt: np.ndarray
    views: tuple[int, np.ndarray, np.ndarray]  # frame_check.step_words of obs and nxt
    plan: _Plan
    first_new: int  # the ring's next id before the step
    first_id: int  # its oldest live id
    size: int  # and its size


def positions(slot: np.int64, envs: int, rows: int) -> int:
    """Where slot ``slot``'s frame is (``FrameTable.positions`` of one slot)."""
    if envs == 1:
        return int(slot)
    return int(slot % envs * rows + slot // envs)


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[:] = src`` for 1-D word arrays of one length (a loop the compiler vectorizes)."""
    for k in range(src.shape[0]):
        dst[k] = src[k]


def step_kernel(
    o: np.ndarray,
    x: np.ndarray,
    first_new: int,
    first_id: int,
    size: int,
    start: np.ndarray,
    prev: np.ndarray,
    fresh: np.ndarray,
    ep_start: np.ndarray,
    frames: np.ndarray,
    src: np.ndarray,
    envs: int,
    rows: int,
    zero_pad: bool,
    last: np.ndarray,
    last_at: np.ndarray,
    last_free: np.ndarray,
    last_nfree: int,
    kept: np.ndarray,
    kept_at: np.ndarray,
    kept_free: np.ndarray,
    kept_nfree: int,
) -> tuple[int, int, int, int]:
    """The step's write on words (``o``, ``x`` ``[n, stack, w]``, ``frames`` and ``last``
    ``[*, w]``, ``kept`` ``[*, stack * w]``); ``start``/``prev``/``fresh`` the plan's,
    ``ep_start`` the episode index's per-slot episode starts.

    Returns ``(0, last_nfree, kept_nfree, 0)`` once written, or ``(1, need_last,
    need_kept, 0)`` with nothing changed: the side stores need that many free entries
    (``need_last`` before the step's drops give theirs back).
    """
    n, s = o.shape[0], o.shape[1]
    c = src.shape[0]
    w = o.shape[2]
    new_first = first_new + n - min(size + n, c)  # the oldest live id after the step
    # pass 1, counting: the stacks to keep aside and the next frames dropped
    rescue = 0
    if s > 1:
        for k in range(1, s):
            for d in range(first_id, new_first):
                a = (d + k * n) % c
                if ep_start[a] <= d and kept_at[a] < 0:
                    rescue += 1
    freed = 0
    for i in range(n):
        if last_at[(first_new + i) % c] >= 0:
            freed += 1
        if not fresh[i] and last_at[prev[i] % c] >= 0:
            freed += 1
    if rescue > kept_nfree or n > last_nfree + freed:
        return 1, n - freed, rescue, 0
    # pass 2: stacks kept aside, whole, before this step overwrites their older frames
    if s > 1:
        for k in range(1, s):
            for d in range(first_id, new_first):
                a = (d + k * n) % c
                if ep_start[a] <= d and kept_at[a] < 0:
                    kept_nfree -= 1
                    e = kept_free[kept_nfree]
                    kept_at[a] = e
                    for j in range(s):
                        copy(kept[e, j * w : (j + 1) * w], frames[src[a, j]])
                    src[a, 0] = -1
    # next frames and stacks aside of the overwritten slots and the linked predecessors
    for i in range(n):
        q = (first_new + i) % c
        if last_at[q] >= 0:
            last_free[last_nfree] = last_at[q]
            last_nfree += 1
            last_at[q] = -1
        if kept_at[q] >= 0:
            kept_free[kept_nfree] = kept_at[q]
            kept_nfree += 1
            kept_at[q] = -1
    for i in range(n):
        p = prev[i] % c
        if not fresh[i] and last_at[p] >= 0:
            last_free[last_nfree] = last_at[p]
            last_nfree += 1
            last_at[p] = -1
    # the new items: next frame aside, table row, predecessor linked, newest frame stored
    for i in range(n):
        x_id = first_new + i
        q = x_id % c
        last_nfree -= 1
        e = last_free[last_nfree]
        last_at[q] = e
        copy(last[e], x[i, s - 1])
        for j in range(s):
            walked = x_id - (s - 1 - j) * n
            if walked < start[i]:
                src[q, j] = c if zero_pad else positions(start[i] % c, envs, rows)
            else:
                src[q, j] = positions(walked % c, envs, rows)
        src[q, s] = -1
        here = positions(q, envs, rows)
        if not fresh[i]:
            src[prev[i] % c, s] = here
        copy(frames[here], o[i, s - 1])
    return 0, last_nfree, kept_nfree, 0


_compiled = _jit.compile_kernels(step_kernel, helpers=(positions, copy))


def compiled_write() -> bool:
    """Whether :func:`apply_step` runs (numba is installed)."""
    return _compiled is not None


def apply_step(st: StepTarget, todo: StepWrite) -> bool:
    """Write a checked lockstep step (what ``prepare_write`` and ``write`` do with its
    ``FrameWrite``), growing the side stores first where they are too small; ``False``:
    nothing written (a grown store cannot be viewed as words: the NumPy path's turn)."""
    plan = todo.plan
    table = st._frame_table()
    starts = st._links_ring().episodes.links().start  # type: ignore[union-attr]
    width, o, x = todo.views
    while True:
        last, kept = st._last, st._stacks
        code, a, b, _ = _compiled[0](  # type: ignore[index]
            o, x, todo.first_new, todo.first_id, todo.size, plan.start, plan.prev, plan.fresh, starts,
            held_words(st, width), table.src, table.envs, table.rows, st.pad == "zero",
            last.words(width), last.index, last.free, last.nfree,
            kept.words(width), kept.index, kept.free, kept.nfree,
        )  # fmt: skip
        if code == 0:
            last.nfree, kept.nfree = a, b
            return True
        last.reserve(a)  # the rule of SlotPool.put; the new stores' views are made again
        kept.reserve(b)
        views = step_words(st, todo.obs, todo.nxt)
        if views is None:
            return False
        width, o, x = views
