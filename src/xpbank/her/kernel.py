"""Optional compiled kernels (numba) for the common hindsight draw: goals and goal rows in one pass.

For a lockstep index and the ``future`` or ``final`` strategy, choosing each relabelled
item's goal (:func:`xpbank.her.goals.choose_goals`) is a ``take`` of the ends table and
a few NumPy calls, and reading the goals (:class:`xpbank.her.relabel.GoalReader`) is a
fancy index whose rows are scattered over the ring: at 1M items each one a cache miss,
taken one after another. With numba installed (``pip install xpbank[fast]``),
one compiled kernel does both: :func:`choose_rows` prefetches
(:mod:`xpbank._jit.prefetch`) every item's cell of the ends table, then computes each
goal id and prefetches its row; :func:`copy_rows` then copies the rows, so the misses
overlap (the caller reads other data in between).

Same results as the NumPy path, to the bit (the tests compare them): the goal is
``t + stride * int(u * left)`` (``final``: ``left - 1`` steps on) with ``u * left``
one float64 product, as NumPy computes it; rows are copied as machine words of the
field's itemsize. Where numba is missing, ``XPBANK_NO_NUMBA=1`` was set, or the field
has no NumPy host view of a NumPy dtype whose rows are contiguous, :func:`choose_rows`
returns ``None`` and the caller takes the NumPy path.

The read fast path's kernels (:func:`record_kernels`, for :mod:`xpbank.her.records`)
are here too: :func:`_records_loop` copies the sampled records and their goals in one
pass, :func:`_drawn_pass` first decodes the fused draw (:func:`_decode`) and takes its
kept arguments at an address (one int64 context), so that its call, compiled for one
signature, skips numba's typing of thirteen arguments (~0.6 µs). Both choose a
goal by the one rule, :func:`_goal_step` (inlined into each kernel): numba's disk cache
checks a kernel's own source file only, so a helper shared from another module could
leave a cached kernel running its old code.

Example:
    >>> import numpy as np
    >>> from xpbank.her.kernel import _goals_loop
    >>> left = np.array([3, 2, 1, 0])  # slots 0..3 of one stream; slot 3: open episode
    >>> src = np.arange(8, dtype=np.uint32).reshape(4, 2)  # each slot's goal words
    >>> goal, ids = np.zeros((2, 2), np.uint32), np.zeros(2, np.int64)
    >>> items, u = np.array([0, 3]), np.array([0.9, 0.5])
    >>> _goals_loop(items, items, u, left, 1, 4, 4, False, src, goal, ids, np.zeros(2, np.int64), 3)
    >>> ids.tolist(), goal.tolist()  # item 0: 0 + int(0.9 * 3); item 3: its own step
    ([2, 3], [[4, 5], [6, 7]])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank._jit.prefetch import prefetch, prefetch_l2

__all__ = ["choose_rows", "copy_rows", "kernel", "record_kernels", "word_rows"]

_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call
# [] until the first record_kernels() call
_record_compiled: list[tuple[Callable[..., Any], Callable[..., Any]] | None] = []
_LINE = 64  # bytes per cache line, for the prefetches
_AHEAD = 16  # records prefetched ahead of the copy
_STEPS_AHEAD = 32  # cells of the ends table prefetched ahead of their goal's choice
_MASK53, _EPS53 = (1 << 53) - 1, 2.0**-53  # a float64 uniform_ draw: 53 bits of a 64-bit word
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_NO_IDS = np.zeros(0, dtype=np.int64)  # arguments a phase does not read
_NO_U = np.zeros(0, dtype=np.float64)
_NO_GOAL = np.zeros((0, 1), dtype=np.uint8)
# the memory at an address as a pointer to int64; numba.carray (set by record_kernels)
_i64s: Any = _jit.compiled_only
_carray: Any = _jit.compiled_only
_CTX = 5  # a record context's words before its goal_at entries (_drawn_pass)


def _goals_loop(
    ids: Any,
    slots: Any,
    uniform: Any,
    left_table: Any,
    stride: Any,
    capacity: Any,
    next_id: Any,
    final: Any,
    src: Any,
    goal: Any,
    goal_ids: Any,
    rows: Any,
    phases: Any,
) -> None:  # pragma: no cover - run compiled; the doctest runs it as Python
    """Phase 1 (``phases & 1``): goal ids into ``goal_ids``, their slots into ``rows``,
    the rows prefetched; phase 2 (``phases & 2``): the rows of ``src`` ``[C, w]`` into
    ``goal`` ``[m, w]``."""
    m = ids.shape[0]
    if phases & 1 == 0:
        _copy(src, rows, goal)
        return
    left_base = np.int64(left_table.ctypes.data)
    src_base, src_step = np.int64(src.ctypes.data), np.int64(src.strides[0])
    last_byte = np.int64(src.shape[1] * src.itemsize - 1)
    for i in range(m):
        prefetch(left_base + np.int64(slots[i]) * 8)
    for i in range(m):
        item = np.int64(ids[i])
        step = _goal_step(item, np.int64(left_table[slots[i]]), uniform, i, stride, next_id, final)
        goal_ids[i] = item + step
        s = np.int64(slots[i]) + step  # step < capacity (the goal is live): no division
        if s >= capacity:
            s -= capacity
        rows[i] = s
        prefetch(src_base + s * src_step)
        prefetch(src_base + s * src_step + last_byte)  # a row may cross a line
    if phases & 2:
        _copy(src, rows, goal)


def _goal_step(
    item: Any, left: Any, uniform: Any, i: Any, stride: Any, next_id: Any, final: Any
) -> Any:  # pragma: no cover - inlined into the kernels
    """Ids from item ``item`` (``i``-th of the batch, ``left`` steps to its episode's last
    written step, ``0``: its env's open episode) to its goal step: ``stride * int(u *
    left)`` with ``u = uniform[i]`` (one float64 product, as NumPy computes it), or
    ``stride * (left - 1)`` for ``final`` (``uniform`` not read)."""
    if left == 0:  # the env's open episode: up to its newest item
        left = (next_id - 1 - item) // stride + 1
    return stride * (left - 1 if final else np.int64(uniform[i] * left))


def _copy(src: Any, rows: Any, goal: Any) -> None:  # pragma: no cover - compiled into the kernel
    for i in range(rows.shape[0]):
        s = rows[i]
        for k in range(src.shape[1]):
            goal[i, k] = src[s, k]


def _records_loop(
    src: Any,
    rows: Any,
    first: Any,
    uniform: Any,
    left_table: Any,
    stride: Any,
    next_id: Any,
    final: Any,
    achieved: Any,
    goal_at: Any,
    out: Any,
    goal: Any,
    reached: Any,
    ids: Any,
    goal_ids: Any,
) -> None:  # pragma: no cover - run compiled; the tests also run it as Python
    """Records ``rows`` of ``src`` ``[C, W]`` (words of the goal's itemsize) into ``out``
    ``[B, W]``; their ids (the oldest live id is ``first``) into ``ids``. The first ``m =
    goal.shape[0]`` items get a goal (``goal_ids[m:]`` are ``-1``): its id into
    ``goal_ids``, its ``g = goal.shape[1]`` words (from word ``achieved`` of the goal's
    record) into ``goal`` and over words ``goal_at[j] ..`` of the item's record; the
    item's own next achieved goal into ``reached``."""
    b, m, g, capacity = rows.shape[0], goal.shape[0], goal.shape[1], src.shape[0]
    src_base, step = np.int64(src.ctypes.data), np.int64(src.strides[0])
    w = src.shape[1]
    row_bytes = np.int64(w * src.itemsize)
    left_base = np.int64(left_table.ctypes.data)
    offset = first % capacity  # the oldest item's slot
    for i in range(min(m, _STEPS_AHEAD)):  # the goals' steps are read _STEPS_AHEAD items ahead
        prefetch(left_base + np.int64(rows[i]) * 8)
    for i in range(b + _AHEAD):
        if i + _STEPS_AHEAD < m:
            prefetch(left_base + np.int64(rows[i + _STEPS_AHEAD]) * 8)
        if i < b:  # the record copied _AHEAD items later, and the item's id
            at = src_base + np.int64(rows[i]) * step
            for off in range(0, row_bytes, _LINE):
                prefetch_l2(at + off)  # (into L2: copied _AHEAD items later)
            prefetch_l2(at + row_bytes - 1)
            back = np.int64(rows[i]) - offset
            ids[i] = first + (back + capacity if back < 0 else back)
        if i < m:  # item i's goal (as _goals_loop chooses it); its row prefetched
            item = ids[i]
            pick = _goal_step(item, np.int64(left_table[rows[i]]), uniform, i, stride, next_id, final)
            goal_ids[i] = item + pick
            s = np.int64(rows[i]) + pick  # pick < capacity (the goal is live): no division
            if s >= capacity:
                s -= capacity
            at = src_base + s * step + np.int64(achieved) * src.itemsize
            prefetch_l2(at)
            prefetch_l2(at + g * src.itemsize - 1)  # a goal may cross a line
        elif i < b:
            goal_ids[i] = -1
        j = i - _AHEAD
        if j >= 0:
            s = rows[j]
            for k in range(w):
                out[j, k] = src[s, k]
    for i in range(m):  # the goal's slot from the item's (no division: the goal is live)
        s = np.int64(rows[i]) + (goal_ids[i] - ids[i])
        if s >= capacity:
            s -= capacity
        for k in range(g):
            reached[i, k] = out[i, achieved + k]
            v = src[s, achieved + k]
            goal[i, k] = v
            for j in range(goal_at.shape[0]):
                out[i, goal_at[j] + k] = v


def _decode(raw: Any, rows: Any, size: Any, uniform: Any) -> None:  # pragma: no cover - compiled in
    """:func:`xpbank.her.records.fused_draw`'s words as the two draws they replace: ``rows[i]`` the ``i``-th
    32-bit word mod ``size`` (``random_(0, size)``'s value), then each ``uniform[i]`` the
    low 53 bits of a whole 64-bit word times ``2**-53`` (``uniform_``'s float64 value)."""
    b = rows.shape[0]
    for i in range(b):  # word i: the high half of raw[i // 2] when i is even (drawn first)
        v = np.int64(raw[i >> 1])
        word = (v >> 32) & 0xFFFFFFFF if i & 1 == 0 else v & 0xFFFFFFFF
        rows[i] = word % size
    half = b >> 1
    for i in range(uniform.shape[0]):
        uniform[i] = np.float64(np.int64(raw[half + i]) & _MASK53) * _EPS53


def _drawn_pass(
    ctx: Any,
    size: Any,
    first: Any,
    next_id: Any,
    final: Any,
    src: Any,
    out: Any,
    reached: Any,
    goal: Any,
    ids: Any,
    goal_ids: Any,
) -> None:  # pragma: no cover - run compiled
    """:func:`_decode` the fused draw into the slots and goal offsets (scratch arrays of
    its own), then :func:`_records_loop` into ``out`` (``src``'s words, or the reward's
    dtype: the same size), ``reached`` and ``goal`` ``[m, g]`` (the items' next achieved
    goals and their goals: the goal's dtype, or ``src``'s words; C or Fortran order) and
    ``ids`` and ``goal_ids`` ``[B]``: one call instead of two draws and a
    pass. The arguments kept from call to call are read from the int64 context at address
    ``ctx`` (:attr:`Shot.context <xpbank.her.shot.Shot>`):
    ``[the draw's words, the ends table (addresses), stride, achieved, n, goal_at[0 .. n)]``."""
    c = _carray(_i64s(ctx), (_CTX,))
    b, m = out.shape[0], goal.shape[0]
    raw = _carray(_i64s(c[0]), ((b >> 1) + m,))
    left = _carray(_i64s(c[1]), (src.shape[0],))
    goal_at = _carray(_i64s(ctx + 8 * _CTX), (c[4],))
    rows, uniform = np.empty(b, dtype=np.int64), np.empty(m, dtype=np.float64)
    _decode(raw, rows, size, uniform)
    # the views: the rows as the reward's dtype, the goals as theirs, as NumPy made them (the same bytes)
    words, goal_words, reached_words = out.view(src.dtype), goal.view(src.dtype), reached.view(src.dtype)
    _records_loop(
        src, rows, first, uniform, left, c[2], next_id, final, c[3], goal_at, words, goal_words,
        reached_words, ids, goal_ids,
    )  # fmt: skip


def kernel() -> Callable[..., Any] | None:
    """The compiled kernel (numba, ``cache=True``; compiled on first use), or ``None``."""
    if not _compiled:
        kernels = _jit.compile_kernels(_goals_loop, helpers=(_copy, _goal_step), inline=(_goal_step,))
        _compiled.append(None if kernels is None else kernels[0])
    return _compiled[0]


def record_kernels() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """The compiled :func:`_records_loop` and :func:`_drawn_pass` (numba, cached on disk;
    compiled on first use), or ``None`` without numba."""
    global _i64s, _carray
    if not _record_compiled:
        ptrs = _jit.pointers("int64")
        kernels = None
        if ptrs is not None:
            import numba  # type: ignore[import-untyped, unused-ignore]

            (_i64s,), _carray = ptrs, numba.carray  # the kernels' globals, resolved when they compile
            kernels = _jit.compile_kernels(
                _records_loop, _drawn_pass, helpers=(_decode, _records_loop, _goal_step), inline=(_goal_step,)
            )
        _record_compiled.append(None if kernels is None else (kernels[0], kernels[1]))
    return _record_compiled[0]


def word_rows(host: np.ndarray) -> np.ndarray | None:
    """``host`` ``[C, ...]`` as ``[C, w]`` unsigned words of its itemsize (a view), or
    ``None`` where a row is not one contiguous run or the dtype is not plain numbers."""
    word = _WORDS.get(host.dtype.itemsize)
    if word is None or host.ndim < 1 or host.dtype.kind not in "biuf":
        return None
    try:
        inner = int(np.prod(host.shape[1:], dtype=np.int64))
        if host.ndim > 1 and not host[0].flags.c_contiguous:
            return None
        return host.reshape(host.shape[0], inner).view(word)  # a view, or ValueError
    except (ValueError, AttributeError):
        return None


def choose_rows(
    words: np.ndarray,
    ids: np.ndarray,
    slots: np.ndarray,
    uniform: np.ndarray,
    left_table: np.ndarray,
    stride: int,
    capacity: int,
    next_id: int,
    final: bool,
    goal_ids: np.ndarray,
) -> np.ndarray | None:
    """Each item's goal id (into ``goal_ids``); returns the goals' slots, their rows of
    ``words`` (a :func:`word_rows` view) prefetched: :func:`copy_rows` reads them
    (meanwhile the caller may read other data while the lines arrive). ``None``
    without the kernel (nothing written then).

    Args:
        words: :func:`word_rows` of the goal field's host view.
        ids, slots: the relabelled items' ids and slots (int64).
        uniform: one float64 in ``[0, 1)`` per item (ignored by ``final``).
        left_table: :attr:`EpisodeEnds.left <xpbank.her.goals.EpisodeEnds>`, caught up.
        stride, capacity, next_id: the index's stride, the ring's capacity and next id.
        final: the ``final`` strategy (else ``future``).
        goal_ids: ``[m]`` int64, written.
    """
    run = kernel()
    if run is None:
        return None
    rows = np.empty(ids.shape[0], dtype=np.int64)
    run(ids, slots, uniform, left_table, stride, capacity, next_id, final, words, _NO_GOAL, goal_ids, rows, 1)
    return rows


def copy_rows(words: np.ndarray, host: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``[m, ...]`` fresh goal rows of ``host``'s dtype: rows ``rows`` (from
    :func:`choose_rows`) of ``host``, read through ``words``, its :func:`word_rows`."""
    run = kernel()
    assert run is not None  # choose_rows ran it
    m = rows.shape[0]
    goal = np.empty((m, words.shape[1]), dtype=words.dtype)
    run(_NO_IDS, _NO_IDS, _NO_U, _NO_IDS, 1, 1, 0, False, words, goal, _NO_IDS, rows, 2)
    return goal.view(host.dtype).reshape(m, *host.shape[1:])
