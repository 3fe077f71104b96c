"""Where a packed record block keeps a hindsight sample's goal and reward fields
(:class:`RecordLayout`), for the read fast path of :mod:`xpbank.her.records`."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["RecordLayout"]

_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


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
        self._uniform: np.ndarray | None = None  # scratch()'s array
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

    def scratch(self, m: int) -> np.ndarray:
        """A kept float64 ``[m]`` array for the decoded goal offsets (read before the next call)."""
        kept = self._uniform
        if kept is None or kept.shape[0] != m:
            kept = self._uniform = np.empty(m, dtype=np.float64)
        return kept

    def as_goals(self, words: np.ndarray) -> np.ndarray:
        """``[m, goal_words]`` words as ``[m, *goal shape]`` goals (a view)."""
        goals = words.view(self.goal_dtype)
        return goals if len(self.goal_shape) == 1 else goals.reshape(words.shape[0], *self.goal_shape)
