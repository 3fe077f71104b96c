"""XpbankReplayBuffer against SB3's own ReplayBuffer and a list model: layout, timeouts, wrap."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from hypothesis import settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer  # noqa: E402

from xpbank import MemmapStorage, SpecError  # noqa: E402
from xpbank.integrations.sb3 import XpbankReplayBuffer  # noqa: E402

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(4)
BOX_ACT = gym.spaces.Box(-1, 1, (2,), np.float32)


def step(rng: np.random.Generator, n_envs: int, action_space, p_done: float = 0.3, p_timeout: float = 0.5):
    """One random vector step in SB3's calling convention: (obs, next_obs, action, reward, done, infos)."""
    obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
    next_obs = rng.normal(size=(n_envs, 3)).astype(np.float32)
    if isinstance(action_space, gym.spaces.Discrete):
        action = rng.integers(0, action_space.n, size=n_envs)
    else:
        action = rng.uniform(-1, 1, size=(n_envs, *action_space.shape)).astype(np.float32)
    reward = rng.normal(size=n_envs).astype(np.float32)
    done = rng.random(n_envs) < p_done
    infos = [{"TimeLimit.truncated": bool(d and rng.random() < p_timeout)} for d in done]
    return obs, next_obs, action, reward, done, infos


def stored(buf: XpbankReplayBuffer):
    """Every stored transition as SB3 samples, with (row, env) of each."""
    batch = buf.xp.sample_all()
    slots = batch["index"].numpy() % buf.xp.capacity
    return buf.samples_of(batch), slots // buf.n_envs, slots % buf.n_envs


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize(("n_envs", "action_space"), [(1, DISCRETE), (3, BOX_ACT), (4, DISCRETE)])
def test_matches_sb3_replay_buffer_through_the_wrap(n_envs, action_space, handle_timeout):
    ref = SB3ReplayBuffer(
        20, OBS, action_space, "cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout
    )
    buf = XpbankReplayBuffer(
        20, OBS, action_space, "cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout
    )
    rng = np.random.default_rng(0)
    for _ in range(37):  # wraps (20 // n_envs rows) at least once
        args = step(rng, n_envs, action_space)
        ref.add(*args)
        buf.add(*args)
        assert (buf.pos, buf.full, buf.size(), buf.buffer_size) == (
            ref.pos,
            ref.full,
            ref.size(),
            ref.buffer_size,
        )
    got, rows, envs = stored(buf)
    assert len(rows) == ref.size() * n_envs
    np.testing.assert_array_equal(got.observations.numpy(), ref.observations[rows, envs])
    np.testing.assert_array_equal(got.next_observations.numpy(), ref.next_observations[rows, envs])
    np.testing.assert_array_equal(got.actions.numpy(), ref.actions[rows, envs])
    assert got.actions.dtype == torch.as_tensor(ref.actions).dtype
    np.testing.assert_array_equal(got.rewards.numpy()[:, 0], ref.rewards[rows, envs])
    sb3_dones = ref.dones[rows, envs] * (1 - ref.timeouts[rows, envs])
    np.testing.assert_array_equal(got.dones.numpy()[:, 0], sb3_dones)


class Model:
    """The brute-force reference: SB3's [rows, envs] grid as a dict, plain Python."""

    def __init__(self, buffer_size: int, n_envs: int, handle_timeout: bool):
        self.rows, self.n_envs, self.handle = buffer_size // n_envs, n_envs, handle_timeout
        self.cells: dict[tuple[int, int], tuple] = {}
        self.pos, self.full = 0, False

    def add(self, obs, next_obs, action, reward, done, infos):
        for e in range(self.n_envs):
            timeout = infos[e].get("TimeLimit.truncated", False)
            # the one rule: a time limit is not a termination (when handled)
            target_done = float(done[e] and not (timeout and self.handle))
            self.cells[(self.pos, e)] = (obs[e].tolist(), next_obs[e].tolist(), float(reward[e]), target_done)
        self.pos += 1
        if self.pos == self.rows:
            self.pos, self.full = 0, True

    def reset(self):
        self.cells, self.pos, self.full = {}, 0, False


class BufferMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.rng = np.random.default_rng(1)
        self.buf: XpbankReplayBuffer | None = None

    @rule(
        n_envs=st.integers(1, 3),
        size=st.integers(1, 9),
        handle=st.booleans(),
    )
    def build(self, n_envs, size, handle):
        self.buf = XpbankReplayBuffer(
            size, OBS, BOX_ACT, "cpu", n_envs=n_envs, handle_timeout_termination=handle
        )
        self.model = Model(size, n_envs, handle) if size >= n_envs else Model(n_envs, n_envs, handle)

    @rule(p_done=st.sampled_from([0.0, 0.5, 1.0]), p_timeout=st.sampled_from([0.0, 0.5, 1.0]))
    def add(self, p_done, p_timeout):
        if self.buf is None:
            return
        args = step(self.rng, self.buf.n_envs, BOX_ACT, p_done, p_timeout)
        self.buf.add(*args)
        self.model.add(*args)

    @rule()
    def reset(self):
        if self.buf is not None:
            self.buf.reset()
            self.model.reset()

    @invariant()
    def same_as_model(self):
        if self.buf is None:
            return
        assert (self.buf.pos, self.buf.full, self.buf.size()) == (
            self.model.pos,
            self.model.full,
            len(self.model.cells) // self.model.n_envs,
        )
        if not self.model.cells:
            return
        got, rows, envs = stored(self.buf)
        have = {
            (int(r), int(e)): (o, n, rw, d)
            for r, e, o, n, rw, d in zip(
                rows,
                envs,
                got.observations.tolist(),
                got.next_observations.tolist(),
                got.rewards[:, 0].tolist(),
                got.dones[:, 0].tolist(),
                strict=False,
            )
        }
        assert have == self.model.cells


TestBufferMachine = BufferMachine.TestCase
TestBufferMachine.settings = settings(max_examples=30, stateful_step_count=25, deadline=None)


def test_sample_dones_follow_timeout_handling():
    rng = np.random.default_rng(2)
    for handle in (True, False):
        buf = XpbankReplayBuffer(64, OBS, BOX_ACT, "cpu", n_envs=2, handle_timeout_termination=handle, seed=0)
        for _ in range(32):
            buf.add(*step(rng, 2, BOX_ACT))
        batch = buf.xp.sample(256)
        expected = batch["terminated"] | (batch["truncated"] & (not handle))
        got = buf.samples_of(batch)
        assert got.dones.shape == (256, 1) and got.dones.dtype == torch.float32
        torch.testing.assert_close(got.dones[:, 0], expected.float())
        assert bool(batch["truncated"].any())  # the case that differs was drawn


def test_sample_shapes_dtypes_device_and_seed():
    rng = np.random.default_rng(3)
    a = XpbankReplayBuffer(50, OBS, DISCRETE, "cpu", n_envs=2, seed=7)
    b = XpbankReplayBuffer(50, OBS, DISCRETE, "cpu", n_envs=2, seed=7)
    for _ in range(10):
        args = step(rng, 2, DISCRETE)
        a.add(*args)
        b.add(*args)
    s = a.sample(16)
    assert s.observations.shape == (16, 3) and s.actions.shape == (16, 1) and s.actions.dtype == torch.int64
    assert s.rewards.shape == (16, 1) and s.discounts is None
    torch.testing.assert_close(s.observations, b.sample(16).observations)


