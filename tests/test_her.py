"""HerSampler: hindsight goals against a brute-force reference over random multi-env streams.

Every item stores its id as its achieved goal (``next_achieved_goal = id + 0.5``), so a
relabelled item's desired goal names the step it came from. The reference replays the
written stream (env, terminated, truncated per id) as plain lists: an item's episode is
the run of its env's items between episode ends, cut at the ring's oldest live item and
at the newest written one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xpbank
from xpbank import NStep, PrioritizedSampler, ReplayBuffer
from xpbank.errors import PriorityError, SpecError
from xpbank.her import GoalKeys, HerSampler
from xpbank.her.goals import choose_goals, stride_of


def goal_gap(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    """The reward: the goal step's id minus the rewarded step's id (names the pairing)."""
    return (desired[..., 0] - achieved[..., 0]).astype(np.float32)


def reached(achieved: np.ndarray, desired: np.ndarray, info: object) -> np.ndarray:
    return (achieved == desired).all(-1)


class Stream:
    """A buffer fed random episodes of ``envs`` envs, and the plain record of what was written."""

    def __init__(self, seed: int, envs: int, capacity: int, lockstep: bool, **her: object):
        self.rng = np.random.default_rng(seed)
        self.envs, self.lockstep = envs, lockstep
        sampler = HerSampler(compute_reward=goal_gap, **her)  # type: ignore[arg-type]
        extra = {"num_envs": envs} if lockstep else {}
        self.rb = ReplayBuffer(capacity, sampler=sampler, seed=seed, **extra)  # type: ignore[arg-type]
        self.env: list[int] = []
        self.end: list[bool] = []
        self.term: list[bool] = []

    def write(self, steps: int) -> None:
        e = self.envs
        env = np.tile(np.arange(e), steps) if self.lockstep else self.rng.integers(0, e, steps * e)
        n = env.shape[0]
        term = self.rng.random(n) < 0.07
        trunc = (self.rng.random(n) < 0.05) & ~term
        ids = torch.arange(len(self.env), len(self.env) + n, dtype=torch.float32)
        batch = {
            "achieved_goal": ids[:, None],
            "next_achieved_goal": ids[:, None] + 0.5,
            "desired_goal": torch.full((n, 1), -7.0),
            "next_desired_goal": torch.full((n, 1), -7.0),
            "reward": torch.full((n,), -3.0),
            "terminated": torch.from_numpy(term),
            "truncated": torch.from_numpy(trunc),
        }
        if not self.lockstep:
            batch["env_id"] = torch.from_numpy(env)
        got = self.rb.extend(batch)
        assert got.start == len(self.env)
        self.env += env.tolist()
        self.end += (term | trunc).tolist()
        self.term += term.tolist()

    def episode(self, t: int) -> list[int]:
        """The live, written ids of ``t``'s episode (the reference)."""
        first = len(self.env) - len(self.rb)
        mine = [i for i in range(len(self.env)) if self.env[i] == self.env[t]]
        k = mine.index(t)
        lo = k
        while lo > 0 and not self.end[mine[lo - 1]]:
            lo -= 1
        hi = k
        while hi + 1 < len(mine) and not self.end[mine[hi]]:
            hi += 1
        return [i for i in mine[lo : hi + 1] if i >= first]


def allowed(stream: Stream, t: int, strategy: str) -> list[int]:
    ep = stream.episode(t)
    if strategy == "future":
        return [i for i in ep if i >= t]
    if strategy == "final":
        return [ep[-1]]
    return ep


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
@pytest.mark.parametrize("lockstep", [True, False])
def test_goals_come_from_the_items_own_written_episode(strategy: str, lockstep: bool) -> None:
    for seed in range(3):
        s = Stream(seed, envs=3, capacity=50, lockstep=lockstep, strategy=strategy, relabel_fraction=0.75)
        for _ in range(12):  # wraps the ring several times, checks after every write
            s.write(int(s.rng.integers(1, 6)))
            batch = s.rb.sample(64)
            m = int(0.75 * 64)
            idx = batch["index"].tolist()
            goal = batch["her_goal"].tolist()
            assert goal[m:] == [-1] * (64 - m)
            for i in range(m):
                assert goal[i] in allowed(s, idx[i], strategy), (seed, idx[i], goal[i])
            desired = batch["desired_goal"][:, 0]
            assert desired[:m].tolist() == [g + 0.5 for g in goal[:m]]
            assert batch["next_desired_goal"][:m, 0].tolist() == desired[:m].tolist()
            assert (desired[m:] == -7.0).all() and (batch["reward"][m:] == -3.0).all()
            gaps = [float(g - i) for g, i in zip(goal[:m], idx[:m], strict=True)]
            assert batch["reward"][:m].tolist() == gaps
            assert batch["terminated"].tolist() == [s.term[i] for i in idx]  # kept as stored


