"""Stable-Baselines3 drop-ins built on :class:`xpbank.ReplayBuffer`.

- :class:`XpbankReplayBuffer`: ``replay_buffer_class=`` for SB3's DQN, SAC and TD3
  (memory or memmap storage, any xpbank sampler, save/load as a bank).
- :class:`PrioritizedDQN`: SB3's DQN with prioritized replay (importance weights in the
  loss, priorities from the TD errors).
- :class:`XpbankMixtureReplayBuffer`: an ``XpbankReplayBuffer`` whose samples mix in banks
  of earlier runs in set shares (a :class:`~xpbank.Mixture`): warm starts, RLPD-style
  50/50 batches, an offline share annealed to 0.

Needs the ``sb3`` extra (from a clone: ``pip install -e '.[sb3]'``); importing
:mod:`xpbank` does not import this package.
"""

from __future__ import annotations

from xpbank.integrations.sb3.buffer import XpbankReplayBuffer
from xpbank.integrations.sb3.dqn import PrioritizedDQN
from xpbank.integrations.sb3.mix import XpbankMixtureReplayBuffer

__all__ = ["PrioritizedDQN", "XpbankMixtureReplayBuffer", "XpbankReplayBuffer"]
