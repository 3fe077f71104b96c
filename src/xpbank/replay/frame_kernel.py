"""One lockstep step into a FrameStorage, checks and frame write, in one compiled call:
the core of the write fast path's frame step (:mod:`xpbank.replay.fast_frames`).

That path's step of ``E`` envs (one item each, no env field) used to make ~90 Python
calls around its two small kernels: the episode plan (~10 NumPy calls), the step's word
views (``frame_check.step_words``, twice), the check
(:func:`~xpbank.storage.frame_check.step_kernel`), the plan object and the write
(:func:`~xpbank.storage.frame_step.step_kernel`), each kernel taking ~10-20 arrays.
For one env of SB3-sized observations (``uint8[4, 84, 84]``, whole observations
stored once) that was ~35 µs of a ~47 µs ``add`` whose copies take ~10 µs.

:func:`step_call` does the same work in one call that takes ints and the step's two
arrays. What the episode plan says about a lockstep step is arithmetic on the index's
per-env state, which it reads through the address :func:`~xpbank.ring.episode_step.
state_address` gives (item ``i`` is env ``i``: its predecessor is ``last_id[i]``, it
starts an episode where ``fresh[i]``, which is then its own id, else ``cur_start[i]``).
The storage's arrays (frames, frame table, side stores and their indexes and free
lists, the episode starts) are read through addresses kept in one int64 context
(:class:`StepContext`), made again when a side store grows or the table is rebuilt.
The kernel then runs, in order:

1. the frame-stack checks of :func:`~xpbank.storage.frame_check.step_kernel`, on
   8-byte words (where the storage verifies its writes); a failure returns ``2`` with
   nothing changed (the full path then says which rule broke);
2. the counting pass of :func:`~xpbank.storage.frame_step.step_kernel`: a side store
   too small returns ``1`` and what it needs, nothing changed (the caller grows it,
   :meth:`SlotPool.reserve <xpbank.storage.frame_pool.SlotPool.reserve>`, and calls
   again);
3. that kernel's write, line for line: the same frames, table rows and side-store
   entries (the same free entries too).

It takes the step only where every frame is a whole number of 8-byte words, the
frames are integers (bit equality is value equality), the step's arrays are
C-contiguous and 8-byte aligned, and so are the storage's: else ``3`` (or no context)
and the caller runs the two-kernel path. ``tests/test_frame_kernel.py`` compares the
two paths' bytes, tables, side stores and samples over random streams.

Example:
    >>> positions_of(9, 8, 10), positions_of(9, 1, 10)
    (11, 9)
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from xpbank import _jit

__all__ = ["StepContext", "positions_of", "step_call", "step_context"]

log = logging.getLogger(__name__)

# the memory at an address as a pointer to int64, to 8-byte words, to bytes (set by _compile)
_int64s: Any = _jit.compiled_only
_words: Any = _jit.compiled_only
_bytes: Any = _jit.compiled_only
# a store that skips the caches, and the fence after such stores (set by _compile)
_store: Any = _jit.compiled_only
_fence: Any = _jit.compiled_only

# the context's entries (int64): addresses, then numbers
_FRAMES, _SRC, _LAST, _LAST_AT, _LAST_FREE, _KEPT, _KEPT_AT, _KEPT_FREE, _STARTS = range(9)
_C, _S, _W, _ENVS, _ROWS, _ZERO_PAD, _VERIFY = range(9, 16)


def positions_of(slot: int, envs: int, rows: int) -> int:
    """Where slot ``slot``'s frame is (``FrameTable.positions`` of one slot)."""
    if envs == 1:
        return slot
    return slot % envs * rows + slot // envs


def _same(a: Any, i: int, b: Any, j: int, w: int) -> bool:
    """Whether words ``a[i : i + w]`` equal ``b[j : j + w]`` (no early exit: vectorized)."""
    diff = a[i] ^ b[j]
    for k in range(1, w):
        diff |= a[i + k] ^ b[j + k]
    return diff == 0


def _zero(a: Any, i: int, w: int) -> bool:
    """Whether words ``a[i : i + w]`` are all zero."""
    acc = a[i]
    for k in range(1, w):
        acc |= a[i + k]
    return acc == 0


def _copy(dst: Any, i: int, src: Any, j: int, w: int) -> None:
    """``dst[i : i + w] = src[j : j + w]`` (words)."""
    for k in range(w):
        dst[i + k] = src[j + k]


def _stream(dst: Any, i: int, src: Any, j: int, w: int) -> None:
    """:func:`_copy` with stores that skip the caches (call ``_fence()`` after)."""
    for k in range(w):
        _store(dst, i + k, src[j + k])


