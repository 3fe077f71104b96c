"""PPO on a discrete-action gymnasium env, learning from an xpbank RolloutBuffer.

A :class:`~xpbank.Collector` steps ``num_envs`` envs (NEXT_STEP autoreset, gymnasium's
default) and a :class:`~xpbank.RolloutSink` stores each env's transitions at its own
cursor of a ``[horizon, num_envs]`` :class:`~xpbank.RolloutBuffer`; the collector's
``value_fn`` gives the value of every TRUE next observation, which GAE bootstraps from at
a truncation and at the end of the rollout (never at a termination). xpbank computes the
advantages and hands out shuffled minibatches; the learner is CleanRL's clipped PPO.

Example:
    >>> result = train(PPOConfig(steps=512, epochs=1, eval_episodes=1))
    >>> result.buffer.shape, result.env_steps >= 2 * 32 * 8  # and the reset steps
    (torch.Size([32, 8]), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from xpbank.collect.collector import Collector
from xpbank.collect.sinks import RolloutSink
from xpbank.demo.evaluate import evaluate
from xpbank.demo.result import AgentResult, Progress, TimedBuffer
from xpbank.errors import require
from xpbank.rollout import RolloutBuffer

__all__ = ["PPOConfig", "ActorCritic", "clipped_surrogate", "train"]


@dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters, tuned on CartPole-v1 (``docs/demo.md`` gives what they reach over seeds).

    Learning rate and clip range anneal linearly to 0; advantages are normalized per
    minibatch; no entropy bonus.
    """

    env_id: str = "CartPole-v1"
    steps: int = 60_000  # env steps (all sub-envs together), rounded down to whole rollouts
    seed: int = 0
    num_envs: int = 8
    horizon: int = 32
    epochs: int = 20
    minibatch_size: int = 256
    lr: float = 1e-3
    gamma: float = 0.98
    lam: float = 0.8
    clip: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    eval_episodes: int = 10


def mlp(n_in: int, n_out: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, n_out)
    )


class ActorCritic(nn.Module):
    """Separate actor (logits) and critic (value) MLPs.

    Example:
        >>> import torch
        >>> ac = ActorCritic(4, 2, 64)
        >>> action, extras = ac.act(torch.zeros(3, 4))
        >>> action.shape, sorted(extras)
        (torch.Size([3]), ['log_prob', 'value'])
    """

    def __init__(self, n_obs: int, n_actions: int, hidden: int):
        super().__init__()
        self.actor, self.critic = mlp(n_obs, n_actions, hidden), mlp(n_obs, 1, hidden)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs.float()).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.actor(obs.float()))

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sample actions; the extras the rollout stores: their log-probs and the values."""
        dist = self.dist(obs)
        action = dist.sample()
        return action, {"log_prob": dist.log_prob(action), "value": self.value(obs)}


def clipped_surrogate(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantage: torch.Tensor, clip: float
) -> torch.Tensor:
    """PPO's clipped policy loss ``-E[min(r A, clip(r, 1 - c, 1 + c) A)]``, ``r = exp(lp - old)``.

    Example:
        >>> import torch
        >>> float(clipped_surrogate(torch.tensor([0.5]), torch.tensor([0.0]), torch.tensor([1.0]), 0.2))
        -1.2000000476837158
    """
    ratio = torch.exp(log_prob - old_log_prob)
    return -torch.min(ratio * advantage, ratio.clamp(1.0 - clip, 1.0 + clip) * advantage).mean()


def ppo_step(
    model: ActorCritic, optim: torch.optim.Optimizer, mb: TensorDict, clip: float, config: PPOConfig
) -> None:
    """One gradient step on a minibatch (its advantages already normalized)."""
    policy_loss = clipped_surrogate(
        model.dist(mb["obs"]).log_prob(mb["action"]), mb["log_prob"], mb["advantage"], clip
    )
    value_loss = 0.5 * (model.value(mb["obs"]) - mb["return"]).pow(2).mean()
    loss = policy_loss + config.vf_coef * value_loss
    optim.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    optim.step()


def train(config: PPOConfig, progress: Progress | None = None) -> AgentResult:
    """Train, then evaluate greedily; ``progress(env_steps, last_return)`` after each vector step."""
    gym = require("gymnasium", "gym")
    torch.manual_seed(config.seed)
    envs = gym.make_vec(config.env_id, config.num_envs, vectorization_mode="sync")
    n_obs, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    model = ActorCritic(n_obs, n_actions, config.hidden)
    optim = torch.optim.Adam(model.parameters(), lr=config.lr, eps=1e-5)
    rollout = RolloutBuffer(config.num_envs, config.horizon, seed=config.seed)
    timed = TimedBuffer(rollout)
    sink = RolloutSink(timed)
    collector = Collector(envs, model.act, sink, value_fn=model.value)
    collector.reset(seed=config.seed)
    result = AgentResult(config, model, rollout)
    iterations = max(1, config.steps // (config.num_envs * config.horizon))
    minibatches = max(1, config.num_envs * config.horizon // config.minibatch_size)
    result.start_clock()
    for it in range(iterations):
        frac = 1.0 - it / iterations
        for group in optim.param_groups:
            group["lr"] = config.lr * frac
        while not sink.ready():
            seen = len(collector.episodes)
            collector.collect(1)
            result.curve += [
                (collector.vector_steps * config.num_envs, e.ret) for e in collector.episodes[seen:]
            ]
            if progress is not None:
                progress(
                    collector.vector_steps * config.num_envs, result.curve[-1][1] if result.curve else None
                )
        sink.compute_returns(config.gamma, config.lam)
        for mb in timed.minibatches(minibatches, epochs=config.epochs, normalize_advantages=True):
            ppo_step(model, optim, mb, config.clip * frac, config)
        if it + 1 < iterations:
            sink.clear()
    envs.close()
    result.stop_clock(timed)
    result.env_steps = collector.vector_steps * config.num_envs
    result.eval_return = evaluate(
        lambda obs: int(model.actor(obs.float()).argmax()), config.env_id, config.eval_episodes, config.seed
    )
    return result
