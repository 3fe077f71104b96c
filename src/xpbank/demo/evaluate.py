"""Greedy evaluation of a trained agent on fresh, seeded episodes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xpbank.errors import require

__all__ = ["evaluate"]


def evaluate(act: Callable[[torch.Tensor], Any], env_id: str, episodes: int, seed: int) -> float:
    """Mean return of ``act`` over ``episodes`` episodes, seeded ``seed + 10_000 + i``.

    Args:
        act: one observation (a tensor, no batch dim) -> one action; called under
            ``torch.no_grad()``. The seeds differ from training's ``seed``.

    Example:
        >>> evaluate(lambda obs: 0, "CartPole-v1", episodes=2, seed=0) < 20
        True
    """
    gym = require("gymnasium", "gym")
    env = gym.make(env_id)
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = act(torch.as_tensor(obs))
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))
