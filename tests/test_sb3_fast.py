"""XpbankReplayBuffer's short sample and add (integrations/sb3/fast.py) against the general path.

Two adapters with the same seed are fed the same stream of vector steps (terminations,
time limits through ``infos``, ring wraps); one reads and writes through the short
path, the other through the general one (``xp._fast_read = False``:
``samples_of(xp.sample(...))`` by the general read; ``_add_checked``: every array
converted and checked). Every sample must be the same draws with the same values,
dtypes, shapes and devices, and the stored items, cursor and episode index the same.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from xpbank import SpecError  # noqa: E402
from xpbank.integrations.sb3 import XpbankReplayBuffer  # noqa: E402
from xpbank.integrations.sb3.fast import RecordsView  # noqa: E402

SPACES = {
    "box": gym.spaces.Box(-10, 10, (3,), np.float32),
    "uint8": gym.spaces.Box(0, 255, (2, 2), np.uint8),
    "discrete": gym.spaces.Discrete(5),
}
ACTIONS = {"discrete": gym.spaces.Discrete(4), "box": gym.spaces.Box(-1, 1, (2,), np.float32)}


def steps(rng: np.random.Generator, obs_space, action_space, n_envs: int, count: int):
    """``count`` vector steps in SB3's calling convention, a third of them ending an
    episode (half of those by a time limit)."""
    for _ in range(count):
        obs, next_obs = (np.stack([obs_space.sample() for _ in range(n_envs)]) for _ in range(2))
        action = np.stack([action_space.sample() for _ in range(n_envs)])
        done = rng.random(n_envs) < 0.33
        infos = [{"TimeLimit.truncated": bool(d and rng.random() < 0.5)} for d in done]
        if rng.random() < 0.2:  # an info without the key, as a gymnasium env gives
            infos[0] = {}
        yield obs, next_obs, action, rng.normal(size=n_envs).astype(np.float32), done, infos


def same(got, want) -> None:
    assert type(got) is type(want)
    for name, a, b in zip(want._fields, got, want, strict=True):
        if b is None:
            assert a is None, name
            continue
        assert (a.dtype, a.shape, a.device) == (b.dtype, b.shape, b.device), name
        assert torch.equal(a, b), name


def pair(obs_space, action_space, n_envs: int, handle_timeout: bool):
    make = lambda: XpbankReplayBuffer(  # noqa: E731
        24, obs_space, action_space, "cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout, seed=3
    )
    fast, general = make(), make()
    general.xp._fast_read = False
    general.add = general._add_checked  # type: ignore[method-assign]
    return fast, general


def same_store(fast, general) -> None:
    """The same items (every field and id), cursor and episode starts."""
    a, b = fast.xp.sample_all(), general.xp.sample_all()
    assert sorted(map(str, a.keys(True, True))) == sorted(map(str, b.keys(True, True)))
    for key in a.keys(True, True):
        assert torch.equal(a[key], b[key]), key
    cursor = lambda buf: (buf.pos, buf.full, buf.size(), buf.next_id)  # noqa: E731
    assert cursor(fast) == cursor(general)
    ends, want = fast.xp.episodes.state_dict(), general.xp.episodes.state_dict()
    assert ends.keys() == want.keys()
    for key, value in ends.items():
        assert torch.equal(value, want[key]) if torch.is_tensor(value) else value == want[key], key


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize("n_envs", [1, 3])
@pytest.mark.parametrize("obs", sorted(SPACES))
@pytest.mark.parametrize("act", sorted(ACTIONS))
def test_short_sample_is_the_general_sample(obs, act, n_envs, handle_timeout):
    obs_space, action_space = SPACES[obs], ACTIONS[act]
    obs_space.seed(0)
    action_space.seed(1)
    fast, general = pair(obs_space, action_space, n_envs, handle_timeout)
    rng = np.random.default_rng(0)
    ends = 0
    for i, args in enumerate(steps(rng, obs_space, action_space, n_envs, 60)):  # wraps 24 // n_envs rows
        fast.add(*args)
        general.add(*args)
        ends += int(args[4].sum())
        for batch_size in (1, 7, 64)[: 1 + i % 3]:
            got = fast.sample(batch_size)
            same(got, general.sample(batch_size))
            assert got.dones.is_contiguous() and got.rewards.shape == (batch_size, 1)
    assert fast.full and ends > 10
    same_store(fast, general)
    stored = general.xp.sample_all()
    assert bool(stored["terminated"].any()) and bool(stored["truncated"].any())
    assert torch.equal(fast.xp.sample(5)["index"], general.xp.sample(5)["index"])  # one generator state


def test_short_sample_is_fresh_memory():
    fast, general = pair(SPACES["box"], ACTIONS["box"], 2, True)
    for args in steps(np.random.default_rng(1), SPACES["box"], ACTIONS["box"], 2, 5):
        fast.add(*args)
        general.add(*args)
    got, want = fast.sample(16), general.sample(16)
    for tensor in got[:5]:
        tensor.zero_()  # changes nothing stored
    assert not all(bool(t.eq(0).all()) for t in want[:5])
    same(fast.sample(32), general.sample(32))


def test_records_view_declined_reads_the_same_draws():
    fast, general = pair(SPACES["box"], ACTIONS["discrete"], 1, False)
    for args in steps(np.random.default_rng(2), SPACES["box"], ACTIONS["discrete"], 1, 10):
        fast.add(*args)
        general.add(*args)
    view = RecordsView(fast.xp._storage.host_reader)
    view.records = None  # as for a field NumPy does not hold as its own dtype
    fast._records_view = view
    same(fast.sample(9), general.sample(9))
    assert fast._records_view is view


def test_declined_cases_take_the_general_path():
    fast, general = pair(SPACES["box"], ACTIONS["box"], 1, True)
    for args in steps(np.random.default_rng(3), SPACES["box"], ACTIONS["box"], 1, 4):
        fast.add(*args)
        general.add(*args)
    for bad in (0, -1, 2.0):
        with pytest.raises(Exception) as fast_error:
            fast.sample(bad)
        with pytest.raises(type(fast_error.value)):
            general.sample(bad)
    same(fast.sample(np.int64(5)), general.sample(np.int64(5)))


def test_short_add_declines_other_inputs_to_the_checked_add():
    fast, general = pair(SPACES["box"], ACTIONS["discrete"], 2, True)
    obs = np.ones((2, 3), np.float32)
    inputs = [
        (obs, obs + 1, np.array([1, 2]), np.array([0.5, 1.5], np.float32), np.array([False, True]), [{}, {}]),
        (obs.tolist(), obs + 2, [[3], [0]], [1.0, 2.0], [True, False], [{"TimeLimit.truncated": True}, {}]),
        (obs, obs.astype(np.float64), np.array([[1], [1]]), np.array([1.0, 2.0]), np.array([0, 1]), ({}, {})),
        (obs, obs + 3, np.array([2, 2]), np.float32([[1.0], [2.0]]), np.array([[True], [True]]), [{}, {}]),
    ]
    for args in inputs:
        fast.add(*args)
        general.add(*args)
    same_store(fast, general)
    with pytest.raises(SpecError, match="infos"):
        fast.add(obs, obs, np.array([1, 2]), np.float32([0, 0]), np.array([True, False]), [{}])
    with pytest.raises(SpecError, match="action"):
        fast.add(obs, obs, np.array([1, 2, 3]), np.float32([0, 0]), np.array([True, False]), [{}, {}])
    same_store(fast, general)  # nothing written


def test_pickled_adapter_leaves_the_records_view_out():
    fast, general = pair(SPACES["box"], ACTIONS["box"], 1, True)
    for args in steps(np.random.default_rng(4), SPACES["box"], ACTIONS["box"], 1, 12):
        fast.add(*args)
        general.add(*args)
    same(fast.sample(8), general.sample(8))  # the view made
    size, rows = len(pickle.dumps(fast)), fast._records_view.records.nbytes
    del fast.__dict__["_records_view"]
    assert 0 <= size - len(pickle.dumps(fast)) < min(rows, 200)  # no copy of the rows in the pickle
    same(fast.sample(8), general.sample(8))  # made again
    copy = pickle.loads(pickle.dumps(fast))
    assert copy._records_view is None
    twin = pickle.loads(pickle.dumps(general))
    same(copy.sample(8), twin.sample(8))
    same(fast.sample(8), general.sample(8))
    args = next(steps(np.random.default_rng(5), SPACES["box"], ACTIONS["box"], 1, 1))
    copy.add(*args)
    twin.add(*args)
    same_store(copy, twin)


def test_a_subclass_overriding_samples_of_gets_its_own():
    class Scaled(XpbankReplayBuffer):
        def samples_of(self, batch, env=None):
            got = super().samples_of(batch, env)
            return got._replace(rewards=got.rewards * 2)

    scaled = Scaled(24, SPACES["box"], ACTIONS["box"], "cpu", seed=3)
    _, general = pair(SPACES["box"], ACTIONS["box"], 1, True)
    for args in steps(np.random.default_rng(6), SPACES["box"], ACTIONS["box"], 1, 6):
        scaled.add(*args)
        general.add(*args)
    want = general.sample(16)
    same(scaled.sample(16), want._replace(rewards=want.rewards * 2))
