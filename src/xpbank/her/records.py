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
from xpbank._jit.prefetch import prefetch
from xpbank.her.goals import choose_goals, ends_table
from xpbank.her.relabel import _per_item
from xpbank.replay.fast_read import ids_of_rows
from xpbank.sampler.uniform import UniformSampler

__all__ = ["RecordLayout", "kernel", "sample_records"]

_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_LINE = 64  # bytes per cache line, for the prefetches
_AHEAD = 16  # records prefetched ahead of the copy
_NO_U = np.zeros(0, dtype=np.float64)  # the arguments of a batch with no relabelled item
_NO_LEFT = np.zeros(0, dtype=np.int64)


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
                prefetch(at + off)
            prefetch(at + row_bytes - 1)
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
            prefetch(at)
            prefetch(at + g * src.itemsize - 1)  # a goal may cross a line
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


def kernel() -> Callable[..., Any] | None:
    """The compiled :func:`_records_loop` (numba, cached on disk), or ``None`` without numba."""
    if not _compiled:
        kernels = _jit.compile_kernels(_records_loop)
        _compiled.append(None if kernels is None else kernels[0])
    return _compiled[0]


class RecordLayout:
    """Where a record reader's block keeps the goal and reward fields, in machine words
    of the goal's itemsize; made once per (reader, spec, episode index).

    Args:
        reader: the storage's :class:`~xpbank.storage.blocks.RecordReader`.
        resolved: the sampler's ``(spec, keys, stride, goal reader)`` for ``spec``.
        spec: the storage's spec.
        episodes: the ring's episode index.

    ``usable`` is False where items are not in lockstep (an env field), a goal or the
    reward is not in the block, NumPy does not hold it as itself (bfloat16), or the
    rows do not split into goal-sized words.
    """

    def __init__(self, reader: Any, resolved: tuple[Any, ...], spec: Any, episodes: Any):
        self.reader, self.spec, self.episodes = reader, spec, episodes
        keys, self.stride = resolved[1], resolved[2]
        self.usable = False
        native = {key: name for key, name, bits in reader.fields if bits is None}  # NumPy's own dtypes
        records = reader.records
        roles = ("next_achieved", "desired", "next_desired", "reward")
        name: dict[str, Any] = {role: native.get(keys[role]) for role in roles}  # the record's fields
        if self.stride is None or any(name[r] is None for r in roles if r != "next_desired"):
            return  # not lockstep, or a field not in the block (or bfloat16)
        if name["next_desired"] is None and keys["next_desired"] is not None:
            return
        goal_type, achieved_at = records.dtype.fields[name["next_achieved"]][:2]
        base = goal_type.base
        word = _WORDS.get(base.itemsize)
        self.record, self.row = records.dtype, records.dtype.itemsize
        if (
            word is None
            or base.kind not in "biuf"
            or self.row % base.itemsize
            or records.strides != (self.row,)
        ):
            return
        self.goal_dtype, self.goal_shape, self.word = base, goal_type.shape, np.dtype(word)
        size = base.itemsize
        self.achieved = achieved_at // size
        self.goal_words = goal_type.itemsize // size
        at = [records.dtype.fields[name[r]][1] // size for r in ("desired", "next_desired") if name[r]]
        self.goal_at = np.array(at, dtype=np.int64)
        self.reward_name = name["reward"]
        # [C, row / size] words, a view of the storage's block
        self.words = records.view(np.uint8).reshape(records.shape[0], self.row).view(word)
        self.usable = True

    def as_goals(self, words: np.ndarray) -> np.ndarray:
        """``[m, goal_words]`` words as ``[m, *goal shape]`` goals (a view)."""
        goals = words.view(self.goal_dtype)
        return goals if len(self.goal_shape) == 1 else goals.reshape(words.shape[0], *self.goal_shape)


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
    slots, rows, _ = plan.draw(batch_size)
    her.base.draw_into(ring, slots, generator)  # the wrapped sampler's draws
    m = int(her.relabel_fraction * batch_size)
    out = np.empty((batch_size, layout.words.shape[1]), dtype=layout.word)
    records = np.ndarray(batch_size, layout.record, out)  # the rows as records (~0.5 µs less than a view)
    ids, goal_index = np.empty(batch_size, dtype=np.int64), np.empty(batch_size, dtype=np.int64)
    pair = np.empty((2, m, layout.goal_words), dtype=layout.word)  # one allocation
    reached, goal = pair
    if m:
        uniform = her._draw(m, generator)
        left = ends_table(episodes, ring, layout.stride).left
    else:
        uniform, left = _NO_U, _NO_LEFT
    run = kernel()
    if run is None:
        _numpy_pass(layout, ring, rows, uniform, her.strategy, out, goal, reached, ids, goal_index)
    else:
        run(
            layout.words, rows, ring.next_id - ring.size, uniform, left, layout.stride, ring.next_id,
            her.strategy == "final", layout.achieved, layout.goal_at, out, goal, reached, ids, goal_index,
        )  # fmt: skip
    if m:
        goals = pair.view(layout.goal_dtype)  # one view of both
        if len(layout.goal_shape) != 1:
            goals = goals.reshape(2, m, *layout.goal_shape)
        value = reward(goals[0], goals[1], None)
        if type(value) is not np.ndarray or value.shape != (m,):
            value = _per_item("compute_reward", value, m)
        field = records[layout.reward_name][:m]  # (0.4 µs where the records are in cache)
        field[...] = value if field.ndim == 1 else value.reshape(field.shape)
    return records, ids, {"her_goal": torch.from_numpy(goal_index)}


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
