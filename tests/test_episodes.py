"""EpisodeIndex against a brute-force reference: per-env lists of every item written."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from xpbank import EpisodeKeys, ReplayBuffer, SpecError, StaleIndexError


class Reference:
    """Every item since the last clear: (id, env, terminated, truncated), in id order."""

    def __init__(self, capacity: int):
        self.capacity, self.items, self.next_id = capacity, [], 0

    def extend(self, envs, term, trunc) -> None:
        for e, a, b in zip(envs, term, trunc, strict=True):
            self.items.append((self.next_id, int(e), bool(a), bool(b)))
            self.next_id += 1

    def clear(self) -> None:
        self.next_id = -(-self.next_id // self.capacity) * self.capacity
        self.items = []

    def truncate_newest(self) -> list[int]:
        """Each env's newest item, where live and not ending its episode, becomes truncated."""
        live, marked = set(self.live()), []
        for env in sorted({it[1] for it in self.items}):
            p = max(p for p, it in enumerate(self.items) if it[1] == env)
            i, e, term, trunc = self.items[p]
            if i in live and not (term or trunc):
                self.items[p] = (i, e, term, True)
                marked.append(i)
        return marked

    def live(self) -> list[int]:
        return [i for i, *_ in self.items[-self.capacity :]]

    def stream(self, x: int) -> tuple[list[tuple], int]:
        """The items of ``x``'s env and ``x``'s position there."""
        env = next(e for i, e, *_ in self.items if i == x)
        items = [it for it in self.items if it[1] == env]
        return items, [it[0] for it in items].index(x)

    def start(self, x: int) -> int:
        items, p = self.stream(x)
        while p > 0 and not (items[p - 1][2] or items[p - 1][3]):
            p -= 1
        return items[p][0]

    def window(self, x: int, n: int) -> list[int]:
        items, p = self.stream(x)
        out = [x]
        while len(out) < n and not (items[p][2] or items[p][3]) and p + 1 < len(items):
            p += 1
            out.append(items[p][0])
        return out + [-1] * (n - len(out))


def batch(envs, term, trunc, env_field: bool) -> dict:
    out = {
        "obs": torch.zeros(len(envs), 2),
        "terminated": torch.as_tensor(term, dtype=torch.bool),
        "truncated": torch.as_tensor(trunc, dtype=torch.bool),
    }
    if env_field:
        out["env_id"] = torch.as_tensor(envs, dtype=torch.int64)
    return out


def check(rb: ReplayBuffer, ref: Reference, n: int = 4) -> None:
    live = ref.live()
    assert len(rb) == len(live)
    if not live:
        return
    eps = rb.episodes
    by_id = {i: (e, a, b) for i, e, a, b in ref.items}
    assert eps.env(live).tolist() == [by_id[i][0] for i in live]
    assert eps.terminated(live).tolist() == [by_id[i][1] for i in live]
    assert eps.truncated(live).tolist() == [by_id[i][2] for i in live]
    assert eps.is_end(live).tolist() == [by_id[i][1] or by_id[i][2] for i in live]
    assert eps.episode_start(live).tolist() == [ref.start(i) for i in live]
    win, valid = eps.window(live, n)
    assert win.tolist() == [ref.window(i, n) for i in live]
    assert (valid == (win >= 0)).all()
    assert eps.successors(live, 2).tolist() == [ref.window(i, 3)[2] for i in live]
    first = min(live)
    pred = []
    for i in live:
        items, p = ref.stream(i)
        ok = p > 0 and not (items[p - 1][2] or items[p - 1][3]) and items[p - 1][0] >= first
        pred.append(items[p - 1][0] if ok else -1)
    assert eps.predecessors(live).tolist() == pred
    links = eps.links()  # flags: the (terminated, truncated) columns, one array
    assert (links.flags[:, 0] == links.terminated).all()
    assert (links.flags[:, 1] == links.truncated).all() and links.terminated.base is links.flags
    if eps.lockstep is not None:  # the n-step kernel's rule: no next item <=> ended or newest
        e, next_id = eps.lockstep, rb._ring.next_id
        no_next = [ref.window(i, 2)[1] < 0 for i in live]
        assert no_next == [by_id[i][1] or by_id[i][2] or i + e >= next_id for i in live]


