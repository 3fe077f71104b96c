"""XpbankReplayBuffer(n_steps=...) against SB3's own NStepReplayBuffer fed the same stream:
the same targets for the same sampled (row, env), through terminations, truncations,
several envs and the ring's wrap; and DQN / PrioritizedDQN using it."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import NStepReplayBuffer  # noqa: E402

from sb3_stream import chained  # noqa: E402
from xpbank import SpecError  # noqa: E402
from xpbank.integrations.sb3 import PrioritizedDQN, XpbankReplayBuffer  # noqa: E402

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(4)
FIELDS = ("observations", "actions", "next_observations", "dones", "rewards", "discounts")


def fed(size, n_envs, steps, n_steps, gamma, handle_timeout=True, optimize=False, seed=0):
    kw = {"n_envs": n_envs, "handle_timeout_termination": handle_timeout, "n_steps": n_steps, "gamma": gamma}
    ref = NStepReplayBuffer(size, OBS, ACT, "cpu", **kw)
    buf = XpbankReplayBuffer(size, OBS, ACT, "cpu", optimize_memory_usage=optimize, seed=0, **kw)
    for args in chained(seed, n_envs, steps, ACT, p_done=0.2):
        ref.add(*args)
        buf.add(*args)
    return ref, buf


def assert_same(ours, theirs):
    for name in FIELDS:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.shape == b.shape and a.dtype == b.dtype, name
        # SB3 sums in float32, xpbank in float64: the last bit of a return may differ
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize(("n_envs", "steps"), [(1, 17), (3, 29), (4, 12)])  # wrapped, wrapped, not full
def test_every_row_and_env_gets_sb3s_nstep_target(n_envs, steps, handle_timeout):
    ref, buf = fed(60, n_envs, steps, n_steps=3, gamma=0.9, handle_timeout=handle_timeout)
    assert (buf.pos, buf.full) == (ref.pos, ref.full)
    rows = np.arange(ref.buffer_size if ref.full else ref.pos)
    dones = np.asarray(buf.dones)[rows]
    assert dones.any() and (buf.timeouts[rows].any() or not handle_timeout)  # both kinds of ends
    for seed in range(4):  # SB3 draws each row's env from NumPy's global generator
        np.random.seed(seed)
        theirs = ref._get_samples(rows)
        np.random.seed(seed)
        ours = buf._get_samples(rows)
        assert_same(ours, theirs)
    discounts = ours.discounts.flatten()
    assert (discounts < 0.9**3 + 1e-6).any() and (discounts < 0.9**2 + 1e-6).any()  # windows cut short


def test_sampled_items_get_sb3s_targets(monkeypatch):
    ref, buf = fed(64, 4, 40, n_steps=4, gamma=0.95)
    ours, batch = buf.sample_batch(256)
    slots = batch["index"].numpy() % buf.xp.capacity
    rows, envs = slots // 4, slots % 4
    monkeypatch.setattr(np.random, "randint", lambda *a, **k: envs)  # SB3 reads the items xpbank drew
    assert_same(ours, ref._get_samples(rows))
    assert batch["nstep_steps"].min() >= 1 and batch["nstep_steps"].max() == 4


def test_memory_optimized_nstep_matches_the_plain_buffer():
    _, plain = fed(40, 2, 31, n_steps=3, gamma=0.8)
    _, dedup = fed(40, 2, 31, n_steps=3, gamma=0.8, optimize=True)  # SB3's raises NotImplementedError
    rows = np.arange(plain.buffer_size)
    np.random.seed(1)
    a = plain._get_samples(rows)
    np.random.seed(1)
    assert_same(dedup._get_samples(rows), a)


def test_bad_nstep_arguments():
    with pytest.raises(SpecError, match=r"n_steps: expected a positive int, got 0"):
        XpbankReplayBuffer(10, OBS, ACT, "cpu", n_steps=0)
    with pytest.raises(SpecError, match=r"gamma: expected a number in \[0, 1\], got 1.5"):
        XpbankReplayBuffer(10, OBS, ACT, "cpu", n_steps=2, gamma=1.5)


def test_dqn_takes_sb3s_nstep_kwargs():
    model = DQN(
        "MlpPolicy", "CartPole-v1", learning_starts=50, seed=0, replay_buffer_class=XpbankReplayBuffer,
        replay_buffer_kwargs={"n_steps": 3, "gamma": 0.99}, device="cpu",
    )  # fmt: skip
    model.learn(120)
    assert model.replay_buffer.xp.config()["nstep"]["n"] == 3
    sample = model.replay_buffer.sample(32)
    assert sample.discounts is not None and torch.all(sample.discounts <= 0.99**1 + 1e-6)


def test_prioritized_dqn_n_steps_without_sb3s_ignored_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3's "n_steps=3 is ignored" would raise here
        model = PrioritizedDQN(
            "MlpPolicy", "CartPole-v1", learning_starts=50, seed=0, n_steps=3, device="cpu"
        )
    assert model.n_steps == 3 and model.replay_buffer.n_steps == 3
    assert model.replay_buffer.xp.config()["nstep"] == {"n": 3, "gamma": 0.99, **_keys()}
    model.learn(150)  # train() reads discounts (gamma ** k) from the samples


def _keys():
    return {"reward_key": "reward", "next_keys": [["next", "obs"], "terminated", "truncated"]}


def test_dedup_cut_warning_replaced_by_a_log_line(caplog):
    model = PrioritizedDQN(
        "MlpPolicy", "CartPole-v1", learning_starts=10, seed=0, optimize_memory_usage=True, device="cpu"
    )
    model.learn(60)
    with caplog.at_level(logging.INFO, logger="xpbank.integrations.sb3.views"), warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3's "last trajectory ... truncated" would raise here
        model.learn(40)  # reset_num_timesteps=True: SB3 cuts the newest row
    assert any("as truncations, which bootstrap" in r.getMessage() for r in caplog.records)
    # the cut step is stored truncated (not terminated) and the run went on
    assert bool(model.replay_buffer.xp.episodes.truncated([59]).all())
    plain = DQN(
        "MlpPolicy", "CartPole-v1", learning_starts=10, seed=0, optimize_memory_usage=True,
        replay_buffer_class=XpbankReplayBuffer, device="cpu",
    )  # fmt: skip
    plain.learn(30)
    with pytest.warns(UserWarning, match="The last trajectory in the replay buffer will be truncated"):
        plain.learn(20)  # SB3's own DQN still warns: the docs say what xpbank does instead
