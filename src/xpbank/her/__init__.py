"""Hindsight experience replay (HER) at sample time: :class:`HerSampler`.

- :mod:`~xpbank.her.sampler`: :class:`HerSampler`, the sampler wrapper a buffer takes
  (``ReplayBuffer(..., sampler=HerSampler(compute_reward=...))``);
- :mod:`~xpbank.her.goals`: which step of the item's own episode gives its goal
  (strategies ``future``, ``final``, ``episode``), through the episode index;
- :mod:`~xpbank.her.relabel`: rewriting the goal fields, reward and ``terminated`` of
  the relabelled rows (whole n-step windows with :class:`~xpbank.NStep`), and
  :class:`GoalKeys`, which fields hold them.

The Stable-Baselines3 drop-in is :class:`xpbank.integrations.sb3.her.XpbankHerReplayBuffer`.
"""

from xpbank.her.goals import STRATEGIES
from xpbank.her.relabel import GoalKeys
from xpbank.her.sampler import HerSampler

__all__ = ["STRATEGIES", "GoalKeys", "HerSampler"]
