"""On-policy rollouts: :class:`RolloutBuffer`, returns (GAE, V-trace ...) and minibatches."""

from __future__ import annotations

from xpbank.rollout.buffer import RecurrentBatch, RolloutBuffer, RolloutKeys
from xpbank.rollout.layout import SegmentSizes, segment_sizes
from xpbank.rollout.minibatch import Trajectories, anneal_beta, pad_trajectories, split_trajectories, unpad
from xpbank.rollout.returns import discounted_returns, gae, normalize_advantages, nstep_targets, vtrace

__all__ = [
    "RolloutBuffer",
    "RolloutKeys",
    "RecurrentBatch",
    "SegmentSizes",
    "segment_sizes",
    "Trajectories",
    "split_trajectories",
    "pad_trajectories",
    "unpad",
    "anneal_beta",
    "gae",
    "vtrace",
    "discounted_returns",
    "nstep_targets",
    "normalize_advantages",
]
