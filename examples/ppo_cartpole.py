"""PPO on CartPole-v1 from an xpbank RolloutBuffer (GAE and minibatches by xpbank).

    python examples/ppo_cartpole.py [--steps 60000] [--seed 0] [--help]

The agent is ``src/xpbank/demo/ppo.py`` (one file, read it top to bottom), the same code
``xpbank demo`` runs: a Collector steps 8 envs, a RolloutSink stores each env's
transitions at its own cursor and bootstraps GAE from the value of the true final
observation at truncations; 20 epochs of clipped PPO over each rollout.
"""

from __future__ import annotations

import logging

import torch

from xpbank.demo import ppo
from xpbank.demo.args import parse_config

log = logging.getLogger("ppo_cartpole")


def main(argv: list[str] | None = None) -> dict[str, float]:
    config = parse_config(ppo.PPOConfig, argv, __doc__.splitlines()[0] if __doc__ else None)
    torch.set_num_threads(1)
    result = ppo.train(config)
    out = {
        "env_steps": result.env_steps,
        "episodes": len(result.curve),
        "final_return": result.final_return,
        "eval_return": result.eval_return,
        "cpu_seconds": result.cpu_seconds,
    }
    log.warning("%s", out)
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
