"""Where a packed record block keeps a hindsight sample's goal and reward fields
(:class:`RecordLayout`), for the read fast path of :mod:`xpbank.her.records`."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch

from xpbank.her.goals import ends_table

__all__ = ["RecordLayout"]

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_PAIRWISE = 8  # NumPy's pairwise sum adds runs shorter than this one number after another


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
        self.draw: tuple[torch.Tensor, np.ndarray] | None = None  # fused_draw's kept tensor
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
        # compute_reward's two [m, g] inputs in Fortran order (each goal's numbers a column,
        # item-minor) where a goal has fewer numbers than NumPy's pairwise sum takes at once
        # (8): a sum over a goal's numbers then adds in the order it adds them for C-order
        # inputs, to the bit, and a reduction over the goal axis (a distance) runs along
        # whole columns: ~2.5 µs less for gymnasium-robotics' reward
        self.goal_order: Literal["C", "F"] = "F" if self.goal_words < _PAIRWISE else "C"
        self.reward_name = name["reward"]
        reward_type, reward_at = records.dtype.fields[name["reward"]][:2]
        # the reward as one column of the rows viewed as its dtype, where it is one
        self.reward_type, self.reward_at = reward_type, -1
        unit = reward_type.itemsize
        if reward_type.shape == () and reward_at % unit == 0 == self.row % unit:
            self.reward_at = reward_at // unit
        # [C, row / size] words, a view of the storage's block
        self.words = records.view(np.uint8).reshape(records.shape[0], self.row).view(word)
        self.width = self.words.shape[1]
        self._ends_key = ("her_ends", self.stride)
        self.call: Any = None  # the compiled pass's entry for this layout's arrays (records.py)
        self.pair_dtype = self.word  # the dtype of the [m, g] goal arrays the pass writes
        self.row_dtype = self.word  # the dtype of the [B, width] rows it writes (records.py)
        self.shots: dict[int, Any] = {}  # batch size -> its kept Shot (her/shot.py)
        self.usable = True

    def ends(self, ring: Any) -> np.ndarray:
        """The episode index's :class:`~xpbank.her.goals.EpisodeEnds` table ``left``, caught
        up (:func:`~xpbank.her.goals.ends_table`; nothing to look at where no item was
        written since the last catch-up)."""
        table = self.episodes.derived.get(self._ends_key)
        if table is None or table.seen != ring.next_id:
            table = ends_table(self.episodes, ring, self.stride)
        return table.left

    def put_rewards(self, out: np.ndarray, m: int, value: np.ndarray) -> None:
        """``value`` ``[m]`` into the reward field of the first ``m`` rows of ``out`` (``[B,
        width]`` words of records of this layout), cast to the field's dtype."""
        if self.reward_at >= 0:  # one column of the rows as the reward's dtype
            out.view(self.reward_type)[:m, self.reward_at] = value
            return
        field = np.ndarray(out.shape[0], self.record, out)[self.reward_name][:m]
        field[...] = value if field.ndim == 1 else value.reshape(field.shape)

    def as_goals(self, words: np.ndarray) -> np.ndarray:
        """``[m, goal_words]`` words (C or Fortran order) as ``[m, *goal shape]`` goals (a view)."""
        goals = words if words.dtype is self.goal_dtype else words.view(self.goal_dtype)
        return goals if len(self.goal_shape) == 1 else goals.reshape(words.shape[0], *self.goal_shape)
