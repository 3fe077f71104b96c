"""XpbankMixtureReplayBuffer: SB3 batches mixed from the live buffer and banks of earlier runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from stable_baselines3 import SAC  # noqa: E402

import xpbank  # noqa: E402
from xpbank import PrioritizedSampler, SpecError  # noqa: E402
from xpbank.integrations.sb3 import XpbankMixtureReplayBuffer, XpbankReplayBuffer  # noqa: E402
from xpbank.mix import Linear  # noqa: E402

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Box(-2, 2, (1,), np.float32)


def _fill(buf: XpbankReplayBuffer, n: int, reward: float, start: int = 0) -> None:
    """n one-env steps whose obs[0] counts up from ``start`` and whose reward is ``reward``."""
    for t in range(start, start + n):
        obs = np.full((1, 3), t, np.float32)
        buf.add(obs, obs + 1, np.zeros((1, 1), np.float32), np.array([reward]), np.array([False]), [{}])


def _bank(tmp_path: Path, n: int = 40, reward: float = -1.0, **kw) -> Path:
    old = XpbankReplayBuffer(100, OBS, ACT, "cpu", seed=0, **kw)
    _fill(old, n, reward, start=1000)
    return Path(old.save_bank(tmp_path / "old"))


def test_every_batch_holds_its_exact_share_of_live_and_bank_items(tmp_path: Path) -> None:
    path = _bank(tmp_path)
    weights = [Linear(0.5, 1.0, steps=4), Linear(0.5, 0.0, steps=4)]
    buf = XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path], weights=weights, seed=1)
    _fill(buf, 10, 0.0)
    bank_items = []
    for expected_offline in (5, 4, 2, 1, 0, 0):  # quotas 5, 3.75, 2.5 (tie: live first), 1.25, 0
        s = buf.sample(10)
        from_bank = (s.rewards.flatten() == -1.0).tolist()
        assert from_bank == [False] * (10 - expected_offline) + [True] * expected_offline
        obs0 = s.observations[:, 0]
        assert bool(((obs0 >= 1000) == torch.tensor(from_bank)).all())  # each item's own fields
        assert torch.equal(s.next_observations, s.observations + 1)
        bank_items += obs0[10 - expected_offline :].tolist()
    assert buf.mixture.step == 6 and set(bank_items) <= set(range(1000, 1040))
    assert len(buf.mixture.sources[1]) == 40  # the bank, opened read-only, is unchanged


def test_a_buffer_is_mixed_in_as_it_is(tmp_path: Path) -> None:
    other = XpbankReplayBuffer(100, OBS, ACT, "cpu", seed=3)
    _fill(other, 5, 7.0, start=500)
    buf = XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[other.xp], weights=[1, 3], seed=1)
    _fill(buf, 5, 0.0)
    assert buf.mixture.sources[1] is other.xp
    assert buf.sample(8).rewards.flatten().tolist() == [0.0] * 2 + [7.0] * 6


def test_offline_sources_that_cannot_give_these_transitions_are_refused(tmp_path: Path) -> None:
    path = _bank(tmp_path)
    with pytest.raises(SpecError, match=r"offline: expected a list of bank paths or buffers, got one"):
        XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=path, weights=[1, 1])
    wide = gym.spaces.Box(-10, 10, (4,), np.float32)
    with pytest.raises(
        SpecError, match=r"offline\[0\]: field 'obs': expected \(4,\) torch.float32 .*got \(3,\)"
    ):
        XpbankMixtureReplayBuffer(100, wide, ACT, "cpu", offline=[path], weights=[1, 1])
    plain = xpbank.ReplayBuffer(10, seed=0)
    plain.extend({"obs": torch.zeros(2, 3)})
    with pytest.raises(
        SpecError, match=r"offline\[1\]: field 'action': expected \(1,\) torch.float32 .*got no such"
    ):
        XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path, plain], weights=[1, 1, 1])
    empty = XpbankReplayBuffer(100, OBS, ACT, "cpu", seed=0)
    with pytest.raises(SpecError, match=r"offline\[0\]: holds no transitions"):
        XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[empty.xp], weights=[1, 1])
    nstep_bank = _bank(tmp_path / "n3", n_steps=3)
    with pytest.raises(SpecError, match=r"offline\[0\]: n-step option: expected None, got \{'n': 3"):
        XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[nstep_bank], weights=[1, 1])
    with pytest.raises(xpbank.CapacityError, match="one per source"):
        XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path], weights=[1])


def test_n_step_targets_come_from_each_source(tmp_path: Path) -> None:
    path = _bank(tmp_path, n_steps=3)
    buf = XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path], weights=[1, 1], n_steps=3, seed=1)
    _fill(buf, 10, 0.0)
    s = buf.sample(8)
    assert s.rewards.flatten().tolist()[:4] == [0.0] * 4  # live: zero rewards
    assert s.discounts is not None and s.discounts.shape == (8, 1)
    # bank: a window of k steps of reward -1 sums to -(1 + g + ... g^(k-1)), and discounts = g^k
    k = torch.round(torch.log(s.discounts[4:]) / np.log(0.99))
    expected = -(1 - 0.99**k) / (1 - 0.99)
    torch.testing.assert_close(s.rewards[4:], expected.float(), rtol=1e-5, atol=1e-5)


def test_sample_batch_routes_through_the_mixture_and_refuses_live_priorities(tmp_path: Path) -> None:
    path = _bank(tmp_path)
    buf = XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path], weights=[1, 1], seed=1)
    _fill(buf, 10, 0.0)
    samples, batch = buf.sample_batch(6)
    assert batch["source"].tolist() == [0, 0, 0, 1, 1, 1]
    assert torch.equal(samples.rewards.flatten(), batch["reward"])
    prioritized = XpbankMixtureReplayBuffer(
        100, OBS, ACT, "cpu", offline=[path], weights=[1, 1], sampler=PrioritizedSampler()
    )
    _fill(prioritized, 10, 0.0)
    with pytest.raises(SpecError, match=r"mixture.update_priority\(batch\['source'\]"):
        prioritized.sample_batch(6)
    assert prioritized.mixture.step == 0


def test_save_and_load_bank_resume_the_schedule_and_the_draws(tmp_path: Path) -> None:
    path = _bank(tmp_path)
    weights = [Linear(0.5, 1.0, steps=10), Linear(0.5, 0.0, steps=10)]
    buf = XpbankMixtureReplayBuffer(100, OBS, ACT, "cpu", offline=[path], weights=weights, seed=1)
    _fill(buf, 10, 0.0)
    for _ in range(3):
        buf.sample(16)
    saved = buf.save_bank(tmp_path / "live")
    back = XpbankMixtureReplayBuffer.load_bank(saved, OBS, ACT, "cpu", offline=[path], weights=weights)
    assert back.mixture.step == 3 and back.size() == 10 and back.pos == buf.pos
    a, b = buf.sample(16), back.sample(16)
    assert torch.equal(a.observations, b.observations) and torch.equal(a.rewards, b.rewards)
    with pytest.raises(SpecError, match="saved with weights"):
        XpbankMixtureReplayBuffer.load_bank(saved, OBS, ACT, "cpu", offline=[path], weights=[1, 1])
    with pytest.raises(xpbank.BankError, match=r"no 'xpbank\.mix' entry"):
        XpbankMixtureReplayBuffer.load_bank(path, OBS, ACT, "cpu", offline=[path], weights=[1, 1])
    plain = buf.mixture.save(tmp_path / "plain")  # the mixture's state only
    with pytest.raises(xpbank.BankError, match=r"no 'xpbank\.integrations\.sb3\.mix' entry"):
        XpbankMixtureReplayBuffer.load_bank(plain, OBS, ACT, "cpu", offline=[path], weights=weights)


def test_sac_trains_from_a_bank_and_its_own_steps(tmp_path: Path) -> None:
    env = gym.make("Pendulum-v1")
    old = SAC("MlpPolicy", env, replay_buffer_class=XpbankReplayBuffer, buffer_size=1_000,
              learning_starts=50, batch_size=16, seed=0, policy_kwargs={"net_arch": [8]})  # fmt: skip
    old.learn(120)
    path = old.replay_buffer.save_bank(tmp_path / "old")
    model = SAC(
        "MlpPolicy", env, replay_buffer_class=XpbankMixtureReplayBuffer,
        replay_buffer_kwargs={"offline": [path], "weights": [0.5, 0.5]}, buffer_size=1_000,
        learning_starts=50, batch_size=16, seed=1, policy_kwargs={"net_arch": [8]},
    )  # fmt: skip
    model.learn(120)
    buf = model.replay_buffer
    assert isinstance(buf, XpbankMixtureReplayBuffer) and buf.size() == 120
    assert buf.mixture.step == model._n_updates > 0  # one mixed batch per gradient step
    assert len(buf.mixture.sources[1]) == 120 and buf.mixture.sources[1].storage.spec == buf.xp.spec
