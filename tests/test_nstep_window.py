"""The n-step hot path's pieces against brute-force references: lockstep windows computed
from ids (``EpisodeIndex.walk_slots``) through wraps, ends of either kind,
``truncate_newest``, ``clear`` and state round trips; ``TensorStorage.gather_pairs``
against two plain gathers; ``nstep_sum`` against a loop; and the storage fallbacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from test_nstep_paths import _check, _stream
from xpbank import Field, NStep, ReplayBuffer, Spec, TensorStorage, nstep_sum


class Model:
    """Every live item as ``[id, env, terminated, truncated]``, in id order."""

    def __init__(self, capacity: int, num_envs: int):
        self.capacity, self.num_envs, self.items = capacity, num_envs, []
        self.next_id = self.base = 0  # base: the first id since the last clear (envs count from it)

    def extend(self, term: list[bool], trunc: list[bool]) -> None:
        for a, b in zip(term, trunc, strict=True):
            self.items.append([self.next_id, (self.next_id - self.base) % self.num_envs, a, b])
            self.next_id += 1
        self.items = self.items[-self.capacity :]

    def truncate_newest(self) -> list[int]:
        marked = []
        for env in range(self.num_envs):
            mine = [it for it in self.items if it[1] == env]
            if mine and not (mine[-1][2] or mine[-1][3]):
                mine[-1][3] = True
                marked.append(mine[-1][0])
        return sorted(marked)

    def clear(self) -> None:
        self.next_id = self.base = -(-self.next_id // self.capacity) * self.capacity
        self.items = []

    def window(self, x: int, n: int) -> tuple[list[int], int]:
        """Slots of ``x``'s window (its last slot repeated past its end) and its length."""
        env = next(it[1] for it in self.items if it[0] == x)
        stream = [it for it in self.items if it[1] == env]
        p = [it[0] for it in stream].index(x)
        ids = [x]
        while len(ids) < n and not (stream[p][2] or stream[p][3]) and p + 1 < len(stream):
            p += 1
            ids.append(stream[p][0])
        k = len(ids)
        return [i % self.capacity for i in ids + [ids[-1]] * (n - k)], k


def follow_next(rb: ReplayBuffer, ids: np.ndarray, n: int) -> np.ndarray:
    """Slots ``[n, B]`` of each window by following the stored ``next`` links one item at
    a time (what the index holds, read without its lockstep arithmetic)."""
    nxt, c = rb.episodes.links().next, rb.capacity
    out = np.empty((n, len(ids)), dtype=np.int64)
    for b, x in enumerate(ids.tolist()):
        for j in range(n):
            out[j, b] = x % c
            x = int(nxt[x % c]) if nxt[x % c] >= 0 else x
    return out


class LockstepWindows(RuleBasedStateMachine):
    """A lockstep buffer's windows against :class:`Model` and against following ``next``."""

    @initialize(capacity=st.integers(5, 40), num_envs=st.integers(1, 4))
    def build(self, capacity: int, num_envs: int) -> None:
        self.rb = ReplayBuffer(capacity, num_envs=num_envs, nstep=NStep(3, 0.9))
        self.model = Model(capacity, num_envs)

    @rule(data=st.data(), k=st.integers(1, 4))
    def extend(self, data: st.DataObject, k: int) -> None:
        n = k * self.model.num_envs
        ends = data.draw(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=n, max_size=n))
        term, trunc = [e == 1 for e in ends], [e == 2 for e in ends]
        self.rb.extend({"obs": torch.zeros(n), "reward": torch.zeros(n),
                        "terminated": torch.tensor(term), "truncated": torch.tensor(trunc)})  # fmt: skip
        self.model.extend(term, trunc)

    @rule()
    def truncate_newest(self) -> None:
        assert sorted(self.rb.episodes.truncate_newest().tolist()) == self.model.truncate_newest()

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.model.clear()

    @precondition(lambda self: self.rb.spec is not None)
    @rule()
    def round_trip(self) -> None:
        other = ReplayBuffer(self.rb.capacity, num_envs=self.model.num_envs, nstep=NStep(3, 0.9))
        other.load_state_dict(self.rb.state_dict())
        self.rb = other

    @invariant()
    def windows_match(self) -> None:
        ids = np.array([it[0] for it in self.model.items], dtype=np.int64)
        if not len(ids):
            return
        eps = self.rb.episodes
        for n in (1, 2, 3, 5):
            slots, steps = eps.walk_slots(ids, n)
            expected = [self.model.window(x, n) for x in ids.tolist()]
            assert slots.tolist() == [list(col) for col in zip(*(w for w, _ in expected), strict=True)]
            assert steps.tolist() == [k for _, k in expected]
            assert slots.dtype == np.int64 and steps.dtype == np.int64
            assert np.array_equal(slots, follow_next(self.rb, ids, n))
            walked, walked_steps = eps.walk(ids, n)  # the ids form agrees with the slots
            assert np.array_equal(walked.T % self.rb.capacity, slots)
            assert np.array_equal(walked_steps, steps)


