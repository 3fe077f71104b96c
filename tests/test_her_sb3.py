"""XpbankHerReplayBuffer: SB3's HerReplayBuffer arguments with SB3's real DQN, SAC and TD3."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.envs import BitFlippingEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from xpbank.errors import SpecError
from xpbank.integrations.sb3.her import XpbankHerReplayBuffer

HER = dict(n_sampled_goal=4, goal_selection_strategy="future")


def consistent(model: Any, env: BitFlippingEnv, batch_size: int = 256) -> None:
    """Every sampled reward is the env's reward of the sample's next achieved and desired goals."""
    buffer = model.replay_buffer
    assert isinstance(buffer, XpbankHerReplayBuffer)
    s = buffer.sample(batch_size)
    achieved = s.next_observations["achieved_goal"].cpu().numpy()
    desired = s.observations["desired_goal"].cpu().numpy()
    assert np.array_equal(desired, s.next_observations["desired_goal"].cpu().numpy())
    expected = env.compute_reward(achieved, desired, None)
    np.testing.assert_array_equal(s.rewards.cpu().numpy().reshape(-1), expected)
    relabelled = int(batch_size * (1 - 1 / 5))
    # BitFlippingEnv's stored goal is all ones: the relabelled goals are reached states
    assert (s.rewards[:relabelled] == 0).float().mean() > (s.rewards[relabelled:] == 0).float().mean()


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3"])
def test_sb3_algorithms_train_with_the_drop_in(algo: str) -> None:
    env = BitFlippingEnv(n_bits=4, continuous=algo != "dqn", max_steps=4)
    kwargs: dict[str, Any] = dict(
        replay_buffer_class=XpbankHerReplayBuffer, replay_buffer_kwargs=HER, learning_starts=20, seed=0,
        policy_kwargs=dict(net_arch=[16]), batch_size=32,
    )  # fmt: skip
    cls = {"dqn": DQN, "sac": SAC, "td3": TD3}[algo]
    model = cls("MultiInputPolicy", env, **kwargs)
    model.learn(120)
    assert model.replay_buffer.size() == 120
    assert model.replay_buffer.env is not None  # SB3 handed it over: the class is a HerReplayBuffer
    consistent(model, env)


def test_vector_envs_and_copied_infos() -> None:
    seen: list[int] = []

    class InfoEnv(BitFlippingEnv):
        def compute_reward(self, achieved: Any, desired: Any, info: Any) -> Any:
            if isinstance(info, list) and info and isinstance(info[0], dict):
                seen.extend(int(i.get("step", -1)) for i in info)
            return super().compute_reward(achieved, desired, info)

        def step(self, action: Any) -> Any:
            obs, r, term, trunc, info = super().step(action)
            return obs, r, term, trunc, {**info, "step": self.current_step}

    venv = DummyVecEnv([lambda: InfoEnv(n_bits=5), lambda: InfoEnv(n_bits=5)])
    model = DQN(
        "MultiInputPolicy", venv, learning_starts=10, seed=1, replay_buffer_class=XpbankHerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=2, goal_selection_strategy="episode", copy_info_dict=True),
    )  # fmt: skip
    model.learn(60)
    buffer = model.replay_buffer
    assert buffer.n_envs == 2 and buffer.size() >= 30 and len(buffer.xp) == 2 * buffer.size()
    seen.clear()
    buffer.sample(30)
    assert len(seen) == int(30 * (1 - 1 / 3)) and min(seen) >= 1  # the stored infos, not {}


def test_save_and_load_bank_resume_the_same_samples(tmp_path: Path) -> None:
    env = BitFlippingEnv(n_bits=4)
    model = DQN(
        "MultiInputPolicy", env, learning_starts=10, seed=0, replay_buffer_class=XpbankHerReplayBuffer,
        replay_buffer_kwargs=dict(n_sampled_goal=3, goal_selection_strategy="final"),
    )  # fmt: skip
    model.learn(50)
    buffer = model.replay_buffer
    path = buffer.save_bank(tmp_path / "her")
    loaded = XpbankHerReplayBuffer.load_bank(
        path, env.observation_space, env.action_space, DummyVecEnv([lambda: env])
    )
    assert (
        loaded.goal_selection_strategy == "final" and loaded.n_sampled_goal == 3 and loaded.pos == buffer.pos
    )
    for _ in range(3):
        a, b = buffer.sample(64), loaded.sample(64)
        for key in a.observations:
            assert torch.equal(a.observations[key], b.observations[key])
        assert torch.equal(a.rewards, b.rewards) and torch.equal(a.dones, b.dones)


def test_bad_arguments() -> None:
    env = BitFlippingEnv(n_bits=3)
    with pytest.raises(SpecError, match="optimize_memory_usage"):
        XpbankHerReplayBuffer(10, env.observation_space, env.action_space, optimize_memory_usage=True)
    with pytest.raises(SpecError, match="strategy"):
        XpbankHerReplayBuffer(10, env.observation_space, env.action_space, goal_selection_strategy="later")
    with pytest.raises(SpecError, match="Dict space"):
        XpbankHerReplayBuffer(10, env.observation_space["observation"], env.action_space)
    buffer = XpbankHerReplayBuffer(10, env.observation_space, env.action_space, seed=0)
    obs = {k: v[None] for k, v in env.observation_space.sample().items()}
    buffer.add(obs, obs, np.array([1]), np.array([0.0]), np.array([False]), [{}])
    with pytest.raises(SpecError, match="set_env"):
        buffer.sample(8)


@pytest.mark.slow
def test_dqn_learns_15_bits_with_her_and_not_without() -> None:
    """The HER paper's bit-flipping result, n = 15: DQN with HER solves it, without does
    not (the only reward is reaching the one goal among 2**15 states). ~20 s per run here."""
    torch.set_num_threads(1)

    def success(model: Any) -> float:
        env, wins = BitFlippingEnv(n_bits=15), 0
        for episode in range(30):
            obs, _ = env.reset(seed=100 + episode)
            for _ in range(15):
                obs, reward, terminated, truncated, _ = env.step(model.predict(obs, deterministic=True)[0])
                if terminated or truncated:
                    break
            wins += reward == 0
        return wins / 30

    results = []
    for her in (True, False):
        kwargs: dict[str, Any] = (
            dict(replay_buffer_class=XpbankHerReplayBuffer, replay_buffer_kwargs=HER) if her else {}
        )
        model = DQN(
            "MultiInputPolicy", BitFlippingEnv(n_bits=15), learning_rate=1e-3, train_freq=1,
            learning_starts=200,
            exploration_fraction=0.3, exploration_final_eps=0.02, target_update_interval=250, batch_size=64,
            buffer_size=50_000, policy_kwargs=dict(net_arch=[128]), seed=0, **kwargs,
        )  # fmt: skip
        model.learn(4000)
        results.append(success(model))
    assert results[0] >= 0.8 and results[1] <= 0.1, results
