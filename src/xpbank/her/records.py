"""The read fast path of a hindsight sample: the sampled records and their goals in one compiled pass.

A :class:`~xpbank.her.HerSampler` sample through the general path reads the items
(``storage.gather``, field by field), then chooses the goals and reads their rows
(:mod:`xpbank.her.kernel`), then writes the goals into the batch's goal fields, then
builds the TensorDict walking the keys: about 3x a uniform sample of the same buffer.
Where the storage keeps every field in one packed CPU block (the buffer's read plan,
:mod:`xpbank.replay.fast_read`), :func:`sample_records` does it the way a uniform
sample does, plus the relabelling:

- the uniform draw into the plan's kept slot tensor (the same draws as the wrapped
  :class:`~xpbank.UniformSampler`), then the relabelling draw (:meth:`HerSampler._draw
  <xpbank.her.HerSampler>`), in the general path's order: the same batch for a seed;
  with numba, for an even batch, both in one torch call (:func:`fused_draw`: the same
  words of the generator, decoded in the compiled call; ~1.5 µs less);
- one compiled call (:func:`_records_loop`): it prefetches the relabelled items' cells
  of the ends table; then, item by item, prefetches the record a few items ahead,
  chooses the goal (the arithmetic of :func:`xpbank.her.kernel._goals_loop`, to the
  bit), prefetches its row and copies a record whole into fresh memory; then copies
  each goal (the goal step's next achieved goal) over the record's desired goal and
  next desired goal, and into a fresh ``[m, ...]`` array, and the item's own next
  achieved goal into another;
- the user's ``compute_reward(achieved, goal, None)`` once on the relabelled rows (the
  two fresh contiguous arrays), its rewards written into the records' reward field;
- the batch split from the records as the fast read does (:meth:`RecordReader.split
  <xpbank.storage.blocks.RecordReader.split>`): the same keys, order, dtypes and values
  as the general path (the tests compare the two).

It applies in the kernel's case (lockstep, ``future`` or ``final``, no n-step, no
``info_keys``, no ``compute_terminated``), with the uniform base sampler and goal and
reward fields NumPy holds as themselves; anything else returns ``None`` before any
randomness is drawn, and the general path takes the call. Without numba the same pass
runs in NumPy (:func:`_numpy_pass`: a ``take`` of whole rows, :func:`choose_goals
<xpbank.her.goals.choose_goals>`, a fancy index of the goal rows).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xpbank import _jit
from xpbank._jit.prefetch import prefetch, prefetch_l2
from xpbank.her.goals import choose_goals
from xpbank.her.layout import RecordLayout
from xpbank.her.relabel import _per_item
from xpbank.replay.fast_read import ids_of_rows
from xpbank.sampler.uniform import UniformSampler

__all__ = ["RecordLayout", "drawn_kernel", "fused_draw", "kernel", "sample_records"]

_compiled: list[tuple[Callable[..., Any], Callable[..., Any]] | None] = []  # [] until the first kernel() call
_LINE = 64  # bytes per cache line, for the prefetches
_AHEAD = 16  # records prefetched ahead of the copy
_NO_U = np.zeros(0, dtype=np.float64)  # the arguments of a batch with no relabelled item
_NO_LEFT = np.zeros(0, dtype=np.int64)
_INT64 = np.dtype(np.int64)
_FUSED_LIMIT = 1 << 28  # torch's random_(0, n) takes 32 bits a value below this n, 64 from it
_fusion: list[bool] = []  # [_fusion_holds()'s answer] once checked
_MASK53, _EPS53 = (1 << 53) - 1, 2.0**-53  # a float64 uniform_ draw: 53 bits of a 64-bit word


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
    for i in range(m):  # the goals' steps are read first: their lines arrive meanwhile
        prefetch(left_base + np.int64(rows[i]) * 8)
    for i in range(b + _AHEAD):
        if i < b:  # the record copied _AHEAD items later, and the item's id
            at = src_base + np.int64(rows[i]) * step
            for off in range(0, row_bytes, _LINE):
                prefetch_l2(at + off)  # (into L2: copied _AHEAD items later)
            prefetch_l2(at + row_bytes - 1)
            back = np.int64(rows[i]) - offset
            ids[i] = first + (back + capacity if back < 0 else back)
        if i < m:  # item i's goal, as _goals_loop chooses it; its row prefetched
            item = ids[i]
            left = np.int64(left_table[rows[i]])
            if left == 0:  # the env's open episode: up to its newest item
                left = (next_id - 1 - item) // stride + 1
            pick = stride * (left - 1 if final else np.int64(uniform[i] * left))
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
    """:func:`fused_draw`'s words as the two draws they replace: ``rows[i]`` the ``i``-th
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