def random_stream(seed: int, capacity: int, num_envs: int, env_field: bool, steps: int = 60):
    rng = np.random.default_rng(seed)
    rb = ReplayBuffer(capacity, num_envs=None if env_field else num_envs)
    ref = Reference(capacity)
    for step in range(steps):
        if env_field:
            k = int(rng.integers(1, 2 * num_envs + 1))
            envs = rng.integers(0, num_envs, k)
        else:
            envs = np.tile(np.arange(num_envs), int(rng.integers(1, 3)))
        term = rng.random(len(envs)) < 0.15
        trunc = (rng.random(len(envs)) < 0.1) & ~term
        rb.extend(batch(envs, term, trunc, env_field))
        ref.extend(envs, term, trunc)
        if step % 17 == 16:
            rb.clear()
            ref.clear()
        check(rb, ref)
    return rb, ref


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("env_field", [False, True])
def test_random_streams_match_reference_across_wraps_and_clears(seed: int, env_field: bool) -> None:
    random_stream(seed, capacity=23, num_envs=3, env_field=env_field)


def test_one_stream_without_envs() -> None:
    rb = ReplayBuffer(10, num_envs=1)
    ref = Reference(10)
    term = [False, True, False, False, False]
    rb.extend(batch([0] * 5, term, [False] * 5, False))
    ref.extend([0] * 5, term, [False] * 5)
    check(rb, ref)
    assert rb.episodes.episode_start([4]).tolist() == [2]


def test_batch_over_capacity_keeps_tail_and_links() -> None:
    rb = ReplayBuffer(5, num_envs=2)
    ref = Reference(5)
    envs = np.tile([0, 1], 6)
    term = np.zeros(12, dtype=bool)
    term[7] = True
    rb.extend(batch(envs, term, np.zeros(12, dtype=bool), False))
    ref.extend(envs, term, np.zeros(12, dtype=bool))
    check(rb, ref)


def test_state_dict_round_trip_keeps_index() -> None:
    rb, ref = random_stream(7, capacity=19, num_envs=4, env_field=True, steps=20)
    state = rb.state_dict()
    assert all(isinstance(v, (torch.Tensor, int, type(None))) for v in state["episodes"].values())
    other = ReplayBuffer(19)
    other.load_state_dict(state)
    check(other, ref)
    envs, term = np.array([0, 1, 2, 3]), np.array([True, False, False, False])
    for buf in (rb, other):
        buf.extend(batch(envs, term, ~term & False, True))
    ref.extend(envs, term, [False] * 4)
    check(other, ref)


def test_torchrl_and_done_keys() -> None:
    rb = ReplayBuffer(10, num_envs=1)
    rb.extend(
        {
            "obs": torch.zeros(3),
            "next": {"terminated": torch.tensor([0, 1, 0]), "truncated": torch.tensor([1, 0, 0])},
        }
    )
    assert rb.episodes.terminated([0, 1, 2]).tolist() == [False, True, False]
    assert rb.episodes.truncated([0, 1, 2]).tolist() == [True, False, False]
    done = ReplayBuffer(10, num_envs=1)
    done.extend({"obs": torch.zeros(3), "done": torch.tensor([False, True, False])})
    assert done.episodes.terminated([0, 1, 2]).tolist() == [False, True, False]
    custom = ReplayBuffer(10, episode_keys=EpisodeKeys(env="worker", truncated="cut"))
    custom.extend({"worker": torch.tensor([3, 3]), "cut": torch.tensor([True, False])})
    assert custom.episodes.truncated([0, 1]).tolist() == [True, False]
    assert custom.episodes.env([0, 1]).tolist() == [3, 3]


