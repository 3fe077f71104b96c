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
  of the ends table and every sampled record, chooses each goal (the arithmetic of
  :func:`xpbank.her.kernel._goals_loop`, to the bit) and prefetches its row, copies the
  records whole into fresh memory, then copies each goal (the goal step's next achieved
  goal) over the record's desired goal and next desired goal, and into a fresh
  contiguous ``[m, ...]`` array;
- the user's ``compute_reward(achieved, goal, None)`` once on the relabelled rows
  (``achieved``: a view of the batch's next achieved goals, as the general path gives),
  its rewards written into the records' reward field;
- the batch split from the records as the fast read does (:meth:`RecordReader.split
  <xpbank.storage.blocks.RecordReader.split>`): the same keys, order, dtypes and values
  as the general path (the tests compare the two).

It applies in the kernel's case (lockstep, ``future`` or ``final``, no n-step, no
``info_keys``, no ``compute_terminated``), with the uniform base sampler, numba present,
and goal and reward fields NumPy holds as themselves; anything else returns ``None``
before any randomness is drawn, and the general path takes the call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xpbank import _jit
from xpbank._jit.prefetch import prefetch
from xpbank.her.goals import ends_table
from xpbank.her.relabel import _per_item
from xpbank.replay.fast_read import ids_of_rows
from xpbank.sampler.uniform import UniformSampler

__all__ = ["RecordLayout", "kernel", "sample_records"]

_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call
_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_LINE = 64  # bytes per cache line, for the prefetches
_AHEAD = 16  # records prefetched ahead of the copy


