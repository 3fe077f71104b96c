"""The ``xpbank demo``: agents learning from experience xpbank stores and returns.

``dqn`` trains Double DQN from a prioritized n-step :class:`~xpbank.ReplayBuffer` and
``ppo`` trains PPO from a :class:`~xpbank.RolloutBuffer`, both fed by a
:class:`~xpbank.Collector` (the examples run the same code); ``report`` prints the
summary table and draws the learning curves. The command line lives in :mod:`xpbank.tools.cli`.
"""

from __future__ import annotations