def test_index_only_when_asked_for() -> None:
    plain = ReplayBuffer(10)
    plain.extend({"obs": torch.zeros(4, 2), "terminated": torch.zeros(4, dtype=torch.bool)})
    assert plain.episodes is None
    lazy = ReplayBuffer(10)
    lazy.extend({"obs": torch.zeros(2), "env_id": torch.tensor([1, 0])})
    assert lazy.episodes is not None and lazy.episodes.env([0, 1]).tolist() == [1, 0]


@pytest.mark.parametrize(
    ("kwargs", "good", "bad", "match"),
    [
        (
            {"num_envs": 4},
            {"obs": torch.zeros(4)},
            {"obs": torch.zeros(6)},
            r"batch of 6 items with num_envs=4: expected whole env steps",
        ),
        (
            {},
            None,
            {"obs": torch.zeros(2), "env_id": torch.tensor([0.0, 1.0])},
            r"'env_id' \(env id\): expected an integer",
        ),
        (
            {},
            {"obs": torch.zeros(1), "env_id": torch.tensor([3])},
            {"obs": torch.zeros(2), "env_id": torch.tensor([0, -1])},
            r"expected ids in \[0, 1048576\), got -1",
        ),
        (
            {"num_envs": 2},
            {"obs": torch.zeros(1), "env_id": torch.tensor([1])},
            {"obs": torch.zeros(2), "env_id": torch.tensor([0, 2])},
            r"expected ids in \[0, 2\), got 2",
        ),
    ],
)
def test_bad_batches_raise_and_leave_buffer_unchanged(
    kwargs: dict, good: dict | None, bad: dict, match: str
) -> None:
    rb = ReplayBuffer(10, **kwargs)
    if good is not None:
        rb.extend(good)
    before = rb.state_dict()
    with pytest.raises(SpecError, match=match):
        rb.extend(bad)
    after = rb.state_dict()
    assert after["ring"] == before["ring"]
    if good is None:
        assert rb.spec is None
    else:
        for key, value in before["episodes"].items():
            assert np.array_equal(np.asarray(value), np.asarray(after["episodes"][key])), key


def test_missing_named_key_and_stale_ids() -> None:
    rb = ReplayBuffer(4, num_envs=1, episode_keys=EpisodeKeys(terminated="term"))
    with pytest.raises(SpecError, match=r"episode_keys.terminated: field 'term' is not in the spec"):
        rb.extend({"obs": torch.zeros(2)})
    assert len(rb) == 0
    ok = ReplayBuffer(4, num_envs=1)
    ok.extend({"obs": torch.zeros(6)})
    with pytest.raises(StaleIndexError, match=r"ids: item 1 is not live \(live items: 2 .. 5\)"):
        ok.episodes.window([1], 2)


class IndexMachine(RuleBasedStateMachine):
    """Random extends (env-id field, any order), clears and state round trips."""

    @initialize(capacity=st.integers(1, 12))
    def setup(self, capacity: int) -> None:
        self.rb, self.ref = ReplayBuffer(capacity), Reference(capacity)

    @rule(
        rows=st.lists(
            st.tuples(st.integers(0, 2), st.sampled_from(["", "term", "trunc"])), min_size=1, max_size=8
        )
    )
    def extend(self, rows: list) -> None:
        envs = [e for e, _ in rows]
        term = [f == "term" for _, f in rows]
        trunc = [f == "trunc" for _, f in rows]
        self.rb.extend(batch(envs, term, trunc, True))
        self.ref.extend(envs, term, trunc)

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.ref.clear()

    @rule()
    def truncate(self) -> None:
        if self.rb.episodes is not None:
            marked = self.rb.episodes.truncate_newest()
            assert sorted(marked.tolist()) == sorted(self.ref.truncate_newest())

    @rule()
    def round_trip(self) -> None:
        if self.rb.spec is None:
            return
        num_envs = self.rb.episodes.num_envs if self.rb.episodes is not None else None
        other = ReplayBuffer(self.rb.capacity, num_envs=num_envs)
        other.load_state_dict(self.rb.state_dict())
        self.rb = other

    @invariant()
    def matches(self) -> None:
        if self.rb.episodes is not None:
            check(self.rb, self.ref, n=3)


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=40, stateful_step_count=15, deadline=None)