@pytest.mark.parametrize("strategy", ["future", "final", "episode"])
def test_lockstep_arithmetic_and_walking_the_links_agree(strategy: str) -> None:
    s = Stream(7, envs=4, capacity=64, lockstep=True, strategy=strategy)
    eps = s.rb.episodes
    for _ in range(15):
        s.write(int(s.rng.integers(1, 5)))
        ids = np.arange(len(s.env) - len(s.rb), len(s.env), dtype=np.int64)
        u = s.rng.random(ids.shape[0])
        ring = s.rb._ring
        stride = stride_of(eps, s.rb.spec)
        assert stride == 4
        fast = choose_goals(eps, ring, ids, strategy, u, stride)
        walked = choose_goals(eps, ring, ids, strategy, u, None)
        np.testing.assert_array_equal(fast, walked)


def test_episode_ends_follow_truncate_newest_clear_and_a_loaded_state() -> None:
    s = Stream(3, envs=2, capacity=40, lockstep=True, strategy="final", relabel_fraction=1.0)
    s.write(3)
    s.rb.sample(8)  # the ends table catches up here
    cut = s.rb.episodes.truncate_newest()
    for i in cut.tolist():
        s.end[i] = True
    s.write(2)
    batch = s.rb.sample(256)
    for t, g in zip(batch["index"].tolist(), batch["her_goal"].tolist(), strict=True):
        assert g == s.episode(t)[-1]
    state = s.rb.state_dict()
    other = ReplayBuffer(
        40, sampler=HerSampler(compute_reward=goal_gap, strategy="final", relabel_fraction=1.0), num_envs=2
    )
    other.load_state_dict(state)
    a, b = s.rb.sample(128), other.sample(128)
    assert torch.equal(a["her_goal"], b["her_goal"]) and torch.equal(a["desired_goal"], b["desired_goal"])
    s.rb.clear()
    s.env, s.end, s.term = [-1] * len(s.env), [True] * len(s.env), [False] * len(s.env)
    pad = s.rb._ring.next_id - len(s.env)  # ids go on from the next multiple of the capacity
    s.env += [-1] * pad
    s.end += [True] * pad
    s.term += [False] * pad
    s.write(4)
    batch = s.rb.sample(64)
    for t, g in zip(batch["index"].tolist(), batch["her_goal"].tolist(), strict=True):
        assert g == s.episode(t)[-1]


