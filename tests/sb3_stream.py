"""A vector env's calls to an SB3 replay buffer, as SB3 makes them: shared by the SB3
tests that feed SB3's own buffer and :class:`~xpbank.integrations.sb3.XpbankReplayBuffer`
the same stream."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np


def chained(seed: int, n_envs: int, steps: int, action_space: Any, p_done: float) -> Iterator[tuple]:
    """``steps`` vector steps ``(obs, next_obs, action, reward, done, infos)`` of 3-float
    observations: obs chains from next_obs unless the step ended (half of the ends are time
    limits, with the true final obs as next_obs). A ``Discrete`` action space gives int
    actions ``(n_envs, 1)``, a ``Box`` floats in ``[-1, 1]`` ``(n_envs, *shape)``."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
    for _ in range(steps):
        next_obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
        done = rng.random(n_envs) < p_done
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        if hasattr(action_space, "n"):  # Discrete
            action = rng.integers(0, action_space.n, size=(n_envs, 1))
        else:
            action = rng.uniform(-1, 1, size=(n_envs, *action_space.shape)).astype(np.float32)
        yield obs, next_obs, action, rng.normal(size=n_envs).astype(np.float32), done, infos
        obs = next_obs.copy()
        obs[done] = rng.normal(size=(int(done.sum()), 3)).astype(np.float32)
