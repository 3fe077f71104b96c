"""A small vectorized gymnasium task (CartPole, continuous action) as rsl_rl's ``VecEnv``,
and an rsl_rl PPO training loop over a storage: shared by the rsl_rl compat tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

TIME_LIMIT = 100


def make_env(num_envs: int, seed: int) -> Any:
    """CartPole with a time limit of ``TIME_LIMIT``, resetting in the same step (the true
    final observation is in the extras), as an ``rsl_rl.env.VecEnv``."""
    import gymnasium as gym
    from rsl_rl.env import VecEnv

    class CartPoleVec(VecEnv):
        def __init__(self) -> None:
            self.env = gym.make_vec(
                "CartPole-v1",
                num_envs=num_envs,
                vectorization_mode="sync",
                vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
                max_episode_steps=TIME_LIMIT,
            )
            self.num_envs, self.num_actions, self.device, self.cfg = num_envs, 1, "cpu", {}
            self.max_episode_length = TIME_LIMIT
            self.episode_length_buf = torch.zeros(num_envs, dtype=torch.long)
            obs, _ = self.env.reset(seed=seed)
            self.obs = torch.as_tensor(obs, dtype=torch.float32)
            self.finished: list[int] = []  # lengths of finished episodes

        def get_observations(self) -> TensorDict:
            return TensorDict({"policy": self.obs}, batch_size=[num_envs])

        def step(self, actions: torch.Tensor) -> tuple[TensorDict, torch.Tensor, torch.Tensor, dict]:
            obs, rew, term, trunc, info = self.env.step((actions[:, 0] > 0).long().numpy())
            done = term | trunc
            self.episode_length_buf += 1
            self.finished += self.episode_length_buf[torch.as_tensor(done)].tolist()
            self.episode_length_buf[torch.as_tensor(done)] = 0
            self.obs = torch.as_tensor(obs, dtype=torch.float32)
            final = self.obs.clone()
            if done.any():
                final[torch.as_tensor(done)] = torch.as_tensor(
                    np.stack(info["final_obs"][done]), dtype=torch.float32
                )
            extras = {
                "time_outs": torch.as_tensor(trunc & ~term),
                "final_obs": TensorDict({"policy": final}, [num_envs]),
            }
            return (
                self.get_observations(),
                torch.as_tensor(rew, dtype=torch.float32),
                torch.as_tensor(done),
                extras,
            )

    return CartPoleVec()


def make_ppo(env: Any, storage_class: Any, steps: int, **storage_kwargs: Any) -> Any:
    """rsl_rl's real PPO with small MLP actor/critic over ``storage_class``."""
    from rsl_rl.algorithms import PPO
    from rsl_rl.models import MLPModel
    from rsl_rl.modules.distribution import GaussianDistribution

    obs = env.get_observations()
    groups = {"actor": ["policy"], "critic": ["policy"]}
    dist = {"class_name": GaussianDistribution, "init_std": 1.0}
    actor = MLPModel(obs, groups, "actor", 1, hidden_dims=[32, 32], distribution_cfg=dist)
    critic = MLPModel(obs, groups, "critic", 1, hidden_dims=[32, 32])
    storage = storage_class("rl", env.num_envs, steps, obs, [1], **storage_kwargs)
    return PPO(
        actor, critic, storage, num_learning_epochs=4, num_mini_batches=4, learning_rate=3e-3, gamma=0.98
    )


def train(ppo: Any, env: Any, iterations: int, steps: int, true_final: bool) -> list[float]:
    """rsl_rl's rollout loop (``act`` / ``process_env_step`` / ``compute_returns`` /
    ``update``); ``true_final`` bootstraps time-outs from ``V(final obs)`` through the
    xpbank storage instead of rsl_rl's ``V(s_t)``. Returns the mean episode length of
    the episodes finished in each iteration."""
    obs = env.get_observations()
    means = []
    for _ in range(iterations):
        env.finished = []
        with torch.inference_mode():
            for _ in range(steps):
                actions = ppo.act(obs)
                obs, rewards, dones, extras = env.step(actions)
                if true_final:  # our Transition fields; rsl_rl's reward hack skipped
                    ppo.transition.time_outs = extras["time_outs"]
                    ppo.transition.final_values = ppo.critic(extras["final_obs"]).detach()
                    extras = {}
                ppo.process_env_step(obs, rewards, dones, extras)
            if true_final:
                ppo.storage.compute_returns(ppo.critic(obs).detach(), ppo.gamma, ppo.lam)
            else:
                ppo.compute_returns(obs)
        ppo.update()
        means.append(float(np.mean(env.finished)) if env.finished else float(steps))
    return means