@pytest.mark.parametrize("strategy", ["future", "episode"])
def test_goal_offsets_are_uniform_over_the_allowed_steps(strategy: str) -> None:
    """Seeded frequency test: every item's episode has 8 steps; for items at position p
    the goal's position is uniform over p..7 (future) or 0..7 (episode). Tolerance: each
    cell within 5 binomial standard deviations of its expected count."""
    rb = ReplayBuffer(
        800, num_envs=2, seed=11,
        sampler=HerSampler(compute_reward=goal_gap, strategy=strategy, relabel_fraction=1.0),
    )  # fmt: skip
    steps = 400
    pos = np.tile(np.repeat(np.arange(steps) % 8, 1)[:, None], (1, 2)).reshape(-1)
    ids = torch.arange(steps * 2, dtype=torch.float32)
    rb.extend(
        {
            "achieved_goal": ids[:, None], "next_achieved_goal": ids[:, None] + 0.5,
            "desired_goal": torch.zeros(steps * 2, 1), "reward": torch.zeros(steps * 2),
            "terminated": torch.from_numpy(pos == 7),
        }
    )  # fmt: skip
    counts = np.zeros((8, 8), dtype=np.int64)
    for _ in range(10):
        batch = rb.sample(4096)
        t = batch["index"].numpy()
        g = batch["her_goal"].numpy()
        np.add.at(counts, (pos[t], pos[g]), 1)
        assert (rb.episodes.env(g) == rb.episodes.env(t)).all()
        assert ((g - t) // 2 == pos[g] - pos[t]).all()  # same episode
    for p in range(8):
        lo = p if strategy == "future" else 0
        row = counts[p]
        assert row[:lo].sum() == 0
        n, k = row.sum(), 8 - lo
        expected, sd = n / k, np.sqrt(n * (1 / k) * (1 - 1 / k))
        assert np.abs(row[lo:] - expected).max() <= 5 * sd + 1e-9, (p, row)


def test_nstep_windows_are_relabelled_with_the_items_goal() -> None:
    n, gamma = 3, 0.5
    for lockstep in (True, False):
        s = Stream(5, envs=2, capacity=60, lockstep=lockstep, strategy="future", relabel_fraction=0.5)
        sampler = s.rb.sampler
        assert isinstance(sampler, HerSampler)
        sampler.compute_terminated = reached
        s.rb._nstep = NStep(n, gamma)
        for _ in range(6):
            s.write(5)
            batch = s.rb.sample(64)
            m = 32
            for i in range(64):
                t, g = int(batch["index"][i]), int(batch["her_goal"][i])
                ep = s.episode(t)
                window = [j for j in ep if j >= t][:n]
                if i >= m:  # real: stored rewards (-3), stored ends
                    assert g == -1
                    continue
                rewards, term = [], False
                for j in window:
                    rewards.append(float(g - j))
                    if j == g:
                        term = True
                        break
                k = len(rewards)
                ret = sum(gamma**q * r for q, r in enumerate(rewards))
                assert int(batch["nstep_steps"][i]) == k
                assert float(batch["nstep_return"][i]) == pytest.approx(ret, abs=1e-4)
                assert float(batch["nstep_discount"][i]) == pytest.approx(0.0 if term else gamma**k)
                assert bool(batch["terminated"][i]) == term and bool(batch["nstep_terminated"][i]) == term
                assert float(batch["reward"][i]) == float(g - t)
                last = window[k - 1]
                assert float(batch["next_achieved_goal"][i, 0]) == last + 0.5
                assert float(batch["next_desired_goal"][i, 0]) == g + 0.5


def test_prioritized_base_keeps_priorities_per_stored_item() -> None:
    her = HerSampler(PrioritizedSampler(alpha=1.0, beta=1.0), compute_reward=goal_gap, relabel_fraction=0.5)
    rb = ReplayBuffer(32, sampler=her, num_envs=1, seed=0)
    ids = torch.arange(8.0)[:, None]
    rb.extend({"achieved_goal": ids, "next_achieved_goal": ids + 0.5, "desired_goal": ids * 0,
               "reward": torch.zeros(8), "terminated": torch.arange(8) % 4 == 3})  # fmt: skip
    rb.update_priority(torch.arange(8), torch.tensor([0.0, 0, 0, 0, 0, 0, 0, 1.0]))
    batch = rb.sample(64)
    assert (batch["index"] == 7).all() and "weight" in batch
    assert (batch["her_goal"][:32] == 7).all()  # 7 ends its episode: future gives 7 only
    with pytest.raises(PriorityError, match="wrap a PrioritizedSampler"):
        plain = ReplayBuffer(8, sampler=HerSampler(compute_reward=goal_gap), num_envs=1)
        plain.extend({"desired_goal": ids, "next_achieved_goal": ids, "reward": torch.zeros(8)})
        plain.update_priority([0], [1.0])


def test_a_bank_resumes_bit_for_bit(tmp_path: object) -> None:
    s = Stream(2, envs=2, capacity=40, lockstep=True, strategy="episode", n_sampled_goal=3)
    for _ in range(5):
        s.write(4)
    s.rb.sample(16)
    path = xpbank.save(s.rb, tmp_path / "bank")  # type: ignore[operator]
    loaded = xpbank.load(path)
    assert loaded.config()["sampler"] == s.rb.config()["sampler"]
    with pytest.raises(SpecError, match="no compute_reward"):
        loaded.sample(4)
    loaded.sampler.compute_reward = goal_gap  # type: ignore[attr-defined]
    for _ in range(3):
        a, b = s.rb.sample(32), loaded.sample(32)
        assert a.keys() == b.keys()
        for key in a.keys(True, True):
            assert torch.equal(a[key], b[key]), key


def test_nested_gymnasium_keys_and_configured_names() -> None:
    spec_batch = {
        ("obs", "observation"): torch.zeros(4, 2),
        ("obs", "achieved_goal"): torch.arange(4.0)[:, None],
        ("obs", "desired_goal"): torch.full((4, 1), 9.0),
        ("next", "obs", "observation"): torch.zeros(4, 2),
        ("next", "obs", "achieved_goal"): torch.arange(1.0, 5.0)[:, None],
        ("next", "obs", "desired_goal"): torch.full((4, 1), 9.0),
        ("next", "reward"): -torch.ones(4),
        ("next", "terminated"): torch.tensor([False, False, False, True]),
    }
    rb = ReplayBuffer(
        10,
        num_envs=1,
        seed=0,
        sampler=HerSampler(strategy="final", relabel_fraction=1.0, compute_reward=goal_gap),
    )
    rb.extend(spec_batch)
    batch = rb.sample(4)
    assert (batch["obs", "desired_goal"] == 4.0).all() and (batch["next", "obs", "desired_goal"] == 4.0).all()
    some = rb.sample(4, fields=[("obs", "desired_goal"), ("next", "reward")])  # goals read from storage
    assert (some["obs", "desired_goal"] == 4.0).all()
    assert some["next", "reward"].tolist() == (3.0 - some["index"]).tolist()  # 4 - next achieved
    keys = GoalKeys(desired="goal", next_achieved="reached")
    rb2 = ReplayBuffer(
        10,
        num_envs=1,
        seed=0,
        sampler=HerSampler(keys=keys, strategy="final", relabel_fraction=1.0, compute_reward=goal_gap),
    )
    rb2.extend({"goal": torch.zeros(4, 1), "reached": torch.arange(4.0)[:, None], "reward": torch.zeros(4)})
    assert (rb2.sample(4)["goal"] == 3.0).all()
    rb3 = ReplayBuffer(10, num_envs=1, sampler=HerSampler(compute_reward=goal_gap))
    rb3.extend({"obs": torch.zeros(4, 1), "reward": torch.zeros(4)})
    with pytest.raises(SpecError, match="no desired field"):
        rb3.sample(4)


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SpecError, match="strategy"):
        HerSampler(strategy="later")
    with pytest.raises(SpecError, match="not both"):
        HerSampler(n_sampled_goal=2, relabel_fraction=0.5)
    with pytest.raises(SpecError, match="relabel_fraction"):
        HerSampler(relabel_fraction=1.5)
    with pytest.raises(ValueError, match="n_sampled_goal"):
        HerSampler(n_sampled_goal=0)
    rb = ReplayBuffer(10, num_envs=1, sampler=HerSampler(compute_reward=lambda a, d, i: np.zeros(3)))
    rb.extend(
        {"desired_goal": torch.zeros(4, 1), "next_achieved_goal": torch.zeros(4, 1), "reward": torch.zeros(4)}
    )
    with pytest.raises(SpecError, match="one value per item"):
        rb.sample(8)
    batch = ReplayBuffer(10, num_envs=1, sampler=HerSampler(compute_reward=goal_gap))
    batch.extend(
        {"desired_goal": torch.zeros(4, 1), "next_achieved_goal": torch.zeros(4, 1), "reward": torch.zeros(4)}
    )
    sampled = batch.sample(4)
    with pytest.raises(SpecError):
        batch.update(sampled["index"], sampled)  # relabelled goals are not the stored ones


