"""PPO on CartPole-v1 from an xpbank RolloutBuffer (GAE and minibatches by xpbank).

    python examples/ppo_cartpole.py [--steps 60000] [--seed 0] [--help]

The agent is ``src/xpbank/demo/ppo.py`` (one file, read it top to bottom), the same code
``xpbank demo`` runs: a Collector steps 8 envs, a RolloutSink stores each env's
transitions at its own cursor and bootstraps GAE from the value of the true final
observation at truncations; 20 epochs of clipped PPO over each rollout.

What it reaches at the defaults (``docs/demo.md``): a greedy return of 500 (the maximum)
on seeds 0, 1 and 2 on the project's 2-core machine.
The exact numbers depend on the CPU (floating-point rounding): compare ranges over seeds.
"""

from __future__ import annotations

import logging

from xpbank.demo import ppo
from xpbank.demo.args import run_agent


def main(argv: list[str] | None = None) -> dict[str, float]:
    return run_agent(ppo.train, ppo.PPOConfig, argv, __doc__)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
