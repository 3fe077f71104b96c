"""The ``xpbank demo``: agents learning from experience xpbank stores and returns.

``dqn`` trains Double DQN on CartPole-v1 from a :class:`~xpbank.ReplayBuffer` fed by a
:class:`~xpbank.Collector`; ``report`` prints the summary table and draws the learning
curves. The command line lives in :mod:`xpbank.cli`.
"""

from __future__ import annotations