@pytest.mark.parametrize("lockstep", [True, False])
def test_frame_storage_images_and_goals(lockstep: bool) -> None:
    """Image observations stored once per step (FrameStorage) next to the goal fields:
    the frames come back as stored, the goals relabelled as with any storage."""
    rng = np.random.default_rng(0)
    n, e = 60, 2
    extra: dict[str, object] = {"num_envs": e} if lockstep else {}
    rb = ReplayBuffer(
        40, storage=xpbank.FrameStorage(40, stacked=False), seed=0, **extra,  # type: ignore[arg-type]
        sampler=HerSampler(compute_reward=goal_gap, strategy="future", relabel_fraction=0.5),
    )  # fmt: skip
    frames = torch.from_numpy(rng.integers(0, 255, (n + e, 3, 3), dtype=np.uint8))
    ends = torch.from_numpy(rng.random(n) < 0.1)
    ids = torch.arange(n, dtype=torch.float32)
    env = torch.arange(n) % e
    for t in range(0, n, e):  # one step of both envs at a time
        rows = slice(t, t + e)
        nxt = frames[t + e : t + 2 * e]
        batch = {
            "obs": frames[rows], ("next", "obs"): nxt, "achieved_goal": ids[rows, None],
            "next_achieved_goal": ids[rows, None] + 0.5, "desired_goal": torch.full((e, 1), -7.0),
            "reward": torch.zeros(e), "terminated": ends[rows],
        }  # fmt: skip
        if not lockstep:
            batch["env_id"] = env[rows]
        rb.extend(batch)
    sample = rb.sample(64)
    idx = sample["index"]
    assert torch.equal(sample["obs"], frames[idx])
    goal = sample["her_goal"][:32]
    assert (goal >= idx[:32]).all() and (rb.episodes.env(goal) == rb.episodes.env(idx[:32])).all()
    assert torch.equal(sample["desired_goal"][:32, 0], goal.float() + 0.5)