def _drawn_loop(
    raw: Any,
    size: Any,
    src: Any,
    first: Any,
    left_table: Any,
    stride: Any,
    next_id: Any,
    final: Any,
    achieved: Any,
    goal_at: Any,
    out: Any,
    pair: Any,
    index: Any,
) -> None:  # pragma: no cover - run compiled
    """:func:`_decode` the fused draw ``raw`` into the slots and goal offsets (scratch
    arrays of its own), then :func:`_records_loop` into ``out``, ``pair`` ``[2, m, g]``
    (the items' next achieved goals, then their goals) and ``index`` ``[2, B]`` (the
    ids, then the goal ids): one call instead of two draws and a pass."""
    b, m = out.shape[0], pair.shape[1]
    rows, uniform = np.empty(b, dtype=np.int64), np.empty(m, dtype=np.float64)
    _decode(raw, rows, size, uniform)
    _records_loop(
        src, rows, first, uniform, left_table, stride, next_id, final, achieved, goal_at, out, pair[1], pair[0],
        index[0], index[1],
    )  # fmt: skip


def _kernels() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    if not _compiled:
        kernels = _jit.compile_kernels(_records_loop, _drawn_loop, helpers=(_decode, _records_loop))
        _compiled.append(None if kernels is None else (kernels[0], kernels[1]))
    return _compiled[0]


def kernel() -> Callable[..., Any] | None:
    """The compiled :func:`_records_loop` (numba, cached on disk), or ``None`` without numba."""
    kernels = _kernels()
    return None if kernels is None else kernels[0]


def drawn_kernel() -> Callable[..., Any] | None:
    """The compiled :func:`_drawn_loop` (numba, cached on disk), or ``None`` without numba."""
    kernels = _kernels()
    return None if kernels is None else kernels[1]


def fused_draw(
    layout: RecordLayout, size: int, batch_size: int, m: int, generator: torch.Generator
) -> np.ndarray | None:
    """The uniform base sampler's slot draw (``random_(0, size)`` of ``batch_size``) and
    the ``m`` goal offsets (``uniform_`` of ``m`` float64) in one torch call: the words
    they would take from ``generator``, in the same order, as ``batch_size / 2 + m``
    int64 (a tensor kept on ``layout``), for :func:`_decode`; the generator ends where
    the two draws leave it. ``None`` (nothing drawn) where that does not hold: an odd
    batch (it would take a word more), ``size`` from ``2**28`` (torch then takes 64 bits
    a slot), or a torch whose draws :func:`_fusion_holds` finds different."""
    if batch_size & 1 or not 0 < size < _FUSED_LIMIT or not (_fusion[0] if _fusion else _fusion_holds()):
        return None
    n = (batch_size >> 1) + m
    kept = layout.draw
    if kept is None or kept[1].shape[0] != n:  # (a NumPy shape: ~0.2 µs less than torch's)
        t = torch.empty(n, dtype=torch.int64)
        kept = layout.draw = (t, t.numpy())
    kept[0].random_(-(2**63), None, generator=generator)  # every bit of each 64-bit word
    return kept[1]


def _fusion_holds() -> bool:
    """Whether this torch's full-range int64 draw gives the words its ``random_(0, n)``
    (one 32-bit word a value, ``n < 2**28``) and float64 ``uniform_`` (one 64-bit word a
    value) take, high half first: checked once per process against the two draws."""
    if not _fusion:
        holds = True
        for size in (3, 1000, _FUSED_LIMIT - 1):
            gen = torch.Generator().manual_seed(size)
            start = gen.get_state()
            slots = torch.empty(6, dtype=torch.int64).random_(0, size, generator=gen)
            uniform = torch.empty(5, dtype=torch.float64).uniform_(generator=gen)
            end = gen.get_state()
            gen.set_state(start)
            raw = torch.empty(8, dtype=torch.int64).random_(-(2**63), None, generator=gen)
            rows, got = np.empty(6, dtype=np.int64), np.empty(5, dtype=np.float64)
            _decode(raw.numpy(), rows, size, got)  # (its source, run as Python)
            holds = holds and torch.equal(gen.get_state(), end)
            holds = holds and np.array_equal(rows, slots.numpy()) and np.array_equal(got, uniform.numpy())
        _fusion.append(holds)
    return _fusion[0]


