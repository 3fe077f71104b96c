"""Double DQN on CartPole-v1 with an xpbank ReplayBuffer, end to end.

Runs on the CPU in about a minute: collects transitions from a real gymnasium env,
keeps ``terminated`` and ``truncated`` apart (the target bootstraps through a time-limit
truncation, never through a termination), samples uniform minibatches, and checks that
a saved ``state_dict`` resumes sampling exactly where it was.

    python examples/dqn_cartpole.py [--steps 30000] [--seed 0]
"""

from __future__ import annotations

import argparse
import logging
import time

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

import xpbank

log = logging.getLogger("dqn_cartpole")


def make_q_network(n_obs: int, n_actions: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(n_obs, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, n_actions)
    )


def td_loss(q: nn.Module, target: nn.Module, batch: TensorDict, gamma: float) -> torch.Tensor:
    """Double-DQN Huber loss; ``terminated`` stops the bootstrap, ``truncated`` does not."""
    q_taken = q(batch["obs"]).gather(1, batch["action"].unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        next_obs = batch["next", "obs"]
        best = q(next_obs).argmax(dim=1, keepdim=True)
        next_value = target(next_obs).gather(1, best).squeeze(1)
        not_terminal = (~batch["terminated"]).float()
        y = batch["reward"] + gamma * not_terminal * next_value
    return nn.functional.smooth_l1_loss(q_taken, y)


def epsilon(step: int, start: float = 1.0, end: float = 0.05, decay_steps: int = 10_000) -> float:
    return end + (start - end) * max(0.0, 1.0 - step / decay_steps)


def evaluate(q: nn.Module, episodes: int, seed: int) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for i in range(episodes):
        obs, _ = env.reset(seed=seed + 10_000 + i)
        done, total = False, 0.0
        while not done:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


def train(steps: int, seed: int) -> dict[str, float | int | bool]:
    torch.manual_seed(seed)
    env = gym.make("CartPole-v1")
    spec = xpbank.Spec.from_gymnasium(env.observation_space, env.action_space)
    rb = xpbank.ReplayBuffer(50_000, spec, seed=seed)
    q = make_q_network(4, 2)
    target = make_q_network(4, 2)
    target.load_state_dict(q.state_dict())
    optim = torch.optim.Adam(q.parameters(), lr=5e-4)
    rng = np.random.default_rng(seed)

    obs, _ = env.reset(seed=seed)
    episode_return, returns, truncations = 0.0, [], 0
    start = time.perf_counter()
    for step in range(steps):
        if rng.random() < epsilon(step):
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rb.add(
            {
                "obs": obs,
                "action": action,
                "reward": np.float32(reward),
                "terminated": terminated,
                "truncated": truncated,
                ("next", "obs"): next_obs,  # the true last observation, also at truncation
            }
        )
        episode_return += float(reward)
        obs = next_obs
        if terminated or truncated:
            returns.append(episode_return)
            truncations += int(truncated)
            episode_return = 0.0
            obs, _ = env.reset()

        if len(rb) >= 1_000:
            batch = rb.sample(128)
            loss = td_loss(q, target, batch, gamma=0.99)
            optim.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(q.parameters(), 10.0)
            optim.step()
        if step % 500 == 0:
            target.load_state_dict(q.state_dict())
        if step % 5_000 == 0 and returns:
            log.info(
                "step %6d  episodes %4d  mean return (last 10) %6.1f",
                step,
                len(returns),
                np.mean(returns[-10:]),
            )
    env.close()

    # A checkpoint resumes sampling exactly: same data, cursor and RNG state.
    resumed = xpbank.ReplayBuffer(rb.capacity, spec)
    resumed.load_state_dict(rb.state_dict())
    same = torch.equal(resumed.sample(64)["index"], rb.sample(64)["index"])
    return {
        "steps": steps,
        "seconds": time.perf_counter() - start,
        "episodes": len(returns),
        "truncated_episodes": truncations,
        "mean_return_last_10": float(np.mean(returns[-10:])),
        "greedy_eval_return": evaluate(q, 5, seed),
        "buffer_items": len(rb),
        "resume_samples_identical": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    result = train(args.steps, args.seed)
    for name, value in result.items():
        log.info("%-26s %s", name, f"{value:.1f}" if isinstance(value, float) else value)


if __name__ == "__main__":
    main()
