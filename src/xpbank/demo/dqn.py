"""Double DQN with prioritized n-step replay, fed by an xpbank ReplayBuffer.

The experience path is the library's: a :class:`~xpbank.Collector` steps ``num_envs``
gymnasium envs (NEXT_STEP autoreset, gymnasium's default) and a
:class:`~xpbank.ReplaySink` writes the transitions, each tagged with its env, into the
buffer :func:`make_buffer` builds: a :class:`~xpbank.PrioritizedSampler` picks items,
:class:`~xpbank.NStep` adds their n-step returns (windows that stay inside one env's
episode), the loss is weighted by the importance weights and the absolute TD errors go
back as priorities. The target bootstraps through a truncation, never a termination.

Example:
    >>> result = train(DQNConfig(steps=400, learning_starts=200, train_freq=100,
    ...                          gradient_steps=2, eval_episodes=1))
    >>> result.env_steps, 300 < len(result.buffer) <= 400  # less the NEXT_STEP reset rows
    (400, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from xpbank.collect.collector import Collector
from xpbank.collect.sinks import ReplaySink
from xpbank.demo.evaluate import evaluate
from xpbank.demo.result import AgentResult, Progress, TimedBuffer
from xpbank.errors import require
from xpbank.nstep.option import NStep
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import PrioritizedSampler
from xpbank.spec.spec import Field, Spec

__all__ = ["DQNConfig", "make_buffer", "train", "td_errors"]


@dataclass(frozen=True)
class DQNConfig:
    """Hyper-parameters, tuned on CartPole-v1 (``docs/demo.md`` gives what they reach over seeds).

    Bursts of ``gradient_steps`` minibatches every ``train_freq`` env steps, the target
    copied after each burst (RL Zoo's schedule for CartPole), a linearly decaying
    learning rate, and prioritized (``alpha``, ``beta`` annealed to 1) 3-step replay.
    """

    env_id: str = "CartPole-v1"
    steps: int = 20_000  # env steps (all sub-envs together)
    seed: int = 0
    num_envs: int = 4
    buffer_size: int = 100_000
    batch_size: int = 128
    lr: float = 1e-3
    lr_end_fraction: float = 0.05  # linear decay of the learning rate to lr * this
    gamma: float = 0.99
    n_step: int = 3
    alpha: float = 0.6
    beta: float = 0.4
    hidden: int = 128
    learning_starts: int = 1_000
    train_freq: int = 256  # env steps between training bursts
    gradient_steps: int = 128  # minibatches per burst
    exploration_fraction: float = 0.16
    exploration_final_eps: float = 0.04
    eval_episodes: int = 10


def make_buffer(spec: Spec, config: DQNConfig) -> ReplayBuffer:
    """The prioritized n-step replay buffer the agent learns from (``spec`` + ``env_id``).

    Example:
        >>> import torch
        >>> rb = make_buffer(Spec({"obs": Field(4)}), DQNConfig())
        >>> type(rb.sampler).__name__, rb.spec["env_id"].dtype
        ('PrioritizedSampler', torch.int64)
    """
    samples = max(1, (config.steps - config.learning_starts) // config.train_freq * config.gradient_steps)
    return ReplayBuffer(
        config.buffer_size,
        Spec({**dict(spec.items()), "env_id": Field((), torch.int64)}),
        sampler=PrioritizedSampler(config.alpha, config.beta, beta_steps=samples),
        nstep=NStep(config.n_step, config.gamma),
        num_envs=config.num_envs,
        seed=config.seed,
    )


def q_network(n_obs: int, n_actions: int, hidden: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_obs, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_actions),
    )


def td_errors(q: nn.Module, target: nn.Module, batch: TensorDict) -> torch.Tensor:
    """Double-DQN n-step TD errors ``y - Q(s, a)``.

    ``y = nstep_return + nstep_discount * Q_target(s', argmax_a Q(s', a))``, where
    ``nstep_discount`` is ``gamma**k`` and 0 after a termination (a truncation keeps the
    bootstrap from its true final observation ``s'``).
    """
    q_taken = q(batch["obs"]).gather(1, batch["action"].reshape(-1, 1)).squeeze(1)
    with torch.no_grad():
        next_obs = batch["next", "obs"]
        best = q(next_obs).argmax(dim=1, keepdim=True)
        next_value = target(next_obs).gather(1, best).squeeze(1)
        y = batch["nstep_return"] + batch["nstep_discount"] * next_value
    return y - q_taken


def epsilon(step: int, config: DQNConfig) -> float:
    """Linear decay from 1 to ``exploration_final_eps`` over ``exploration_fraction`` of the run."""
    span = max(1.0, config.exploration_fraction * config.steps)
    return max(config.exploration_final_eps, 1.0 - (1.0 - config.exploration_final_eps) * step / span)


def learn(q: nn.Module, target: nn.Module, optim: Any, rb: Any, config: DQNConfig) -> None:
    """One burst: sample, weighted Huber loss, step, new priorities; then copy the target."""
    for _ in range(config.gradient_steps):
        batch = rb.sample(config.batch_size)
        td = td_errors(q, target, batch)
        loss = (
            batch["weight"] * nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")
        ).mean()
        optim.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(q.parameters(), 10.0)
        optim.step()
        rb.update_priority(batch["index"], td.detach().abs())
    target.load_state_dict(q.state_dict())


def train(config: DQNConfig, progress: Progress | None = None) -> AgentResult:
    """Train, then evaluate greedily; ``progress(env_steps, last_return)`` after each vector step."""
    gym = require("gymnasium", "gym")
    torch.manual_seed(config.seed)
    rng = np.random.default_rng(config.seed)
    envs = gym.make_vec(config.env_id, config.num_envs, vectorization_mode="sync")
    n_obs, n_actions = int(np.prod(envs.single_observation_space.shape)), int(envs.single_action_space.n)
    rb = make_buffer(Spec.from_gymnasium(envs.single_observation_space, envs.single_action_space), config)
    q, target = q_network(n_obs, n_actions, config.hidden), q_network(n_obs, n_actions, config.hidden)
    target.load_state_dict(q.state_dict())
    optim = torch.optim.Adam(q.parameters(), lr=config.lr)
    done = 0

    def act(obs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            greedy = q(obs.float()).argmax(dim=1).numpy()
        explore = rng.random(len(obs)) < epsilon(done, config)
        return torch.from_numpy(np.where(explore, rng.integers(n_actions, size=len(obs)), greedy))

    timed = TimedBuffer(rb)
    collector = Collector(envs, act, ReplaySink(timed))
    collector.reset(seed=config.seed)
    result = AgentResult(config, q, rb)
    result.start_clock()
    next_burst = config.learning_starts
    while done < config.steps:
        seen = len(collector.episodes)
        collector.collect(1)
        done += config.num_envs
        result.curve += [(done, e.ret) for e in collector.episodes[seen:]]
        if done >= next_burst:
            next_burst += config.train_freq
            for group in optim.param_groups:
                group["lr"] = config.lr * max(config.lr_end_fraction, 1.0 - done / config.steps)
            learn(q, target, optim, timed, config)
        if progress is not None:
            progress(done, result.curve[-1][1] if result.curve else None)
    envs.close()
    result.stop_clock(timed)
    result.env_steps = done
    result.eval_return = evaluate(
        lambda obs: int(q(obs).argmax()), config.env_id, config.eval_episodes, config.seed
    )
    return result
