"""Double DQN with prioritized 3-step replay on CartPole-v1, learning from xpbank.

    python examples/dqn_prioritized_nstep.py [--steps 30000] [--seed 0] [--help]

The agent is ``src/xpbank/demo/dqn.py`` (one file, read it top to bottom), the same code
``xpbank demo`` runs: a Collector steps 4 envs into a ReplayBuffer with a
PrioritizedSampler and NStep(3); the loss is weighted by the importance weights and the
TD errors go back as priorities.
"""

from __future__ import annotations

import logging

import torch

from xpbank.demo import dqn
from xpbank.demo.args import parse_config

log = logging.getLogger("dqn_prioritized_nstep")


def main(argv: list[str] | None = None) -> dict[str, float]:
    config = parse_config(dqn.DQNConfig, argv, __doc__.splitlines()[0] if __doc__ else None)
    torch.set_num_threads(1)
    result = dqn.train(config)
    out = {
        "env_steps": result.env_steps,
        "buffer_items": len(result.buffer),
        "final_return": result.final_return,
        "eval_return": result.eval_return,
        "cpu_seconds": result.cpu_seconds,
    }
    log.warning("%s", out)
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