def test_sample_normalizes_with_vec_normalize():
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    venv = VecNormalize(make_vec_env("Pendulum-v1", n_envs=1, seed=0))
    venv.reset()
    for _ in range(20):
        venv.step(np.zeros((1, 1), np.float32))
    space = venv.observation_space
    buf = XpbankReplayBuffer(20, space, venv.action_space, "cpu", seed=0)
    rng = np.random.default_rng(4)
    for _ in range(5):
        o = rng.normal(size=(1, 3)).astype(np.float32)
        buf.add(o, o * 2, np.zeros((1, 1), np.float32), np.ones(1, np.float32), np.array([False]), [{}])
    batch = buf.xp.sample(8)
    got = buf.samples_of(batch, venv)
    np.testing.assert_allclose(got.observations.numpy(), venv.normalize_obs(batch["obs"].numpy()), rtol=1e-6)
    np.testing.assert_allclose(
        got.rewards.numpy()[:, 0], venv.normalize_reward(batch["reward"].numpy()), rtol=1e-6
    )


def snapshot(buf: XpbankReplayBuffer):
    return buf.pos, buf.size(), buf.xp.sample_all().to_dict() if len(buf.xp) else None


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda a: {**a, "obs": a["obs"][:1]}, "obs"),
        (lambda a: {**a, "next_obs": np.zeros((2, 4), np.float32)}, "next"),
        (
            lambda a: {**a, "action": np.zeros((2, 3), np.float32)},
            "field 'action': expected 2 envs x 2 values",
        ),
        (lambda a: {**a, "done": np.array([True])}, r"field 'done': expected shape \(2,\)"),
        (lambda a: {**a, "infos": [{}]}, "field 'infos': expected a list of 2 dicts"),
        (lambda a: {**a, "reward": np.zeros(3, np.float32)}, "reward"),
    ],
)
def test_bad_add_raises_and_leaves_the_buffer_as_it_was(change, match):
    rng = np.random.default_rng(5)
    buf = XpbankReplayBuffer(10, OBS, BOX_ACT, "cpu", n_envs=2, seed=0)
    for _ in range(3):
        buf.add(*step(rng, 2, BOX_ACT))
    before = snapshot(buf)
    names = ["obs", "next_obs", "action", "reward", "done", "infos"]
    args = change(dict(zip(names, step(rng, 2, BOX_ACT), strict=False)))
    with pytest.raises(SpecError, match=match):
        buf.add(*(args[n] for n in names))
    after = snapshot(buf)
    assert after[:2] == before[:2]
    assert all(torch.equal(after[2][k], before[2][k]) for k in ("obs", "action", "reward", "index"))


def test_unsupported_options_are_clear_errors():
    with pytest.raises(SpecError, match=r"optimize_memory_usage: True keeps .* storage='memmap'"):
        XpbankReplayBuffer(10, OBS, BOX_ACT, "cpu", optimize_memory_usage=True, storage="memmap")
    with pytest.raises(SpecError, match="observation_space: gymnasium space Dict is not supported"):
        XpbankReplayBuffer(10, gym.spaces.Dict({"a": OBS}), BOX_ACT, "cpu")
    with pytest.raises(SpecError, match="n_envs: expected a positive int, got 0"):
        XpbankReplayBuffer(10, OBS, BOX_ACT, "cpu", n_envs=0)


def test_discrete_observations_and_reset():
    buf = XpbankReplayBuffer(4, DISCRETE, DISCRETE, "cpu", n_envs=2, seed=0)
    buf.add(np.array([1, 2]), np.array([2, 3]), np.array([0, 1]), np.ones(2), np.zeros(2, bool), [{}, {}])
    got, _, _ = stored(buf)
    assert got.observations[:, 0].tolist() == [1, 2] and got.next_observations[:, 0].tolist() == [2, 3]
    buf.reset()
    assert (buf.pos, buf.full, buf.size()) == (0, False, 0)
    buf.add(np.array([3, 3]), np.array([0, 0]), np.array([1, 1]), np.ones(2), np.zeros(2, bool), [{}, {}])
    assert (buf.pos, buf.size()) == (1, 1) and buf.sample(4).observations[:, 0].tolist() == [3, 3, 3, 3]


