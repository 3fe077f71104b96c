"""Whether one lockstep step obeys FrameStorage's frame-stack rules: the checks of
:func:`~xpbank.storage.frame_write.plan_step`.

A step of ``E`` envs (``obs`` and ``next obs`` as ``[E, stack, *frame]`` arrays) obeys
the rules when each next observation is its observation shifted by one frame, each
episode's first stack is padded as the storage says, and every other observation is
its env's previous next observation as stored (the newest frame in the storage's
``_last`` side store, the older ones in its frame array). :func:`step_obeys` says yes
or no; the caller then plans the write, or hands the batch to the general plan, which
says which rule broke.

The NumPy path is the reference: one comparison per rule, each a pass over up to
``E * stack`` frames plus a gathered copy of the stored frames (~80 µs for a step of 8
Atari stacks, most of it reading the step's ~450 KB from memory and the comparisons'
temporary arrays). With numba (the ``fast`` extra), :func:`step_kernel` does every
comparison in one pass, row by row, on machine words and without copies (~2x faster on
that step). It runs where the frames are integers (bit equality is then value
equality: float frames keep NumPy's comparison, where ``-0.0 == 0.0``) and every array
is C-contiguous; both paths give the same answer (``tests/test_frame_check.py``).

Example:
    >>> import numpy as np
    >>> a = np.arange(16, dtype=np.uint8).reshape(2, 8)
    >>> words(a, 8).dtype, words(a, 8).shape
    (dtype('uint64'), (2, 1))
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from xpbank import _jit
from xpbank.storage.frame_pool import WORDS, SlotPool
from xpbank.storage.frame_table import FrameTable

__all__ = ["FrameSource", "aligned_words", "held_words", "step_kernel", "step_obeys", "step_words", "words"]


class FrameSource(Protocol):
    """What the checks read of a :class:`~xpbank.FrameStorage` (a part of
    :class:`~xpbank.storage.frame_write.FrameSource`)."""

    stack: int
    pad: str
    _last: SlotPool
    _stacks: SlotPool
    _np_frames: np.ndarray

    def _frame_table(self) -> FrameTable: ...


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two 1-D word arrays of one length are equal (a loop the compiler vectorizes:
    no early exit inside)."""
    diff = a[0] ^ b[0]
    for k in range(1, a.shape[0]):
        diff |= a[k] ^ b[k]
    return diff == 0


def zero(a: np.ndarray) -> bool:
    """Whether a 1-D word array is all zeros."""
    acc = a[0]
    for k in range(1, a.shape[0]):
        acc |= a[k]
    return acc == 0


def step_kernel(
    o: np.ndarray,
    x: np.ndarray,
    start: np.ndarray,
    slots: np.ndarray,
    frames: np.ndarray,
    src: np.ndarray,
    last: np.ndarray,
    last_at: np.ndarray,
    zero_pad: bool,
) -> bool:
    """:func:`step_obeys` on words: ``o``, ``x`` ``[E, stack, w]``, ``frames`` and ``last``
    ``[*, w]``, ``src`` the frame table, ``last_at`` the ``_last`` store's index,
    ``slots`` the predecessors of the rows not in ``start``, in row order."""
    n, s = o.shape[0], o.shape[1]
    k = 0
    for i in range(n):
        for j in range(s - 1):  # next obs = obs shifted by one frame
            if not same(x[i, j], o[i, j + 1]):
                return False
        if start[i]:  # an episode's first stack: padding, then its first frame
            for j in range(s - 1):
                if not (zero(o[i, j]) if zero_pad else same(o[i, j], o[i, s - 1])):
                    return False
            continue
        p = slots[k]  # the previous step's next observation, as stored
        k += 1
        at = last_at[p]
        if at < 0 or not same(o[i, s - 1], last[at]):
            return False
        for j in range(s - 1):
            if not same(o[i, j], frames[src[p, j + 1]]):
                return False
    return True


_compiled = _jit.compile_kernels(step_kernel, helpers=(same, zero))


def words(a: np.ndarray, width: int) -> np.ndarray:
    """``a`` (C-contiguous, its last axes a whole number of ``width``-byte words) as
    ``[a.shape[0], words]`` unsigned words of ``width`` bytes (``a`` may have no rows)."""
    return a.reshape(a.shape[0], math.prod(a.shape[1:])).view(WORDS[width])


