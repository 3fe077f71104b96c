"""SB3's real DQN, SAC and TD3 train with xpbank's buffers (learning runs are marked slow).

Each learning run is seeded and bounded (a few thousand env steps, well under a minute
on a quiet core) and asserts a clear improvement of the greedy policy's mean return over
10 evaluation episodes against the same model before training.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
pytest.importorskip("gymnasium")

from stable_baselines3 import DQN, SAC, TD3
from stable_baselines3.common.evaluation import evaluate_policy

from xpbank import FrameStorage
from xpbank.integrations.sb3 import PrioritizedDQN, XpbankReplayBuffer

DQN_CARTPOLE = {
    "learning_rate": 2e-3,
    "batch_size": 64,
    "buffer_size": 10_000,
    "learning_starts": 500,
    "train_freq": 4,
    "gradient_steps": 2,
    "target_update_interval": 100,
    "exploration_fraction": 0.15,
    "exploration_final_eps": 0.02,
    "policy_kwargs": {"net_arch": [64, 64]},
    "device": "cpu",
}


def returns_before_and_after(model, steps: int) -> tuple[float, float]:
    torch.set_num_threads(1)
    before = evaluate_policy(model, model.get_env(), n_eval_episodes=10)[0]
    model.learn(steps)
    return before, evaluate_policy(model, model.get_env(), n_eval_episodes=10)[0]


@pytest.mark.slow
def test_dqn_learns_cartpole_with_xpbank_buffer():
    model = DQN("MlpPolicy", "CartPole-v1", replay_buffer_class=XpbankReplayBuffer, seed=0, **DQN_CARTPOLE)
    before, after = returns_before_and_after(model, 6000)
    assert isinstance(model.replay_buffer, XpbankReplayBuffer) and model.replay_buffer.full is False
    assert after >= 80 and after >= before + 50, (before, after)  # untrained: ~10-25 steps


@pytest.mark.slow
def test_dqn_learns_cartpole_with_optimize_memory_usage():
    """Next-observation dedup (FrameStorage) with SB3's default time-limit handling,
    which SB3's own optimized buffer refuses."""
    model = DQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_class=XpbankReplayBuffer, optimize_memory_usage=True,
        seed=0, **DQN_CARTPOLE,
    )  # fmt: skip
    before, after = returns_before_and_after(model, 6000)
    assert isinstance(model.replay_buffer.xp.storage, FrameStorage)
    assert after >= 80 and after >= before + 50, (before, after)


@pytest.mark.slow
def test_prioritized_dqn_learns_cartpole():
    model = PrioritizedDQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_CARTPOLE)
    before, after = returns_before_and_after(model, 6000)
    leaves = model.replay_buffer.xp.sampler.state_dict()["priorities"]
    assert len(leaves.unique()) > 100  # the TD errors came back as priorities
    assert after >= 80 and after >= before + 50, (before, after)


@pytest.mark.slow
def test_sac_learns_pendulum_with_xpbank_buffer():
    model = SAC(
        "MlpPolicy", "Pendulum-v1", learning_rate=3e-3, learning_starts=200, batch_size=256, gamma=0.95,
        policy_kwargs={"net_arch": [64, 64]}, seed=0, device="cpu", replay_buffer_class=XpbankReplayBuffer,
    )  # fmt: skip
    before, after = returns_before_and_after(model, 2500)
    assert after >= before + 300, (before, after)  # untrained: about -1200


def test_td3_and_sb3_buffer_save_load_run_with_xpbank_buffer(tmp_path):
    """TD3 trains a few steps on it; SB3's save_replay_buffer / load_replay_buffer round-trip it."""
    model = TD3(
        "MlpPolicy", "Pendulum-v1", learning_starts=50, buffer_size=1000, seed=0, device="cpu",
        policy_kwargs={"net_arch": [16]}, replay_buffer_class=XpbankReplayBuffer,
    )  # fmt: skip
    model.learn(120)
    buffer = model.replay_buffer
    assert buffer.size() == 120 and buffer.pos == 120 and model._n_updates > 0
    model.save_replay_buffer(tmp_path / "rb.pkl")
    model.replay_buffer = None
    model.load_replay_buffer(tmp_path / "rb.pkl")
    back = model.replay_buffer
    assert isinstance(back, XpbankReplayBuffer) and (back.size(), back.pos) == (120, 120)
    a, b = back.xp.sample_all(), buffer.xp.sample_all()
    assert all(torch.equal(a[k], b[k]) for k in ("obs", "action", "reward", "index"))
    model.learn(30, reset_num_timesteps=False)
    assert back.size() == 150 and np.isfinite(back.sample(8).rewards.numpy()).all()


def test_readme_sb3_example_runs(tmp_path, monkeypatch):
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    match = re.search(r"For Stable-Baselines3.*?```python\n(.*?)```", text, re.S)
    assert match is not None
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(match.group(1), "README.md", "exec"), scope)
    back = XpbankReplayBuffer.load_bank(
        scope["path"], scope["sac"].observation_space, scope["sac"].action_space
    )
    assert back.buffer_size == 1_000_000 and back.size() == 0
    assert type(scope["dqn"].replay_buffer.xp.sampler).__name__ == "PrioritizedSampler"
