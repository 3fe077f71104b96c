"""What the HER read fast path keeps from one sample of a batch size to the next (:class:`Shot`).

A relabelled sample through :func:`xpbank.her.records.sample_records` made the same
choices on every call: the number of relabelled items, the shapes of its three fresh
arrays, whether the fused draw applies, where the draw's words and the ends table are,
and the compiled pass's entry. Timed inside a sample, where every Python step costs
about twice what it costs called back to back, those steps (a function call for the
draw, one for the ends table, the checks of the kept draw tensor, the goal arrays'
view) were several µs. A :class:`Shot` holds them for one batch size (a layout keeps a
few, as the read plan keeps its slot tensors): a call checks that the sampler's
fraction and strategy are still those it was made for, catches the ends table up where
items were written since, draws into its kept tensor and calls the pass with its own
context of addresses (:func:`xpbank.her.kernel._drawn_pass`). The sampler keeps the
Shot of its last fused sample (``her._hot``, dropped by ``HerSampler.__setattr__``
whenever a setting is set), with the plan, spec and episode index it was checked
against: a repeat sample checks only those (four identities and the batch size).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.her.goals import ends_table

__all__ = ["Shot"]

_NO_LEFT = np.zeros(0, dtype=np.int64)  # the ends table of a batch with no relabelled item


class Shot:
    """A fused-draw sample of ``batch_size`` through ``layout`` (a
    :class:`~xpbank.her.layout.RecordLayout`), made for one relabel fraction and strategy.

    Args:
        layout: the record layout (its pass entry and goal dtype chosen: ``layout.call``).
        fraction: the sampler's ``relabel_fraction``.
        final: the ``final`` strategy (else ``future``).
        batch_size: the sample's size (even: the fused draw's words are two slots each).
        ring: the buffer's ring (the ends table is made or caught up here).

    ``draw``: the kept int64 tensor the fused draw fills (``batch_size / 2 + m`` words);
    ``context_at``: the address of the pass's int64 context ``[the draw's words, the
    ends table (addresses), stride, achieved, n, goal_at[0 .. n)]``, which this object
    keeps alive with the arrays it points at.
    """

    def __init__(self, layout: Any, fraction: float, final: bool, batch_size: int, ring: Any):
        self.fraction, self.final, self.call = fraction, final, layout.call
        self.layout, self.batch_size = layout, batch_size
        self.spec, self.episodes = layout.spec, layout.episodes
        self.plan: Any = None  # the read plan of the sample that made it the sampler's _hot
        m = self.m = int(fraction * batch_size)
        self.out_shape = (batch_size, layout.width)
        self.goal_shape, self.order = (m, layout.goal_words), layout.goal_order
        self.pair_dtype, self.row_dtype = layout.pair_dtype, layout.row_dtype
        # the two goal arrays are compute_reward's arguments as they are (else: layout.as_goals)
        self.plain = self.pair_dtype is layout.goal_dtype and len(layout.goal_shape) == 1
        # the rewards' place: the first m of one column of the rows, made as the reward's
        # dtype (else put_rewards views them)
        column = layout.reward_at >= 0 and self.row_dtype is layout.reward_type
        self.reward_column = (slice(0, m), layout.reward_at) if column else None
        self.reward_shape = (m,)  # compute_reward's answer as it is written
        self.table = ends_table(layout.episodes, ring, layout.stride) if m else None
        self.left = _NO_LEFT if self.table is None else self.table.left
        self.draw = torch.empty((batch_size >> 1) + m, dtype=torch.int64)
        self.raw = self.draw.numpy()
        at = layout.goal_at.tolist()
        words = [self.raw.ctypes.data, self.left.ctypes.data, layout.stride, layout.achieved, len(at), *at]
        self.context = np.array(words, dtype=np.int64)
        self.context_at = int(self.context.ctypes.data)