def sample_records(
    her: Any, plan: Any, ring: Any, batch_size: int, generator: torch.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, torch.Tensor]] | None:
    """``her``'s (a :class:`~xpbank.her.HerSampler`) sample of ``batch_size`` read
    through ``plan`` (the buffer's :class:`~xpbank.replay.fast_read.ReadPlan`): ``(the
    records, their ids, info)`` with ``info["her_goal"]``, or ``None`` (nothing drawn)
    where the fast path does not apply. The caller holds the buffer's lock.

    Raises:
        SpecError: the goal fields not found, or ``compute_reward`` returning the wrong
            number of values (the goals are drawn by then, as in the general path).
    """
    reward = her.compute_reward
    if (
        reward is None  # the general path raises
        or type(her.base) is not UniformSampler
        or her.strategy == "episode"
        or her.info_keys
        or her.compute_terminated is not None
    ):
        return None
    spec, episodes, reader = plan.storage.spec, ring.episodes, plan.reader
    layout = getattr(her, "_records", None)  # (absent from a sampler pickled before it)
    if (
        layout is None
        or layout.reader is not reader
        or layout.spec is not spec
        or layout.episodes is not episodes
    ):
        if spec is None or episodes is None:
            return None
        layout = her._records = RecordLayout(reader, her._resolve(spec, episodes), spec, episodes)
    if not layout.usable:
        return None
    m = int(her.relabel_fraction * batch_size)
    out = np.empty((batch_size, layout.width), layout.word)
    index = np.empty((2, batch_size), _INT64)  # the ids, then the goal ids: one allocation
    pair = np.empty((2, m, layout.goal_words), layout.word)  # next achieved goals, then goals
    left = layout.ends(ring) if m else _NO_LEFT
    kernels = _kernels()
    raw = None if kernels is None else fused_draw(layout, ring.size, batch_size, m, generator)
    if raw is not None and kernels is not None:  # both draws in one: decoded by the kernel
        kernels[1](
            raw, ring.size, layout.words, ring.next_id - ring.size, left, layout.stride, ring.next_id,
            her.strategy == "final", layout.achieved, layout.goal_at, out, pair, index,
        )  # fmt: skip
    else:
        slots, rows, _ = plan.draw(batch_size)
        her.base.draw_into(ring, slots, generator)  # the wrapped sampler's draws
        uniform = her._draw(m, generator) if m else _NO_U
        if kernels is None:
            _numpy_pass(layout, ring, rows, uniform, her.strategy, out, pair[1], pair[0], index[0], index[1])
        else:
            kernels[0](
                layout.words, rows, ring.next_id - ring.size, uniform, left, layout.stride, ring.next_id,
                her.strategy == "final", layout.achieved, layout.goal_at, out, pair[1], pair[0], index[0],
                index[1],
            )  # fmt: skip
    if m:
        goals = pair.view(layout.goal_dtype)  # one view of both
        if len(layout.goal_shape) != 1:
            goals = goals.reshape(2, m, *layout.goal_shape)
        value = reward(goals[0], goals[1], None)
        if type(value) is not np.ndarray or value.shape != (m,):
            value = _per_item("compute_reward", value, m)
        layout.put_rewards(out, m, value)
    records = np.ndarray(batch_size, layout.record, out)  # the rows as records (~0.5 µs less than a view)
    return records, index[0], {"her_goal": torch.from_numpy(index[1])}


def _numpy_pass(
    layout: RecordLayout,
    ring: Any,
    rows: np.ndarray,
    uniform: np.ndarray,
    strategy: str,
    out: np.ndarray,
    goal: np.ndarray,
    reached: np.ndarray,
    ids: np.ndarray,
    goal_ids: np.ndarray,
) -> None:
    """:func:`_records_loop`'s work in NumPy, where numba is missing: the same records,
    ids, goals (:func:`~xpbank.her.goals.choose_goals`, the kernel's reference) and rows."""
    m, g, a = goal.shape[0], goal.shape[1], layout.achieved
    np.take(layout.words, rows, axis=0, out=out)  # whole rows, one call
    ids[...] = ids_of_rows(ring, rows)
    goal_ids[m:] = -1
    if not m:
        return
    choose_goals(ring.episodes, ring, ids[:m], strategy, uniform, layout.stride, rows[:m], goal_ids[:m])
    goal[...] = layout.words[goal_ids[:m] % ring.capacity, a : a + g]
    reached[...] = out[:m, a : a + g]
    for at in layout.goal_at.tolist():
        out[:m, at : at + g] = goal
