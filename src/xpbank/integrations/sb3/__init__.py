"""Stable-Baselines3 drop-ins built on :class:`xpbank.ReplayBuffer`.

- :class:`XpbankReplayBuffer`: ``replay_buffer_class=`` for SB3's DQN, SAC and TD3
  (memory or memmap storage, any xpbank sampler, save/load as a bank).
- :class:`PrioritizedDQN`: SB3's DQN with prioritized replay (importance weights in the
  loss, priorities from the TD errors).

Needs the ``sb3`` extra (from a clone: ``pip install -e '.[sb3]'``); importing
:mod:`xpbank` does not import this package.
"""

from __future__ import annotations

from xpbank.integrations.sb3.buffer import XpbankReplayBuffer
from xpbank.integrations.sb3.dqn import PrioritizedDQN

__all__ = ["PrioritizedDQN", "XpbankReplayBuffer"]