def test_a_prioritized_base_in_a_bank_resumes_with_its_priorities(tmp_path: object) -> None:
    her = HerSampler(PrioritizedSampler(), compute_reward=goal_gap)
    rb = ReplayBuffer(50, seed=0, sampler=her)  # one stream, no num_envs
    ids = torch.arange(30.0)[:, None]
    rb.extend({"desired_goal": ids, "next_achieved_goal": ids + 0.5, "reward": torch.zeros(30),
               "terminated": torch.arange(30) % 7 == 6})  # fmt: skip
    rb.update_priority(torch.arange(30), torch.rand(30, generator=torch.Generator().manual_seed(1)))
    loaded = xpbank.load(xpbank.save(rb, tmp_path / "bank"))  # type: ignore[operator]
    loaded.sampler.compute_reward = goal_gap  # type: ignore[attr-defined]
    for _ in range(3):
        a, b = rb.sample(16), loaded.sample(16)
        for key in ("index", "her_goal", "weight", "desired_goal", "reward"):
            assert torch.equal(a[key], b[key]), key


def test_goal_read_matches_gather_for_packed_and_plain_fields():
    """``_read`` (row items of a packed field's strided view) gives what a gather gives."""
    from xpbank import Field, Spec
    from xpbank.her.relabel import _read
    from xpbank.storage.tensor import TensorStorage

    spec = Spec(
        {
            "g": Field((3,)),
            "m": Field((2, 2), torch.int16),
            "s": Field((), torch.float64),
            "b": Field((2,), torch.bool),
            "h": Field((3,), torch.bfloat16),
        }
    )
    st = TensorStorage(50, spec)
    gen = torch.Generator().manual_seed(0)
    st.write(
        slice(0, 50),
        {
            "g": torch.rand(50, 3, generator=gen),
            "m": torch.randint(-9, 9, (50, 2, 2), generator=gen, dtype=torch.int16),
            "s": torch.rand(50, generator=gen, dtype=torch.float64),
            "b": torch.rand(50, 2, generator=gen) < 0.5,
            "h": torch.rand(50, 3, generator=gen).to(torch.bfloat16),
        },
    )
    slots = np.array([49, 0, 7, 7, 23], dtype=np.int64)
    for key in ("g", "m", "s", "b", "h"):
        got = _read(st, key, slots)
        want = st.gather(torch.from_numpy(slots), [key])[key]
        assert got.shape == tuple(want.shape), key
        assert torch.equal(torch.from_numpy(got).to(want.dtype), want), key  # bfloat16: read as float32
