"""Double DQN on a discrete-action gymnasium env, fed by an xpbank ReplayBuffer.

The experience path is the library's: a :class:`~xpbank.Collector` steps the env and
writes transitions (true final observation, ``terminated`` apart from ``truncated``)
into the buffer that :func:`make_buffer` builds; the learner samples minibatches from it.
The target bootstraps through a truncation and never through a termination.

Example:
    >>> result = train(DQNConfig(steps=300, learning_starts=100, train_freq=50,
    ...                          gradient_steps=2, eval_episodes=1))
    >>> result.env_steps, len(result.buffer)
    (300, 300)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from xpbank.collect import Collector
from xpbank.demo.evaluate import evaluate
from xpbank.errors import require
from xpbank.replay import ReplayBuffer
from xpbank.spec import Spec

__all__ = ["DQNConfig", "DQNResult", "make_buffer", "train"]


@dataclass(frozen=True)
class DQNConfig:
    """Hyper-parameters, tuned on CartPole-v1 (greedy return 500 with seeds 0, 1 and 2).

    The schedule is RL Zoo's for DQN on CartPole (bursts of 128 minibatches every 256
    steps, target copied after each burst), with a linearly decaying learning rate,
    which keeps the final greedy policy from drifting off the 500 it reaches.
    """

    env_id: str = "CartPole-v1"
    steps: int = 50_000
    seed: int = 0
    buffer_size: int = 100_000
    batch_size: int = 128
    lr: float = 1e-3
    lr_end_fraction: float = 0.05  # linear decay of the learning rate to lr * this
    gamma: float = 0.99
    hidden: int = 128
    learning_starts: int = 1_000
    train_freq: int = 256  # env steps between training bursts
    gradient_steps: int = 128  # minibatches per burst
    exploration_fraction: float = 0.16
    exploration_final_eps: float = 0.04
    eval_episodes: int = 10


@dataclass
class DQNResult:
    """What one training run produced."""

    config: DQNConfig
    q: nn.Module
    buffer: ReplayBuffer
    env_steps: int
    seconds: float
    cpu_seconds: float  # process CPU time of the training loop (the machine may be shared)
    buffer_ops: int  # extend + sample calls
    buffer_seconds: float  # time spent in them
    curve: list[tuple[int, float]] = field(default_factory=list)  # (env step, episode return)
    eval_return: float = float("nan")

    @property
    def final_return(self) -> float:
        """Mean return of the last 10 training episodes."""
        return float(np.mean([r for _, r in self.curve[-10:]])) if self.curve else float("nan")


def make_buffer(spec: Spec, config: DQNConfig, num_envs: int = 1) -> ReplayBuffer:
    """The replay buffer the agent learns from (uniform sampling).

    The single place to change to switch to prioritized n-step replay. ``num_envs``
    reaches the buffer only where its constructor takes it (the per-env episode index).
    """
    extra: dict[str, Any] = (
        {"num_envs": num_envs} if "num_envs" in inspect.signature(ReplayBuffer).parameters else {}
    )
    return ReplayBuffer(config.buffer_size, spec, seed=config.seed, **extra)


def q_network(n_obs: int, n_actions: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_obs, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


def td_loss(q: nn.Module, target: nn.Module, batch: TensorDict, gamma: float) -> torch.Tensor:
    """Double-DQN Huber loss; ``terminated`` stops the bootstrap, ``truncated`` does not."""
    q_taken = q(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_obs = batch["next", "obs"]
        best = q(next_obs).argmax(dim=1, keepdim=True)
        next_value = target(next_obs).gather(1, best).squeeze(1)
        y = batch["reward"] + gamma * (~batch["terminated"]).float() * next_value
    return nn.functional.smooth_l1_loss(q_taken, y)


def epsilon(step: int, config: DQNConfig) -> float:
    """Linear decay from 1 to ``exploration_final_eps`` over ``exploration_fraction`` of the run."""
    span = max(1.0, config.exploration_fraction * config.steps)
    return max(config.exploration_final_eps, 1.0 - (1.0 - config.exploration_final_eps) * step / span)


def train(config: DQNConfig, progress: Callable[[int, float | None], Any] | None = None) -> DQNResult:
    """Train, then evaluate greedily; ``progress(env_steps, last_return)`` is called per step."""
    gym = require("gymnasium", "gym")
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    envs = gym.make_vec(
        config.env_id, 1, vectorization_mode="sync", vector_kwargs={"autoreset_mode": "SameStep"}
    )
    n_obs, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    rb = make_buffer(Spec.from_gymnasium(envs.single_observation_space, envs.single_action_space), config, 1)
    q, target = q_network(n_obs, n_actions, config.hidden), q_network(n_obs, n_actions, config.hidden)
    target.load_state_dict(q.state_dict())
    optim = torch.optim.Adam(q.parameters(), lr=config.lr)
    step = 0

    def act(obs: torch.Tensor) -> torch.Tensor:
        if rng.random() < epsilon(step, config):
            return torch.as_tensor(rng.integers(n_actions, size=len(obs)))
        with torch.no_grad():
            return q(obs).argmax(dim=1)

    timed = _TimedBuffer(rb)
    collector = Collector(envs, act, timed)
    collector.reset(seed=config.seed)
    result = DQNResult(config, q, rb, 0, 0.0, 0.0, 0, 0.0)
    start, cpu_start = time.perf_counter(), time.process_time()
    for step in range(config.steps):
        seen = len(collector.episodes)
        collector.collect(1)
        result.curve += [(step + 1, e.ret) for e in collector.episodes[seen:]]
        if step >= config.learning_starts and step % config.train_freq == 0:
            frac = max(config.lr_end_fraction, 1.0 - step / config.steps)
            for group in optim.param_groups:
                group["lr"] = config.lr * frac
            for _ in range(config.gradient_steps):
                loss = td_loss(q, target, timed.sample(config.batch_size), config.gamma)
                optim.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q.parameters(), 10.0)
                optim.step()
            target.load_state_dict(q.state_dict())
        if progress is not None:
            progress(step + 1, result.curve[-1][1] if result.curve else None)
    envs.close()
    result.seconds = time.perf_counter() - start
    result.cpu_seconds = time.process_time() - cpu_start
    result.env_steps = collector.transitions
    result.buffer_ops, result.buffer_seconds = timed.calls, timed.seconds
    result.eval_return = evaluate(
        lambda obs: int(q(obs).argmax()), config.env_id, config.eval_episodes, config.seed
    )
    return result


class _TimedBuffer:
    """Counts the calls into the buffer and the time spent in them (for the summary)."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer, self.calls, self.seconds = buffer, 0, 0.0

    def _timed(self, method: Callable[[Any], Any], arg: Any) -> Any:
        start = time.perf_counter()
        out = method(arg)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return out

    def extend(self, batch: Any) -> range:
        return self._timed(self.buffer.extend, batch)

    def sample(self, batch_size: int) -> TensorDict:
        return self._timed(self.buffer.sample, batch_size)
