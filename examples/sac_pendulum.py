"""SAC on Pendulum-v1 with an xpbank ReplayBuffer, in one file (CleanRL style).

A Collector steps the env and writes transitions (the true final observation at a
time-limit truncation, ``terminated`` apart from ``truncated``) into a uniform
ReplayBuffer; twin soft Q-networks, a tanh-Gaussian actor and an auto-tuned entropy
temperature learn from minibatches sampled from it. Pendulum only ever truncates, so
every target bootstraps: storing the reset observation as "next" would be a silent bug.

    python examples/sac_pendulum.py [--steps 12000] [--seed 0]

What it reaches at the defaults (``docs/demo.md``): a greedy return of -109.1 for seed 0
on the project's 2-core machine; other seeds have not been measured.
The exact numbers depend on the CPU (floating-point rounding): compare ranges over seeds.
"""

from __future__ import annotations

import argparse
import logging
import time

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import xpbank
from xpbank.demo.evaluate import evaluate  # mean return of the deterministic policy
from xpbank.demo.report import NOTE

log = logging.getLogger("sac_pendulum")
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-id", default="Pendulum-v1")
    p.add_argument("--steps", type=int, default=12_000, help="env steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--buffer-size", type=int, default=100_000)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--learning-starts", type=int, default=1_000)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--tau", type=float, default=0.005, help="target smoothing")
    p.add_argument("--q-lr", type=float, default=1e-3)
    p.add_argument("--policy-lr", type=float, default=3e-4)
    p.add_argument("--policy-frequency", type=int, default=2, help="actor updates every N steps")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--eval-episodes", type=int, default=10)
    return p.parse_args(argv)


def mlp(n_in: int, n_out: int, hidden: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(n_in, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, n_out)
    )


class Actor(nn.Module):
    """Tanh-squashed Gaussian policy, rescaled to the action bounds."""

    def __init__(self, n_obs: int, n_act: int, hidden: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.net = mlp(n_obs, 2 * n_act, hidden)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2.0, dtype=torch.float32))
        self.register_buffer("bias", torch.as_tensor((high + low) / 2.0, dtype=torch.float32))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sampled action, its log-probability and the deterministic (mean) action."""
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        log_std = LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (torch.tanh(log_std) + 1)
        normal = torch.distributions.Normal(mean, log_std.exp())
        u = normal.rsample()
        y = torch.tanh(u)
        log_prob = normal.log_prob(u) - torch.log(self.scale * (1 - y.pow(2)) + 1e-6)
        return y * self.scale + self.bias, log_prob.sum(-1), torch.tanh(mean) * self.scale + self.bias


def train(args: argparse.Namespace) -> dict[str, float | int]:
    torch.manual_seed(args.seed)
    envs = gym.make_vec(
        args.env_id, 1, vectorization_mode="sync", vector_kwargs={"autoreset_mode": "SameStep"}
    )
    obs_space, act_space = envs.single_observation_space, envs.single_action_space
    n_obs, n_act = int(np.prod(obs_space.shape)), int(np.prod(act_space.shape))
    rb = xpbank.ReplayBuffer(
        args.buffer_size, xpbank.Spec.from_gymnasium(obs_space, act_space), seed=args.seed
    )

    actor = Actor(n_obs, n_act, args.hidden, act_space.low, act_space.high)
    qs = nn.ModuleList([mlp(n_obs + n_act, 1, args.hidden) for _ in range(2)])
    q_targets = nn.ModuleList([mlp(n_obs + n_act, 1, args.hidden) for _ in range(2)])
    q_targets.load_state_dict(qs.state_dict())
    q_optim = torch.optim.Adam(qs.parameters(), lr=args.q_lr)
    actor_optim = torch.optim.Adam(actor.parameters(), lr=args.policy_lr)
    log_alpha = torch.zeros(1, requires_grad=True)
    alpha_optim = torch.optim.Adam([log_alpha], lr=args.q_lr)
    target_entropy = -float(n_act)
    generator = torch.Generator().manual_seed(args.seed)
    step = 0

    def act(obs: torch.Tensor) -> torch.Tensor:
        if step < args.learning_starts:  # uniform warm-up actions, seeded
            low, high = torch.as_tensor(act_space.low), torch.as_tensor(act_space.high)
            return low + (high - low) * torch.rand(len(obs), n_act, generator=generator)
        with torch.no_grad():
            return actor(obs)[0]

    def q_values(nets: nn.ModuleList, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=-1)
        return torch.stack([q(x).squeeze(-1) for q in nets])

    collector = xpbank.Collector(envs, act, rb)
    collector.reset(seed=args.seed)
    start = time.perf_counter()
    for step in range(args.steps):
        collector.collect(1)
        if step < args.learning_starts:
            continue
        batch = rb.sample(args.batch_size)
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_obs = batch["next", "obs"]
            next_action, next_log_prob, _ = actor(next_obs)
            soft_next = q_values(q_targets, next_obs, next_action).min(0).values - alpha * next_log_prob
            # bootstrap through truncation (Pendulum's time limit), never through termination
            y = batch["reward"] + args.gamma * (~batch["terminated"]).float() * soft_next
        q_loss = (q_values(qs, batch["obs"], batch["action"]) - y).pow(2).mean(1).sum()
        q_optim.zero_grad()
        q_loss.backward()
        q_optim.step()
        if step % args.policy_frequency == 0:
            for _ in range(args.policy_frequency):  # CleanRL: delayed, but as many updates
                action, log_prob, _ = actor(batch["obs"])
                actor_loss = (alpha * log_prob - q_values(qs, batch["obs"], action).min(0).values).mean()
                actor_optim.zero_grad()
                actor_loss.backward()
                actor_optim.step()
                with torch.no_grad():
                    _, log_prob, _ = actor(batch["obs"])
                alpha_loss = -(log_alpha.exp() * (log_prob + target_entropy)).mean()
                alpha_optim.zero_grad()
                alpha_loss.backward()
                alpha_optim.step()
                alpha = log_alpha.exp().detach()
        with torch.no_grad():
            for p, tp in zip(qs.parameters(), q_targets.parameters(), strict=True):
                tp.lerp_(p, args.tau)
        if step % 2_000 == 0 and collector.episodes:
            log.info(
                "step %6d  mean return (last 5) %8.1f",
                step,
                np.mean([e.ret for e in collector.episodes[-5:]]),
            )
    envs.close()
    returns = [e.ret for e in collector.episodes]
    return {
        "steps": args.steps,
        "seconds": round(time.perf_counter() - start, 1),
        "episodes": len(returns),
        "truncated_episodes": sum(e.truncated for e in collector.episodes),
        "mean_return_last_5": float(np.mean(returns[-5:])) if returns else float("nan"),
        "eval_return": evaluate(
            lambda obs: actor(obs.unsqueeze(0))[2][0].numpy(), args.env_id, args.eval_episodes, args.seed
        ),
        "buffer_items": len(rb),
    }


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    for name, value in train(args).items():
        log.info("%-20s %s", name, f"{value:.1f}" if isinstance(value, float) else value)
    log.info("seed %d. %s", args.seed, NOTE)


if __name__ == "__main__":
    main()