def step_call(
    ctx: int, state: int, first_new: int, first_id: int, size: int, last_nfree: int, kept_nfree: int,
    obs: Any, nxt: Any,
) -> tuple[int, int, int]:  # fmt: skip
    """Check and write one step of ``E`` envs (``obs``/``nxt``: ``[E, stack, *frame]``
    or ``[E, *frame]`` arrays, read as words) written at ids ``first_new ..`` into a ring
    whose oldest live id is ``first_id`` and size ``size``; ``ctx``: a
    :class:`StepContext`'s address; ``state``: the index's packed per-env state.

    Returns ``(0, last_nfree, kept_nfree)`` once written; ``(1, need_last, need_kept)``:
    a side store needs that many free entries; ``(2, 0, 0)``: a check failed; ``(3, 0,
    0)``: an array is not C-contiguous or aligned. Nothing is changed unless ``0``."""
    t = _int64s(ctx)
    c, s, w, envs, rows = t[_C], t[_S], t[_W], t[_ENVS], t[_ROWS]
    zero_pad = t[_ZERO_PAD] != 0
    if not (obs.flags.c_contiguous and nxt.flags.c_contiguous) or (obs.ctypes.data | nxt.ctypes.data) & 7:
        return 3, 0, 0
    o, x = _words(obs.ctypes.data), _words(nxt.ctypes.data)
    frames, src, starts = _words(t[_FRAMES]), _int64s(t[_SRC]), _int64s(t[_STARTS])
    last, last_at, last_free = _words(t[_LAST]), _int64s(t[_LAST_AT]), _int64s(t[_LAST_FREE])
    kept, kept_at, kept_free = _words(t[_KEPT]), _int64s(t[_KEPT_AT]), _int64s(t[_KEPT_FREE])
    n = _int64s(state)[0]  # per env: newest id, its episode's start, then fresh flags
    last_id, cur_start, fresh = _int64s(state + 8), _int64s(state + 8 + 8 * n), _bytes(state + 8 + 17 * n)
    sw, cols = s * w, s + 1  # words per observation; frame-table columns
    if t[_VERIFY]:  # frame_check.step_kernel
        for i in range(n):
            oi = i * sw
            for j in range(s - 1):  # next obs = obs shifted by one frame
                if not _same(x, oi + j * w, o, oi + (j + 1) * w, w):
                    return 2, 0, 0
            if fresh[i]:  # an episode's first stack: padding, then its first frame
                for j in range(s - 1):
                    if not (_zero(o, oi + j * w, w) if zero_pad else _same(o, oi + j * w, o, oi + sw - w, w)):
                        return 2, 0, 0
                continue
            p = last_id[i] % c  # the previous step's next observation, as stored
            at = last_at[p]
            if at < 0 or not _same(o, oi + sw - w, last, at * w, w):
                return 2, 0, 0
            for j in range(s - 1):
                if not _same(o, oi + j * w, frames, src[p * cols + j + 1] * w, w):
                    return 2, 0, 0
    # frame_step.step_kernel: pass 1 counts, changing nothing
    new_first = first_new + n - min(size + n, c)  # the oldest live id after the step
    rescue = 0
    for k in range(1, s):
        for d in range(first_id, new_first):
            a = (d + k * n) % c
            if starts[a] <= d and kept_at[a] < 0:
                rescue += 1
    freed = 0
    for i in range(n):
        if last_at[(first_new + i) % c] >= 0:
            freed += 1
        if not fresh[i] and last_at[last_id[i] % c] >= 0:
            freed += 1
    if rescue > kept_nfree or n > last_nfree + freed:
        return 1, n - freed, rescue
    # stacks kept aside, whole, before this step overwrites their older frames
    for k in range(1, s):
        for d in range(first_id, new_first):
            a = (d + k * n) % c
            if starts[a] <= d and kept_at[a] < 0:
                kept_nfree -= 1
                e = kept_free[kept_nfree]
                kept_at[a] = e
                for j in range(s):
                    _copy(kept, e * sw + j * w, frames, src[a * cols + j] * w, w)
                src[a * cols] = -1
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
        p = last_id[i] % c
        if not fresh[i] and last_at[p] >= 0:
            last_free[last_nfree] = last_at[p]
            last_nfree += 1
            last_at[p] = -1
    # the new items: next frame aside, table row, predecessor linked, newest frame stored
    for i in range(n):
        x_id = first_new + i
        q = x_id % c
        start = x_id if fresh[i] else cur_start[i]
        last_nfree -= 1
        e = last_free[last_nfree]
        last_at[q] = e
        _copy(last, e * w, x, i * sw + sw - w, w)
        for j in range(s):
            walked = x_id - (s - 1 - j) * n
            if walked < start:
                src[q * cols + j] = c if zero_pad else positions_of(start % c, envs, rows)
            else:
                src[q * cols + j] = positions_of(walked % c, envs, rows)
        src[q * cols + s] = -1
        here = positions_of(q, envs, rows)
        if not fresh[i]:
            src[last_id[i] % c * cols + s] = here
        if s == 1:  # read by no check to come (only by samples): past the caches
            _stream(frames, here * w, o, i * sw, w)
        else:  # read by the next steps' checks: kept in cache
            _copy(frames, here * w, o, i * sw + sw - w, w)
    if s == 1:
        _fence()
    return 0, last_nfree, kept_nfree


