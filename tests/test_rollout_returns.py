"""Returns: hand-worked answers, brute-force references, and SB3 / rsl_rl on agreeing inputs."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from xpbank import SpecError, discounted_returns, gae, normalize_advantages, nstep_targets, vtrace

GAMMA, LAM = 0.9, 0.8


def _episode_data(seed: int, t: int = 12, n: int = 5, p_term: float = 0.15, p_trunc: float = 0.1):
    g = np.random.default_rng(seed)
    rewards = g.normal(size=(t, n)).astype(np.float32)
    values = g.normal(size=(t, n)).astype(np.float32)
    term = g.random((t, n)) < p_term
    trunc = (g.random((t, n)) < p_trunc) & ~term
    final = g.normal(size=(t, n)).astype(np.float32)  # V(true final obs), read where truncated
    last = g.normal(size=n).astype(np.float32)
    next_values = np.concatenate([values[1:], last[None]], 0)
    next_values = np.where(trunc, final, next_values)
    return rewards, values, next_values, term, trunc


def _ref_gae(r, v, nv, term, trunc, gamma, lam):
    """A[t] = sum_k (gamma lam)^k delta[t+k], summed until the episode or rollout ends."""
    t_len, n = r.shape
    adv = np.zeros((t_len, n))
    for e in range(n):
        for t in range(t_len):
            total, k = 0.0, t
            while True:
                delta = r[k, e] + gamma * (0.0 if term[k, e] else nv[k, e]) - v[k, e]
                total += (gamma * lam) ** (k - t) * delta
                if term[k, e] or trunc[k, e] or k == t_len - 1:
                    break
                k += 1
            adv[t, e] = total
    return adv


def test_gae_constant_value_terminal_reward_by_hand() -> None:
    # 3 steps, V = 1 everywhere, reward 1 only at the terminal step 2
    r = torch.tensor([[0.0], [0.0], [1.0]])
    v = torch.ones(3, 1)
    term = torch.tensor([[False], [False], [True]])
    no = torch.zeros(3, 1, dtype=torch.bool)
    adv, ret = gae(r, v, v, term, no, GAMMA, LAM)
    # deltas: 0 + .9 - 1 = -.1, -.1, 1 - 1 = 0 (no bootstrap after termination)
    d = [-0.1, -0.1, 0.0]
    want = [d[0] + 0.72 * d[1] + 0.72**2 * d[2], d[1] + 0.72 * d[2], d[2]]
    assert adv[:, 0].tolist() == pytest.approx(want, abs=1e-6)
    assert ret[:, 0].tolist() == pytest.approx([w + 1 for w in want], abs=1e-6)
    # the same data truncated instead: step 2 bootstraps from the final observation's value (1)
    adv_t, _ = gae(r, v, v, no, term, GAMMA, LAM)
    d_t = [-0.1, -0.1, 1.0 + 0.9 - 1.0]
    want_t = [d_t[0] + 0.72 * d_t[1] + 0.72**2 * d_t[2], d_t[1] + 0.72 * d_t[2], d_t[2]]
    assert adv_t[:, 0].tolist() == pytest.approx(want_t, abs=1e-6)
    assert adv_t[2, 0] - adv[2, 0] == pytest.approx(0.9)


def test_gae_recursion_stops_at_episode_end_of_one_env_among_many() -> None:
    r = torch.tensor([[1.0, 1.0], [5.0, 5.0]])
    v = torch.zeros(2, 2)
    term = torch.tensor([[True, False], [False, False]])
    no = torch.zeros(2, 2, dtype=torch.bool)
    adv, _ = gae(r, v, v, term, no, 0.5, 1.0)
    assert adv[0].tolist() == [1.0, 1.0 + 0.5 * 5.0]  # env 0 does not see the next episode's reward


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_brute_force(seed: int) -> None:
    r, v, nv, term, trunc = _episode_data(seed)
    adv, ret = gae(r, v, nv, term, trunc, GAMMA, LAM)
    want = _ref_gae(r, v, nv, term, trunc, GAMMA, LAM)
    np.testing.assert_allclose(adv.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), want + v, atol=1e-5)


def test_gae_accepts_rsl_rl_shapes_and_float_dones_and_keeps_inputs() -> None:
    r, v, nv, term, trunc = _episode_data(7)
    rt = torch.from_numpy(r).unsqueeze(-1)
    before = rt.clone()
    adv, _ = gae(rt, torch.from_numpy(v)[..., None], nv, term.astype(np.float32), trunc, GAMMA, LAM)
    np.testing.assert_allclose(adv.numpy(), _ref_gae(r, v, nv, term, trunc, GAMMA, LAM), atol=1e-5)
    assert torch.equal(rt, before)


def test_gae_rejects_bad_shapes_and_discounts() -> None:
    r = torch.zeros(4, 2)
    with pytest.raises(SpecError, match=r"values: expected shape \[4, 2\] \(time-major\), got \[4, 3\]"):
        gae(r, torch.zeros(4, 3), r, r, r)
    with pytest.raises(SpecError, match=r"gamma: expected a discount in \[0, 1\], got 1.5"):
        gae(r, r, r, r, r, gamma=1.5)
    with pytest.raises(SpecError, match=r"lam: expected a value in \[0, 1\], got -0.1"):
        gae(r, r, r, r, r, lam=-0.1)


def _sb3_advantages(r, v, term, trunc, final, last, gamma, lam):
    """SB3's RolloutBuffer: truncation folded into the reward as SB3's collector does."""
    from gymnasium import spaces
    from stable_baselines3.common.buffers import RolloutBuffer as SB3Buffer

    t_len, n = r.shape
    buf = SB3Buffer(t_len, spaces.Box(-1, 1, (1,)), spaces.Box(-1, 1, (1,)), "cpu", lam, gamma, n)
    done = term | trunc
    starts = np.concatenate([np.zeros((1, n), bool), done[:-1]], 0)
    reward = r + gamma * np.where(trunc, final, 0.0)  # on_policy_algorithm.collect_rollouts
    for t in range(t_len):
        buf.add(
            np.zeros((n, 1), np.float32),
            np.zeros((n, 1), np.float32),
            reward[t],
            starts[t],
            torch.from_numpy(v[t]),
            torch.zeros(n),
        )
    buf.compute_returns_and_advantage(torch.from_numpy(last), done[-1])
    return buf.advantages, buf.returns


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_stable_baselines3(seed: int) -> None:
    g = np.random.default_rng(seed)
    t_len, n = 16, 6
    r = g.normal(size=(t_len, n)).astype(np.float32)
    v = g.normal(size=(t_len, n)).astype(np.float32)
    term = g.random((t_len, n)) < 0.1
    trunc = (g.random((t_len, n)) < 0.1) & ~term
    final = g.normal(size=(t_len, n)).astype(np.float32)
    last = g.normal(size=n).astype(np.float32)
    nv = np.where(trunc, final, np.concatenate([v[1:], last[None]], 0))
    adv, ret = gae(r, v, nv, term, trunc, GAMMA, LAM)
    sb3_adv, sb3_ret = _sb3_advantages(r, v, term, trunc, final, last, GAMMA, LAM)
    np.testing.assert_allclose(adv.numpy(), sb3_adv, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), sb3_ret, atol=1e-5)


class _Critic:
    """What rsl_rl's compute_returns asks of its critic: the last values, a hidden state."""

    def __init__(self, last: torch.Tensor):
        self.last = last

    def __call__(self, obs: object) -> torch.Tensor:
        return self.last

    def get_hidden_state(self) -> None:
        return None

    def reset(self, dones: object = None, hidden_state: object = None) -> None:
        return None