LockstepWindows.TestCase.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)
test_lockstep_windows = LockstepWindows.TestCase


def test_lockstep_is_used_only_without_an_env_field() -> None:
    """The arithmetic needs lockstep mode; an env field (or no write yet) follows links."""
    lockstep = ReplayBuffer(10, num_envs=2, nstep=NStep(2, 0.9))
    lockstep.extend({"obs": torch.zeros(4), "reward": torch.zeros(4)})
    assert lockstep.episodes.lockstep == 2
    tagged = ReplayBuffer(10, num_envs=2, nstep=NStep(2, 0.9))
    tagged.extend({"obs": torch.zeros(4), "reward": torch.zeros(4), "env_id": torch.tensor([0, 1, 1, 0])})
    assert tagged.episodes.lockstep is None
    slots, steps = tagged.episodes.walk_slots(np.array([0, 1, 2, 3]), 2)
    assert slots.tolist() == [[0, 1, 2, 3], [3, 2, 2, 3]] and steps.tolist() == [2, 2, 1, 1]


def _spec(wide: bool, dtype: torch.dtype) -> Spec:
    obs = Field((1100,) if wide else (3,))  # 4400 bytes: a wide row, read field by field
    return Spec({"obs": obs, "next_obs": obs, "reward": Field((), dtype), "done": Field((), torch.bool)})


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gather_pairs_matches_two_gathers(pack: bool, wide: bool, dtype: torch.dtype) -> None:
    spec = _spec(wide, dtype)
    st_ = TensorStorage(16, spec, pack=pack)
    g = torch.Generator().manual_seed(0)
    data = {k: torch.randn(16, *spec[k].shape, generator=g).to(spec[k].dtype) for k in spec}
    st_.write(slice(0, 16), data)
    first, second = np.array([3, 0, 15, 3]), np.array([5, 5, 1, 14])
    keys = ["reward", "obs", "next_obs", "done"]
    out = st_.gather_pairs(np.concatenate([first, second]), keys, {"next_obs", "done"})
    assert list(out) == keys
    a = st_.gather(torch.from_numpy(first), ["obs", "reward"])
    b = st_.gather(torch.from_numpy(second), ["next_obs", "done"])
    for key, expected in {**a, **b}.items():
        assert out[key].dtype == spec[key].dtype and torch.equal(out[key], expected), key
    assert torch.equal(out["next_obs"], data["next_obs"][second])
    only = st_.gather_pairs(np.concatenate([first, second]), ["next_obs"], {"next_obs"})
    assert list(only) == ["next_obs"] and torch.equal(only["next_obs"], data["next_obs"][second])


class _Plain(TensorStorage):
    """A storage with neither of the optional fast paths: n-step falls back to ``gather``."""

    gather_pairs = None  # type: ignore[assignment]
    host_view = None  # type: ignore[assignment]


def test_storage_without_fast_paths_gives_the_same_batches() -> None:
    fast = ReplayBuffer(30, num_envs=2, nstep=NStep(3, 0.9), seed=6)
    plain = ReplayBuffer(30, num_envs=2, nstep=NStep(3, 0.9), seed=6, storage=_Plain(30))
    log = _stream(fast, 25, seed=7)  # wraps
    _stream(plain, 25, seed=7)
    a, b = fast.sample(64), plain.sample(64)
    for key in sorted(a.keys()):
        assert torch.equal(a[key], b[key]), key
    _check(b, log, 3)
    one = ReplayBuffer(30, num_envs=2, nstep=NStep(1, 0.9), seed=6, storage=_Plain(30))
    one_log = _stream(one, 20, seed=8)
    _check(one.sample(32), one_log, 1)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 5),
    b=st.integers(1, 20),
    seed=st.integers(0, 2**16),
    gamma=st.floats(0.0, 1.0),
)
def test_nstep_sum_matches_a_loop(n: int, b: int, seed: int, gamma: float) -> None:
    rng = np.random.default_rng(seed)
    steps = rng.integers(1, n + 1, b)
    by_step = rng.normal(size=(n, b)).astype(np.float32)
    by_step[np.arange(n)[:, None] >= steps] = np.inf  # past the window: never read as numbers
    terminated = rng.random(b) < 0.3
    past = np.arange(1, n)[:, None] >= steps
    powers = gamma ** np.arange(n + 1.0)
    kept = by_step.copy()
    ret, disc = nstep_sum(by_step, past, steps, terminated, powers)
    for i in range(b):
        expected = sum(float(gamma**j) * float(kept[j, i]) for j in range(steps[i]))
        assert ret[i] == pytest.approx(expected, rel=1e-6, abs=1e-6)
        assert disc[i] == (0.0 if terminated[i] else np.float32(gamma ** steps[i]))
    assert ret.dtype == np.float32 and disc.dtype == np.float32