def test_loading_a_state_without_index_into_a_buffer_with_one_raises() -> None:
    plain = ReplayBuffer(8)
    plain.extend({"obs": torch.zeros(4)})
    indexed = ReplayBuffer(8, num_envs=2)
    with pytest.raises(SpecError, match=r"state holds no episode index, but this buffer keeps one"):
        indexed.load_state_dict(plain.state_dict())
    assert len(indexed) == 0


class LockstepMachine(IndexMachine):
    """:class:`IndexMachine` with lockstep extends (``num_envs=E``, ``k`` time-major steps
    per call): covers the fast paths of lockstep writes (one slice of predecessor links)
    and their fallbacks (wrap, dead predecessors)."""

    @initialize(capacity=st.integers(1, 14), num_envs=st.integers(1, 3))
    def setup(self, capacity: int, num_envs: int) -> None:  # type: ignore[override]
        self.e = num_envs
        self.rb, self.ref = ReplayBuffer(capacity, num_envs=num_envs), Reference(capacity)

    @rule(
        steps=st.lists(
            st.lists(st.sampled_from(["", "term", "trunc"]), min_size=3, max_size=3), min_size=1, max_size=3
        )
    )
    def extend(self, steps: list) -> None:  # type: ignore[override]
        flags = [f for row in steps for f in row[: self.e]]
        envs = [i % self.e for i in range(len(flags))]
        self.rb.extend(batch(envs, [f == "term" for f in flags], [f == "trunc" for f in flags], False))
        self.ref.extend(envs, [f == "term" for f in flags], [f == "trunc" for f in flags])


TestLockstepMachine = LockstepMachine.TestCase
TestLockstepMachine.settings = settings(max_examples=60, stateful_step_count=20, deadline=None)


@pytest.mark.parametrize("env_field", [False, True])
def test_truncate_newest_ends_each_open_episode_at_its_newest_item(env_field: bool) -> None:
    """Env 0 open, env 1 just terminated: only env 0's newest item is cut (as a
    truncation, like env 1's end); each env's next item then starts an episode."""
    rb = ReplayBuffer(8, num_envs=None if env_field else 2)
    envs = torch.tensor([0, 1, 0, 1]) if env_field else None

    def write(term: list[bool]) -> range:
        batch = {"obs": torch.zeros(4, 1), "terminated": torch.tensor(term)}
        if envs is not None:
            batch["env_id"] = envs
        return rb.extend(batch)

    write([False, False, False, True])  # ids 0..3: env 0 = [0, 2] open, env 1 = [1, 3] ended
    eps = rb.episodes
    assert eps.truncate_newest().tolist() == [2]
    assert eps.truncate_newest().tolist() == []  # nothing left open
    assert eps.truncated([0, 1, 2, 3]).tolist() == [False, False, True, False]
    assert eps.successors([0, 2]).tolist() == [2, -1]
    ids = write([False] * 4)  # ids 4..7 wrap nothing (capacity 8): 4 and 5 start episodes
    assert eps.episode_start(list(ids)).tolist() == [4, 5, 4, 5]
    assert eps.predecessors([4, 5]).tolist() == [-1, -1]  # no predecessor in the episode
    assert eps.successors([2, 3]).tolist() == [-1, -1]


def test_truncate_newest_after_new_envs_appear_past_a_clear() -> None:
    """Env ids seen for the first time after a clear grow the per-env state; truncating
    then marks the new env's newest item (once failed: the lockstep-only ``fresh`` flags
    kept the old width)."""
    rb = ReplayBuffer(4)
    rb.extend(batch([1], [False], [False], True))
    rb.clear()
    ids = rb.extend(batch([2], [False], [False], True))
    assert rb.episodes.truncate_newest().tolist() == [ids[0]]
    assert rb.episodes.truncated([ids[0]]).tolist() == [True]