def _compile() -> Any:
    global _int64s, _words, _bytes, _store, _fence
    ptrs, streaming = _jit.pointers("int64", "uint64", "uint8"), _jit.streaming()
    if ptrs is None or streaming is None:
        return None
    _int64s, _words, _bytes = ptrs  # the kernel's globals, resolved when it compiles
    _store, _fence = streaming
    helpers = (positions_of, _same, _zero, _copy, _stream)
    kernels = _jit.compile_kernels(step_call, helpers=helpers)  # pointers, no arrays: LLVM inlines
    return None if kernels is None else kernels[0]


_kernel = _compile()


_calls: dict[tuple[int, int], Any] = {}  # (item size, dims) -> the compiled call (or None)


def _compiled(item: int, ndim: int) -> Any:
    """:func:`step_call` compiled for a step's arrays of ``ndim`` dims and ``item``-byte
    items (read as unsigned words of that size: only their addresses and flags are
    read), called without numba's type dispatch; ``None`` where it does not compile.
    Kept per key: a signature is made again after each write the full path takes."""
    key = (item, ndim)
    if key not in _calls:
        _calls[key] = _compile_for(item, ndim)
    return _calls[key]


def _compile_for(item: int, ndim: int) -> Any:
    from numba import types  # type: ignore[import-untyped, unused-ignore]

    words: dict[int, Any] = {1: types.uint8, 2: types.uint16, 4: types.uint32, 8: types.uint64}
    if item not in words:
        return None
    array = types.Array(words[item], ndim, "A")
    try:
        return _kernel.compile((*(types.int64,) * 7, array, array))
    except Exception:
        log.debug("frame_kernel: no compiled step for %s", array, exc_info=True)
        return None


class StepContext:
    """The int64 context :func:`step_call` reads a FrameStorage through (addresses of
    its arrays, then capacity, stack, words per frame, envs, rows per env, zero padding,
    verify), with the arrays it was made from: :meth:`current` says whether it still
    describes the storage (a side store grown, or the table rebuilt, replaces arrays)."""

    def __init__(self, storage: Any, starts: np.ndarray):
        table = storage._frame_table()
        last, kept = storage._last, storage._stacks
        self.table, self.last, self.kept, self.starts = table, last, kept, starts
        self.held = (storage._np_frames, table.src, last._np, last.free, kept._np, kept.free)
        self.verify = storage.verify  # copied into the context: a later switch makes a new one
        frames = storage._np_frames
        arrays = (frames, table.src, last._np, last.index, last.free, kept._np, kept.index, kept.free, starts)
        self.ok = all(a.flags.c_contiguous and a.ctypes.data % 8 == 0 for a in arrays)
        self.ok = self.ok and table.src.dtype == np.int64 and starts.dtype == np.int64
        w = frames[0].nbytes // 8
        self.ctx = np.array(
            [*(a.ctypes.data for a in arrays), storage.capacity, storage.stack, w, table.envs, table.rows,
             int(storage.pad == "zero"), int(storage.verify)],
            dtype=np.int64,
        )  # fmt: skip
        self.address = int(self.ctx.ctypes.data)

    def current(self, storage: Any, episodes: Any) -> bool:
        """Whether the storage and the episode index still hold the arrays this context
        addresses, and the storage's ``verify`` is the one it copied."""
        h, last, kept = self.held, self.last, self.kept
        return (
            storage._np_frames is h[0]
            and episodes._start is self.starts
            and not self.table.stale
            and last._np is h[2]
            and last.free is h[3]
            and kept._np is h[4]
            and kept.free is h[5]
            and storage.verify is self.verify
        )


def step_context(storage: Any, episodes: Any, item: int, ndim: int) -> tuple[Any, StepContext] | None:
    """``(call, context)`` for a FrameStorage's steps of arrays of ``item``-byte items and
    ``ndim`` dims (the compiled :func:`step_call` and a :class:`StepContext`), or
    ``None``: no numba, frames that are not integers or not whole 8-byte words, an array
    not aligned to 8 bytes."""
    if _kernel is None or storage._np_frames.dtype.kind not in "iub":
        return None
    frame = storage._np_frames[0].nbytes
    if frame == 0 or frame % 8 or item * math.prod(storage.frame_shape) != frame:
        return None
    starts = episodes.links().start
    context = StepContext(storage, starts)
    if not context.ok:
        return None
    call = _compiled(item, ndim)
    return None if call is None else (call, context)