def step_obeys(
    st: FrameSource, o: np.ndarray, x: np.ndarray, start: np.ndarray | None, slots: np.ndarray
) -> bool:
    """Whether a lockstep step (``obs``, ``next obs`` as arrays; ``start``: the rows that
    begin an episode, ``None``: none does; ``slots``: the other rows' predecessors)
    obeys the frame-stack rules."""
    if _compiled is not None and o.dtype.kind in "iub" and o.shape[0] and st._last._np.shape[0]:
        views = step_words(st, o, x)
        if views is not None:
            width, ow, xw = views
            n = o.shape[0]
            return bool(
                _compiled[0](
                    ow, xw, np.zeros(n, dtype=bool) if start is None else start, slots,
                    held_words(st, width), st._frame_table().src, st._last.words(width),
                    st._last.index, st.pad == "zero",
                )
            )  # fmt: skip
    return _step_obeys_numpy(st, o, x, start, slots)


def aligned_words(a: np.ndarray, width: int) -> np.ndarray | None:
    """:func:`words` of ``a`` where it is C-contiguous and its start is a multiple of
    ``width`` (else ``None``)."""
    if not a.flags.c_contiguous:
        return None
    view = words(a, width)
    return view if view.flags.aligned else None


def held_words(st: FrameSource, width: int) -> np.ndarray | None:
    """The storage's frame array as words (made once per width: the array never moves)."""
    views = st.__dict__.setdefault("_frame_words", {})  # width -> (the array, its view)
    hit = views.get(width)
    if hit is None or hit[0] is not st._np_frames:
        hit = views[width] = (st._np_frames, aligned_words(st._np_frames, width))
    return hit[1]


def step_words(st: FrameSource, o: np.ndarray, x: np.ndarray) -> tuple[int, np.ndarray, np.ndarray] | None:
    """``(width, o, x)``: the step as ``[n, stack, w]`` words of the widest width that
    divides a frame's bytes and aligns the step, the frame array and the side stores
    (``None``: none does: an array is not C-contiguous, or a frame has no bytes)."""
    last, kept = st._last._np, st._stacks._np  # the answer depends on where these are
    seen = st.__dict__.get("_step_views")  # the check's answer, asked again by the write
    if seen is not None and seen[0] is o and seen[1] is x and seen[2] is last and seen[3] is kept:
        return seen[4]
    frame = o.itemsize * math.prod(o.shape[2:])
    n, s = o.shape[0], o.shape[1]
    views = None
    for width in (8, 4, 2, 1):
        if frame == 0 or frame % width:
            continue
        ow, xw = aligned_words(o, width), aligned_words(x, width)
        if ow is None or xw is None or held_words(st, width) is None:
            continue
        if st._last.words(width) is not None and st._stacks.words(width) is not None:
            views = width, ow.reshape(n, s, -1), xw.reshape(n, s, -1)
            break
    st.__dict__["_step_views"] = (o, x, last, kept, views)
    return views


def _step_obeys_numpy(
    st: FrameSource, o: np.ndarray, x: np.ndarray, start: np.ndarray | None, slots: np.ndarray
) -> bool:
    """:func:`step_obeys` in NumPy, one comparison per rule (the reference)."""
    s = st.stack
    if s > 1 and not np.array_equal(x[:, :-1], o[:, 1:]):  # next obs = obs shifted by one frame
        return False
    if start is not None and s > 1:  # an episode's first stack: padding, then its first frame
        head = o[start]
        pad = head[:, -1:] if st.pad == "repeat" else np.zeros_like(head[:, -1:])
        if not (head[:, :-1] == pad).all():
            return False
    # the previous step's next observation, as stored: the newest frame aside (each
    # was its env's newest), the others in the frame array
    before = o if start is None else o[~start]
    if slots.shape[0]:
        if not np.array_equal(before[:, -1], st._last.get_numpy(slots)):
            return False
        if s > 1:
            held = st._np_frames.take(st._frame_table().src[slots, 1:s], axis=0)
            if not np.array_equal(before[:, :-1], held):
                return False
    return True