def test_memmap_storage_and_bank_round_trip(tmp_path):
    rng = np.random.default_rng(6)
    buf = XpbankReplayBuffer(12, OBS, BOX_ACT, "cpu", n_envs=3, storage="memmap", seed=0)
    assert isinstance(buf.xp.storage, MemmapStorage)
    for _ in range(6):  # wraps: 4 rows
        buf.add(*step(rng, 3, BOX_ACT))
    path = buf.save_bank(tmp_path / "bank")
    back = XpbankReplayBuffer.load_bank(path, OBS, BOX_ACT, "cpu")
    assert (back.pos, back.full, back.size(), back.n_envs) == (buf.pos, buf.full, buf.size(), 3)
    a, b = buf.sample(32), back.sample(32)  # the RNG state comes back too
    for x, y in zip(a, b, strict=False):
        assert (x is None and y is None) or torch.equal(x, y)
    args = step(rng, 3, BOX_ACT)
    buf.add(*args)
    back.add(*args)
    assert back.pos == buf.pos
    with pytest.raises(SpecError, match="bank: expected 12 items of"):
        XpbankReplayBuffer.load_bank(path, OBS, DISCRETE, "cpu")


def test_one_env_takes_done_and_reward_in_any_shape_of_one_value_as_sb3():
    """With one env SB3 stores a ``done`` of shape (1, 1) or 0-d and a 0-d ``reward``
    (NumPy broadcasts them into its row); so does the drop-in, with the same values."""
    ref = SB3ReplayBuffer(8, OBS, DISCRETE, "cpu", n_envs=1)
    buf = XpbankReplayBuffer(8, OBS, DISCRETE, "cpu", n_envs=1)
    rng = np.random.default_rng(3)
    for done, reward in [
        (np.array([[True]]), np.float32(0.5)),
        (np.array(False), np.array(-1.25, np.float32)),
        (1.0, 2.0),
        (np.array([0]), np.array([[3.0]])),
    ]:
        obs, next_obs, action, *_ = step(rng, 1, DISCRETE)
        infos = [{"TimeLimit.truncated": False}]
        ref.add(obs, next_obs, action, reward, done, infos)
        buf.add(obs, next_obs, action, reward, done, infos)
    got, rows, envs = stored(buf)
    np.testing.assert_array_equal(got.rewards.numpy()[:, 0], ref.rewards[rows, envs])
    np.testing.assert_array_equal(got.dones.numpy()[:, 0], ref.dones[rows, envs])
    with pytest.raises(SpecError, match=r"field 'done': expected shape \(1,\), got \(2,\)"):
        buf.add(obs, next_obs, action, 0.0, np.zeros(2, bool), infos)
    assert buf.size() == 4


def test_a_pickle_without_adds_kept_arrays_loads_and_adds():
    """SB3's save/load_replay_buffer is a pickle: one written before ``add`` kept its
    arrays (no ``_no_timeouts`` / ``_action_shape``) still loads and takes adds, and the
    kept flags come back read only."""
    import pickle

    buf = XpbankReplayBuffer(8, OBS, BOX_ACT, "cpu", n_envs=2)
    rng = np.random.default_rng(4)
    buf.add(*step(rng, 2, BOX_ACT, p_done=0.0))
    old = buf.__dict__.copy()
    del old["_no_timeouts"], old["_action_shape"]  # what an older version pickled
    loaded = XpbankReplayBuffer.__new__(XpbankReplayBuffer)
    loaded.__setstate__(pickle.loads(pickle.dumps(old)))
    copy = pickle.loads(pickle.dumps(buf))
    for b in (loaded, copy):
        b.add(*step(rng, 2, BOX_ACT, p_done=0.0))
        assert b.size() == 2
        assert not b._no_timeouts.flags.writeable and not b._no_timeouts.any()