def _rsl_rl_returns(r, v, dones, last, gamma, lam):
    """rsl_rl's PPO.compute_returns, run on a stand-in for its storage and critic."""
    from rsl_rl.algorithms.ppo import PPO

    t_len, _ = r.shape
    storage = SimpleNamespace(
        num_transitions_per_env=t_len,
        values=torch.from_numpy(v)[..., None],
        rewards=torch.from_numpy(r)[..., None],
        dones=torch.from_numpy(dones)[..., None].byte(),
        returns=torch.zeros(t_len, r.shape[1], 1),
        advantages=None,
    )
    fake = SimpleNamespace(
        storage=storage,
        critic=_Critic(torch.from_numpy(last)[:, None]),
        gamma=gamma,
        lam=lam,
        normalize_advantage_per_mini_batch=True,  # keep the raw advantages to compare
    )
    PPO.compute_returns(fake, None)
    return storage.advantages[..., 0].numpy(), storage.returns[..., 0].numpy()


@pytest.mark.parametrize("seed", range(3))
def test_gae_matches_rsl_rl_on_terminations(seed: int) -> None:
    # rsl_rl's dones are terminations here; its time-outs add gamma * V(s_t) to the
    # reward instead of V(s_{t+1}) (the flaw xpbank avoids), so no truncation is compared.
    g = np.random.default_rng(100 + seed)
    t_len, n = 16, 6
    r = g.normal(size=(t_len, n)).astype(np.float32)
    v = g.normal(size=(t_len, n)).astype(np.float32)
    term = g.random((t_len, n)) < 0.15
    last = g.normal(size=n).astype(np.float32)
    nv = np.concatenate([v[1:], last[None]], 0)
    adv, ret = gae(r, v, nv, term, np.zeros_like(term), GAMMA, LAM)
    rsl_adv, rsl_ret = _rsl_rl_returns(r, v, term, last, GAMMA, LAM)
    np.testing.assert_allclose(adv.numpy(), rsl_adv, atol=1e-5)
    np.testing.assert_allclose(ret.numpy(), rsl_ret, atol=1e-5)


