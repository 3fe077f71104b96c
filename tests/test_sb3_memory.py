"""XpbankReplayBuffer(optimize_memory_usage=True): next observations stored once.

Checked against SB3's own ``ReplayBuffer(optimize_memory_usage=True)`` fed the same steps
and against a brute-force record of every ``add``: through the ring's wrap, several envs,
terminations and truncations, and SB3's episode cut between two ``learn()`` calls.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer  # noqa: E402

from xpbank import FrameStorage, SpecError  # noqa: E402
from xpbank.integrations.sb3 import XpbankReplayBuffer  # noqa: E402

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
ACT = gym.spaces.Discrete(4)


def chained_steps(seed: int, n_envs: int, steps: int, p_done: float = 0.2, obs_dim: int = 3):
    """SB3's calls of a vector env: each env's obs is its previous next_obs unless that
    step ended the episode (then a fresh reset obs); half of the ends are time limits."""
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(n_envs, obs_dim)).astype(np.float32)
    for _ in range(steps):
        next_obs = rng.normal(size=(n_envs, obs_dim)).astype(np.float32)
        done = rng.random(n_envs) < p_done
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        action = rng.integers(0, 4, size=n_envs)
        reward = rng.normal(size=n_envs).astype(np.float32)
        yield obs, next_obs, action, reward, done, infos
        obs = next_obs.copy()
        obs[done] = rng.normal(size=(int(done.sum()), obs_dim)).astype(np.float32)


def table(buf: XpbankReplayBuffer) -> dict[tuple[int, int], tuple]:
    """Every stored transition by SB3's (row, env): (obs, next_obs, dones) as NumPy."""
    batch = buf.xp.sample_all()
    got = buf.samples_of(batch)
    slots = batch["index"].numpy() % buf.xp.capacity
    rows, envs = slots // buf.n_envs, slots % buf.n_envs
    return {
        (int(r), int(e)): (got.observations[i].numpy(), got.next_observations[i].numpy(), float(got.dones[i]))
        for i, (r, e) in enumerate(zip(rows, envs, strict=True))
    }


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_next_obs_match_sb3_optimized_buffer_and_the_true_final_obs(n_envs, handle_timeout):
    size = 24
    ref = SB3ReplayBuffer(
        size, OBS, ACT, "cpu", n_envs=n_envs, optimize_memory_usage=True, handle_timeout_termination=False
    )
    buf = XpbankReplayBuffer(
        size, OBS, ACT, "cpu", n_envs=n_envs, optimize_memory_usage=True,
        handle_timeout_termination=handle_timeout, seed=0,
    )  # fmt: skip
    record: dict[tuple[int, int], tuple] = {}  # brute force: the last add at each (row, env)
    for k, args in enumerate(chained_steps(1, n_envs, 3 * size // n_envs + 5)):  # wraps 3 times
        row = buf.pos
        ref.add(*args)
        buf.add(*args)
        obs, nxt, _, _, done, infos = args
        for e in range(n_envs):
            timeout = infos[e]["TimeLimit.truncated"]
            want_done = float(done[e] and not (handle_timeout and timeout))
            record[(row, e)] = (obs[e], nxt[e], want_done, bool(done[e]))
        assert (buf.pos, buf.full, buf.size()) == (ref.pos, ref.full, ref.size())
        if k % 7 == 6:  # SB3's own samples: same (row, env) -> same next obs, except at ends
            np.random.seed(k)
            sb3 = ref.sample(32)
            np.random.seed(k)
            hi = ref.buffer_size if ref.full else ref.pos
            rows = (np.random.randint(1, hi, 32) + ref.pos) % hi if ref.full else np.random.randint(0, hi, 32)
            envs = np.random.randint(0, n_envs, 32)
            ours = table(buf)
            for i, (r, e) in enumerate(zip(rows, envs, strict=True)):
                o, n, _ = ours[(int(r), int(e))]
                np.testing.assert_array_equal(o, sb3.observations[i].numpy())
                if not record[(int(r), int(e))][3]:  # SB3 gives the next episode's reset obs at an end
                    np.testing.assert_array_equal(n, sb3.next_observations[i].numpy())
    ours = table(buf)
    assert len(ours) == size  # every slot valid (SB3's optimized buffer drops the one at pos)
    ends = 0
    for key, (obs, nxt, want_done, was_done) in record.items():
        o, n, d = ours[key]
        np.testing.assert_array_equal(o, obs)
        np.testing.assert_array_equal(n, nxt)  # the true final observation at episode ends too
        assert d == want_done, key
        ends += was_done
    assert ends >= 3  # the data does exercise episode ends


def test_dedup_halves_the_bytes_of_an_observation_heavy_layout():
    space = gym.spaces.Box(-10, 10, (64,), np.float32)
    bufs = [
        XpbankReplayBuffer(400, space, ACT, "cpu", n_envs=4, optimize_memory_usage=opt, seed=0)
        for opt in (False, True)
    ]
    for args in chained_steps(2, 4, 300, p_done=0.02, obs_dim=64):  # wraps
        for b in bufs:
            b.add(*args)
    plain, dedup = (b.xp.storage.nbytes() for b in bufs)
    assert isinstance(bufs[1].xp.storage, FrameStorage)
    obs_bytes = 400 * 64 * 4
    assert plain >= 2 * obs_bytes
    # one observation per slot plus the rest (~14 B/item) and the side store of ends
    assert 0.45 <= dedup / plain <= 0.6, (dedup, plain)


def test_dones_cut_and_its_errors():
    buf = XpbankReplayBuffer(16, OBS, ACT, "cpu", n_envs=2, optimize_memory_usage=True, seed=0)
    steps = chained_steps(3, 2, 30, p_done=0.0)
    for _ in range(5):  # rows 0..4 of 8
        buf.add(*next(steps))
    before = table(buf)
    for row, value, match in [
        (2, True, r"dones: only the newest row \(4\) can be cut, got row 2"),
        (4, False, "dones: only True can be written"),
        (5, True, r"dones: row 5 holds no transition yet \(5 rows stored\)"),
        (9, True, r"dones: expected a row index in \[0, 8\), got 9"),
    ]:
        with pytest.raises(SpecError, match=match):
            buf.dones[row] = value
    after = table(buf)
    assert all(before[k][2] == after[k][2] for k in before) and not buf.xp.episodes.truncated(range(10)).any()
    assert buf.dones[4].tolist() == [0.0, 0.0]
    buf.dones[(buf.pos - 1) % buf.buffer_size] = True  # what SB3's _setup_learn writes
    assert buf.dones[4].tolist() == [1.0, 1.0]
    assert buf.xp.sample_by_index([-2, -1])["truncated"].tolist() == [True, True]
    # a reset obs that does not continue the chain is now accepted as a new episode
    reset = np.full((2, 3), 7.0, np.float32)
    buf.add(reset, reset + 1, np.array([0, 1]), np.zeros(2, np.float32), np.zeros(2, bool), [{}, {}])
    cut = table(buf)[(4, 0)]
    np.testing.assert_array_equal(cut[1], before[(4, 0)][1])  # its true next obs, kept aside
    assert cut[2] == 0.0  # a truncation: bootstraps (handle_timeout_termination=True)
    assert buf.xp.episodes.episode_start([10, 11]).tolist() == [10, 11]


def test_reset_obs_without_a_cut_is_refused_and_changes_nothing():
    buf = XpbankReplayBuffer(8, OBS, ACT, "cpu", n_envs=2, optimize_memory_usage=True, seed=0)
    steps = chained_steps(4, 2, 30, p_done=0.0)
    for _ in range(3):
        buf.add(*next(steps))
    before = table(buf)
    reset = np.full((2, 3), 7.0, np.float32)
    with pytest.raises(SpecError, match="is not the next observation of its env's previous step"):
        buf.add(reset, reset + 1, np.array([0, 1]), np.zeros(2, np.float32), np.zeros(2, bool), [{}, {}])
    assert buf.pos == 3 and table(buf).keys() == before.keys()


class Recording(XpbankReplayBuffer):
    """Records each add's (row, obs, next_obs) as the brute-force reference."""

    def add(self, obs, next_obs, action, reward, done, infos):
        self.calls = getattr(self, "calls", [])
        self.calls.append((self.pos, obs.copy(), next_obs.copy(), done.copy()))
        super().add(obs, next_obs, action, reward, done, infos)


@pytest.mark.parametrize("reset_num_timesteps", [True, False])
def test_two_learn_calls(reset_num_timesteps):
    model = DQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_class=Recording, optimize_memory_usage=True,
        buffer_size=500, learning_starts=50, train_freq=4, batch_size=16, seed=0, device="cpu",
        policy_kwargs={"net_arch": [16]},
    )  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.learn(300)
        model.learn(300, reset_num_timesteps=reset_num_timesteps)
    buf = model.replay_buffer
    assert isinstance(buf.xp.storage, FrameStorage) and buf.optimize_memory_usage
    cut_warned = any("will be truncated" in str(w.message) for w in caught)
    assert cut_warned == reset_num_timesteps
    record = {row: (obs[0], nxt[0]) for row, obs, nxt, _ in buf.calls}
    ours = table(buf)
    assert len(ours) == buf.size() == len(record)
    for row, (obs, nxt) in record.items():
        np.testing.assert_array_equal(ours[(row, 0)][0], obs)
        np.testing.assert_array_equal(ours[(row, 0)][1], nxt)
    last_of_first = buf.calls[299]  # the newest step when the second learn() began
    eps = buf.xp.episodes
    was_done = bool(last_of_first[3][0])
    assert bool(eps.truncated([299])[0]) == (reset_num_timesteps and not was_done)
    assert bool(eps.episode_start([300])[0] == 300) == (reset_num_timesteps or was_done)


def test_env_reset_that_sb3_does_not_mark_is_refused_until_cut():
    """SB3 resets the envs without the cut when ``_last_obs`` is gone (after ``load``) and
    ``reset_num_timesteps=False``: the first add is refused; the documented cut fixes it."""
    model = DQN(
        "MlpPolicy", "CartPole-v1", replay_buffer_class=XpbankReplayBuffer, optimize_memory_usage=True,
        buffer_size=500, learning_starts=1000, seed=0, device="cpu", policy_kwargs={"net_arch": [16]},
    )  # fmt: skip
    model.learn(100)
    model._last_obs = None  # what BaseAlgorithm.load leaves
    with pytest.raises(SpecError, match="is not the next observation of its env's previous step"):
        model.learn(50, reset_num_timesteps=False)
    rb = model.replay_buffer
    assert rb.size() == 100
    rb.dones[(rb.pos - 1) % rb.buffer_size] = True
    model._last_obs = None
    model.learn(50, reset_num_timesteps=False)
    assert rb.size() > 100 and rb.dones[99].tolist() == [1.0]  # the cut (or an episode end there)
    assert int(rb.xp.episodes.episode_start([100])[0]) == 100  # the reset obs starts an episode