def _records_loop(
    src: Any,
    rows: Any,
    ids: Any,
    uniform: Any,
    left_table: Any,
    stride: Any,
    capacity: Any,
    next_id: Any,
    final: Any,
    achieved: Any,
    goal_at: Any,
    out: Any,
    goal: Any,
    goal_ids: Any,
    wide: Any,
    copy: Any,
) -> None:  # pragma: no cover - run compiled; the tests also run it as Python
    """Records ``rows`` of ``src`` ``[C, W]`` (machine words) into ``out`` ``[B, W]``
    (copied through ``wide`` and ``copy``, the same memory as 8-byte words where rows
    are a multiple of 8 bytes); the
    first ``m = goal.shape[0]`` items (ids ``ids``) get a goal: its id into
    ``goal_ids``, its words (``goal.shape[1]`` from word ``achieved`` of the goal's
    record) into ``goal`` and over words ``goal_at[j] ..`` of the item's record."""
    b, m, g = rows.shape[0], goal.shape[0], goal.shape[1]
    src_base, step = np.int64(src.ctypes.data), np.int64(src.strides[0])
    row_bytes = np.int64(wide.shape[1] * wide.itemsize)
    left_base = np.int64(left_table.ctypes.data)
    for i in range(m):  # the goals' steps are read first: their lines arrive meanwhile
        prefetch(left_base + np.int64(rows[i]) * 8)
    for i in range(b + _AHEAD):
        if i < b:  # the record read _AHEAD items later
            at = src_base + np.int64(rows[i]) * step
            for off in range(0, row_bytes, _LINE):
                prefetch(at + off)
            prefetch(at + row_bytes - 1)
        if i < m:  # item i's goal, as _goals_loop chooses it; its row prefetched
            item = np.int64(ids[i])
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
        j = i - _AHEAD
        if j >= 0:
            s = rows[j]
            for k in range(wide.shape[1]):
                copy[j, k] = wide[s, k]
    for i in range(m):
        s = goal_ids[i] % capacity
        for k in range(g):
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
    of the goal's itemsize; made once per (reader, resolved keys).

    Args:
        reader: the storage's :class:`~xpbank.storage.blocks.RecordReader`.
        keys: :meth:`GoalKeys.resolve <xpbank.her.GoalKeys.resolve>`'s answer.

    ``usable`` is False where a goal or the reward is not in the block, or NumPy does
    not hold it as itself (bfloat16), or the rows do not split into goal-sized words.
    """

    def __init__(self, reader: Any, keys: dict[str, Any]):
        self.reader, self.keys = reader, keys
        self.usable = False
        name_of = {key: (name, bits) for key, name, bits in reader.fields}
        records = reader.records
        found = {
            role: name_of.get(keys[role]) for role in ("next_achieved", "desired", "next_desired", "reward")
        }
        if found["next_desired"] is None and keys["next_desired"] is not None:
            return  # a next desired goal the block does not hold
        if any(found[r] is None or found[r][1] is not None for r in ("next_achieved", "desired", "reward")):
            return
        if found["next_desired"] is not None and found["next_desired"][1] is not None:
            return
        goal_type, achieved_at = records.dtype.fields[found["next_achieved"][0]][:2]
        base = goal_type.base
        word = _WORDS.get(base.itemsize)
        row = records.dtype.itemsize
        if word is None or base.kind not in "biuf" or row % base.itemsize or records.strides != (row,):
            return
        self.goal_dtype, self.goal_shape = base, goal_type.shape
        size = base.itemsize
        self.achieved = achieved_at // size
        self.goal_words = goal_type.itemsize // size
        self.goal_at = np.array(
            [
                records.dtype.fields[found[r][0]][1] // size
                for r in ("desired", "next_desired")
                if found[r] is not None
            ],
            dtype=np.int64,
        )
        self.achieved_name, self.reward_name = found["next_achieved"][0], found["reward"][0]
        # [C, row / size] words, a view of the storage's block; and as wide words to copy
        data = records.view(np.uint8).reshape(records.shape[0], row)
        self.words = data.view(word)
        self.wide = data.view(np.uint64 if row % 8 == 0 else word)
        self.usable = True


def sample_records(
    her: Any, plan: Any, ring: Any, batch_size: int, generator: torch.Generator
) -> tuple[np.ndarray, np.ndarray, dict[str, torch.Tensor]] | None:
    """``her``'s (a :class:`~xpbank.her.HerSampler`) sample of ``batch_size`` read through ``plan`` (the buffer's
    :class:`~xpbank.replay.fast_read.ReadPlan`): ``(the records, their ids, info)``
    with ``info["her_goal"]``, or ``None`` (nothing drawn) where the fast path does not
    apply. The caller holds the buffer's lock.

    Raises:
        SpecError: ``compute_reward`` returning the wrong number of values (the goals
            are drawn by then, as in the general path).
    """
    reward = her.compute_reward
    storage, episodes = plan.storage, ring.episodes
    if (
        reward is None  # the general path raises
        or type(her.base) is not UniformSampler
        or her.strategy == "episode"
        or her.info_keys
        or her.compute_terminated is not None
        or episodes is None
        or storage.spec is None
    ):
        return None
    resolved = her._resolve(storage.spec, episodes)
    stride = resolved[2]
    run = kernel()
    if stride is None or run is None:
        return None
    layout = getattr(her, "_records", None)  # (absent from a sampler pickled before it)
    if layout is None or layout.reader is not plan.reader or layout.keys is not resolved[1]:
        layout = her._records = RecordLayout(plan.reader, resolved[1])
    if not layout.usable:
        return None
    slots, rows, _ = plan.draw(batch_size)
    her.base.draw_into(ring, slots, generator)  # the wrapped sampler's draws
    m = int(her.relabel_fraction * batch_size)
    goal_index = np.empty(batch_size, dtype=np.int64)
    goal_index[m:] = -1
    records = np.empty(batch_size, dtype=layout.reader.records.dtype)
    data = records.view(np.uint8).reshape(batch_size, -1)
    goal = np.empty((m, layout.goal_words), dtype=layout.words.dtype)
    ids = ids_of_rows(ring, rows)
    uniform = her._draw(m, generator) if m else np.zeros(0)
    left = ends_table(episodes, ring, stride).left if m else np.zeros(0, dtype=np.int64)
    run(
        layout.words, rows, ids, uniform, left, stride, ring.capacity, ring.next_id,
        her.strategy == "final", layout.achieved, layout.goal_at, data.view(layout.words.dtype), goal,
        goal_index, layout.wide, data.view(layout.wide.dtype),
    )  # fmt: skip
    if m:
        goals = goal.view(layout.goal_dtype).reshape(m, *layout.goal_shape)
        achieved = records[layout.achieved_name][:m]
        value = _per_item("compute_reward", reward(achieved, goals, None), m)
        field = records[layout.reward_name][:m]
        field[...] = value if value.shape == field.shape else value.reshape(field.shape)
    return records, ids, {"her_goal": torch.from_numpy(goal_index)}