def _ref_vtrace(blp, tlp, r, v, nv, term, trunc, gamma, rho_bar, c_bar, lam):
    """IMPALA's sum form: vs[t] = V[t] + sum_s gamma^(s-t) (prod_{i<s} c_i) delta_s, per episode."""
    t_len, n = r.shape
    rho = np.exp(tlp - blp)
    vs = np.zeros((t_len, n))
    for e in range(n):
        for t in range(t_len):
            total, prod, k = 0.0, 1.0, t
            while True:
                boot = 0.0 if term[k, e] else gamma * nv[k, e]
                delta = min(rho_bar, rho[k, e]) * (r[k, e] + boot - v[k, e])
                total += gamma ** (k - t) * prod * delta
                if term[k, e] or trunc[k, e] or k == t_len - 1:
                    break
                prod *= lam * min(c_bar, rho[k, e])
                k += 1
            vs[t, e] = v[t, e] + total
    adv = np.zeros((t_len, n))
    for e in range(n):
        for t in range(t_len):
            ended = term[t, e] or trunc[t, e] or t == t_len - 1
            nxt = nv[t, e] if ended else vs[t + 1, e]
            boot = 0.0 if term[t, e] else gamma * nxt
            adv[t, e] = min(rho_bar, rho[t, e]) * (r[t, e] + boot - v[t, e])
    return adv, vs


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("rho_bar", "c_bar", "lam"), [(1.0, 1.0, 1.0), (0.8, 0.5, 0.9)])
def test_vtrace_matches_brute_force_off_policy(seed: int, rho_bar: float, c_bar: float, lam: float) -> None:
    r, v, nv, term, trunc = _episode_data(seed)
    g = np.random.default_rng(seed + 50)
    blp = g.normal(size=r.shape).astype(np.float32)
    tlp = (blp + g.normal(scale=0.7, size=r.shape)).astype(np.float32)
    adv, vs = vtrace(blp, tlp, r, v, nv, term, trunc, GAMMA, rho_bar, c_bar, lam)
    want_adv, want_vs = _ref_vtrace(blp, tlp, r, v, nv, term, trunc, GAMMA, rho_bar, c_bar, lam)
    np.testing.assert_allclose(vs.numpy(), want_vs, atol=1e-4)
    np.testing.assert_allclose(adv.numpy(), want_adv, atol=1e-4)


def test_vtrace_on_policy_is_gae() -> None:
    r, v, nv, term, trunc = _episode_data(3)
    lp = np.zeros_like(r)
    _, vs = vtrace(lp, lp, r, v, nv, term, trunc, GAMMA, lam=LAM)
    _, gae_ret = gae(r, v, nv, term, trunc, GAMMA, LAM)
    np.testing.assert_allclose(vs.numpy(), gae_ret.numpy(), atol=1e-5)
    adv1, _ = vtrace(lp, lp, r, v, nv, term, trunc, GAMMA, lam=1.0)
    np.testing.assert_allclose(adv1.numpy(), gae(r, v, nv, term, trunc, GAMMA, 1.0)[0].numpy(), atol=1e-5)
    with pytest.raises(SpecError, match="rho_bar, c_bar: expected positive clipping levels, got 0"):
        vtrace(lp, lp, r, v, nv, term, trunc, rho_bar=0)


def test_discounted_returns_match_brute_force() -> None:
    r, _, nv, term, trunc = _episode_data(11)
    got = discounted_returns(r, term, trunc, nv, GAMMA).numpy()
    t_len, n = r.shape
    for e in range(n):
        for t in range(t_len):
            total, k = 0.0, t
            while True:
                total += GAMMA ** (k - t) * r[k, e]
                if term[k, e]:
                    break
                if trunc[k, e] or k == t_len - 1:
                    total += GAMMA ** (k - t + 1) * nv[k, e]
                    break
                k += 1
            assert got[t, e] == pytest.approx(total, abs=1e-4)
    mc = discounted_returns(np.ones((3, 1)), np.zeros((3, 1)), np.zeros((3, 1)), gamma=0.5)
    assert mc[:, 0].tolist() == [1.75, 1.5, 1.0]


@pytest.mark.parametrize("n", [1, 3, 20])
def test_nstep_targets_match_brute_force(n: int) -> None:
    r, _, nv, term, trunc = _episode_data(12)
    got = nstep_targets(r, nv, term, trunc, n, GAMMA).numpy()
    t_len, envs = r.shape
    for e in range(envs):
        for t in range(t_len):
            total = 0.0
            for k in range(t, min(t + n, t_len)):
                total += GAMMA ** (k - t) * r[k, e]
                if term[k, e]:
                    break
                if trunc[k, e] or k == t_len - 1 or k == t + n - 1:
                    total += GAMMA ** (k - t + 1) * nv[k, e]
                    break
            assert got[t, e] == pytest.approx(total, abs=1e-4)
    with pytest.raises(SpecError, match="n: expected a positive int, got 0"):
        nstep_targets(r, nv, term, trunc, 0)


def test_normalize_advantages() -> None:
    a = torch.tensor([1.0, 2.0, 3.0, 6.0])
    out = normalize_advantages(a)
    assert float(out.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(out.std()) == pytest.approx(1.0, abs=1e-6)
    assert a.tolist() == [1.0, 2.0, 3.0, 6.0]
    assert normalize_advantages(torch.tensor([5.0])).tolist() == [0.0]
    assert not math.isnan(float(normalize_advantages(torch.ones(4)).sum()))
