"""PrioritizedSampler: naive O(N) reference, exact weights, errors, state, frequencies."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from sumtree_paths import sumtree_path  # noqa: F401 (autouse: both sum-tree paths)
from xpbank import (
    PrioritizedSampler,
    PriorityError,
    ReplayBuffer,
    StaleIndexError,
    XpbankIndexError,
)


def items(n: int, start: float = 0.0) -> dict:
    return {"obs": torch.arange(start, start + n, dtype=torch.float32)}


class NaivePER:
    """Priorities of live ids in a dict; every formula recomputed in O(N)."""

    def __init__(self, capacity: int, alpha: float, eps: float, max_priority: float):
        self.capacity, self.alpha, self.eps, self.max_p = capacity, alpha, eps, max_priority
        self.stored: dict[int, float] = {}
        self.next_id = 0

    def extend(self, n: int) -> None:
        for _ in range(n):
            self.stored[self.next_id] = self.max_p**self.alpha
            self.next_id += 1
        for old in [i for i in self.stored if i < self.next_id - self.capacity]:
            del self.stored[old]

    def clear(self) -> None:
        self.next_id = -(-self.next_id // self.capacity) * self.capacity
        self.stored = {}

    def update(self, ids, priorities) -> None:
        for i, p in zip(ids, priorities, strict=True):
            if i in self.stored:
                self.stored[i] = (p + self.eps) ** self.alpha
                self.max_p = max(self.max_p, p + self.eps)

    def by_slot(self) -> np.ndarray:
        """Stored priorities ordered by slot (what the inverse CDF walks)."""
        order = sorted(self.stored, key=lambda i: i % self.capacity)
        return np.array([self.stored[i] for i in order]), np.array(order)

    def draw(self, fractions: np.ndarray) -> np.ndarray:
        values, ids = self.by_slot()
        return ids[np.searchsorted(np.cumsum(values), fractions * values.sum(), side="right")]

    def weights(self, ids, beta: float, normalize: bool = True) -> np.ndarray:
        values = np.array(list(self.stored.values()))
        p = np.array([self.stored[i] for i in ids]) / values.sum()
        w = (len(values) * p) ** -beta
        return w / (len(values) * values.min() / values.sum()) ** -beta if normalize else w


def expected_draw(rb: ReplayBuffer, ref: NaivePER, batch: int) -> np.ndarray:
    """What the next sample must draw: same generator state, naive inverse CDF."""
    g = torch.Generator()
    g.set_state(rb.generator.get_state())
    draws = torch.rand(batch, generator=g, dtype=torch.float64).numpy()
    return ref.draw((np.arange(batch) + draws) / batch)


class PERMachine(RuleBasedStateMachine):
    """Extends, priority updates (integer priorities: exact sums), stale skips, clears,
    state round trips; every sample equals the naive inverse CDF and weight formula."""

    @initialize(capacity=st.integers(2, 40))
    def setup(self, capacity: int) -> None:
        self.rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=1.0, beta=0.5, eps=0.0), seed=1)
        self.ref = NaivePER(capacity, 1.0, 0.0, 1.0)

    @rule(n=st.integers(1, 30))
    def extend(self, n: int) -> None:
        self.rb.extend(items(n))
        self.ref.extend(n)

    @precondition(lambda self: self.ref.next_id > 0)
    @rule(data=st.data())
    def update(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.integers(0, self.ref.next_id - 1), min_size=1, max_size=10))
        prio = data.draw(st.lists(st.integers(1, 6), min_size=len(ids), max_size=len(ids)))
        self.rb.update_priority(ids, [float(p) for p in prio], stale="skip")
        self.ref.update(ids, prio)

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.ref.clear()

    @rule()
    def round_trip(self) -> None:
        other = ReplayBuffer(self.rb.capacity, sampler=PrioritizedSampler(alpha=1.0, beta=0.5, eps=0.0))
        other.load_state_dict(self.rb.state_dict())
        self.rb = other

    @precondition(lambda self: len(self.ref.stored) > 0)
    @rule(batch=st.integers(1, 16))
    def sample(self, batch: int) -> None:
        want = expected_draw(self.rb, self.ref, batch)
        got = self.rb.sample(batch)
        np.testing.assert_array_equal(got["index"].numpy(), want)
        np.testing.assert_allclose(got["weight"].numpy(), self.ref.weights(want, 0.5), rtol=1e-6)

    @invariant()
    def priorities_match(self) -> None:
        values, ids = self.ref.by_slot() if self.ref.stored else (np.zeros(0), np.zeros(0, dtype=np.int64))
        np.testing.assert_array_equal(self.rb.sampler.priority(ids % self.rb.capacity), values)
        assert len(self.rb) == len(self.ref.stored)


def test_per_machine() -> None:  # a function, not PERMachine.TestCase: run on both sum-tree paths
    per_settings = settings(max_examples=40, stateful_step_count=20, deadline=None)
    run_state_machine_as_test(PERMachine, settings=per_settings)


def test_exact_weights_hand_worked() -> None:
    """P = [0.2, 0.8], N = 2, beta = 1: raw weights (2 * P) ** -1 = [2.5, 0.625]."""
    for normalize, expected in ((True, [1.0, 0.25]), (False, [2.5, 0.625])):
        sampler = PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0, normalize_weights=normalize)
        rb = ReplayBuffer(8, sampler=sampler, seed=0)
        rb.extend(items(2))
        rb.update_priority([0, 1], [1.0, 4.0])
        batch = rb.sample(64)
        weight = dict(zip(batch["index"].tolist(), batch["weight"].tolist(), strict=True))
        assert weight == pytest.approx({0: expected[0], 1: expected[1]})
        assert batch["weight"].dtype == torch.float32


def test_alpha_eps_and_max_priority_for_new_items() -> None:
    rb = ReplayBuffer(10, sampler=PrioritizedSampler(alpha=0.5, eps=0.01, max_priority=2.0))
    rb.extend(items(3))
    assert rb.sampler.priority([0, 1, 2]).tolist() == pytest.approx([2.0**0.5] * 3)
    rb.update_priority([1], [8.99])
    rb.extend(items(1))  # new items get the largest priority so far: 9.0
    assert rb.sampler.priority([1, 3]).tolist() == pytest.approx([3.0, 3.0])
    assert rb.sampler.max_priority == pytest.approx(9.0)


def test_beta_schedule_anneals_linearly_to_one() -> None:
    sampler = PrioritizedSampler(beta=0.4, beta_steps=4)
    rb = ReplayBuffer(10, sampler=sampler, seed=0)
    rb.extend(items(4))
    seen = []
    for _ in range(6):
        seen.append(sampler.beta)
        rb.sample(2)
    assert seen == pytest.approx([0.4, 0.55, 0.7, 0.85, 1.0, 1.0])
    assert sampler.config() == {
        "alpha": 0.6,
        "beta": 0.4,
        "eps": 1e-6,
        "max_priority": 1.0,
        "beta_steps": 4,
        "normalize_weights": True,
        "tree_device": None,
    }


def test_only_live_items_are_drawn_after_wrap_and_clear() -> None:
    rb = ReplayBuffer(8, sampler=PrioritizedSampler(), seed=0)
    rb.extend(items(13))
    assert set(rb.sample(200)["index"].tolist()) <= set(range(5, 13))
    rb.clear()
    rb.extend(items(3))
    assert set(rb.sample(100)["index"].tolist()) == {16, 17, 18}


# the trees' backends: NumPy (the default on CPU storage) and torch (forced, on the CPU)
BACKENDS = pytest.mark.parametrize("tree_device", [None, "cpu"])


def _filled(tree_device: str | None = None) -> ReplayBuffer:
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(alpha=1.0, eps=0.0, tree_device=tree_device), seed=0)
    rb.extend(items(6))  # live ids 2..5
    rb.update_priority([2, 3, 4, 5], [1.0, 2.0, 3.0, 4.0])
    return rb


@pytest.mark.parametrize(
    ("ids", "prio", "error", "match"),
    [
        ([2, 3], [1.0, float("nan")], PriorityError, r"expected finite values >= 0, got nan at position 1"),
        ([2, 3], [float("inf"), 1.0], PriorityError, r"expected finite values >= 0, got inf at position 0"),
        ([2, 3], [1.0, -0.5], PriorityError, r"got -0.5 at position 1; nothing was updated"),
        ([2, 3], [1.0], PriorityError, r"priorities: expected one per index \(2\), got shape \(1,\)"),
        ([2, 9], [1.0, 1.0], XpbankIndexError, r"item 9 was never issued \(ids so far: 0 .. 5\)"),
        ([-1], [1.0], XpbankIndexError, r"item -1 was never issued"),
        ([1, 3], [7.0, 7.0], StaleIndexError, r"item 1 has been overwritten or cleared .* stale='skip'"),
        ([2], ["a"], PriorityError, r"priorities: expected numbers"),
    ],
)
@BACKENDS
def test_bad_updates_raise_and_write_nothing(
    ids: list, prio: list, error: type, match: str, tree_device: str | None
) -> None:
    rb = _filled(tree_device)
    before = rb.sampler.state_dict()
    with pytest.raises(error, match=match):
        rb.update_priority(ids, prio)
    after = rb.sampler.state_dict()
    np.testing.assert_array_equal(before["priorities"], after["priorities"])
    assert before["max_priority"] == after["max_priority"]


@BACKENDS
def test_stale_skip_writes_the_live_rest(tree_device: str | None) -> None:
    rb = _filled(tree_device)
    rb.update_priority(torch.tensor([0, 3, 1, 5]), torch.tensor([9.0, 7.0, 9.0, 6.0]), stale="skip")
    assert rb.sampler.priority([2, 3, 0, 1]).tolist() == [1.0, 7.0, 3.0, 6.0]  # slots of ids 2..5
    assert rb.sampler.max_priority == 7.0
    with pytest.raises(PriorityError, match=r"stale: expected 'raise' or 'skip', got 'ignore'"):
        rb.update_priority([2], [1.0], stale="ignore")


@BACKENDS
def test_repeated_id_keeps_last_priority(tree_device: str | None) -> None:
    rb = _filled(tree_device)
    rb.update_priority([3, 3, 3], [5.0, 1.0, 2.0])
    assert rb.sampler.priority([3]).tolist() == [2.0]


def test_uniform_buffer_and_bad_arguments() -> None:
    rb = ReplayBuffer(4)
    rb.extend(items(2))
    with pytest.raises(PriorityError, match=r"UniformSampler\(\) keeps no priorities"):
        rb.update_priority([0], [1.0])
    with pytest.raises(PriorityError, match=r"replace=False: prioritized sampling draws with replacement"):
        _filled().sample(2, replace=False)
    for kwargs, match in [
        ({"alpha": -1}, r"alpha: expected a finite number >= 0.0, got -1"),
        ({"beta": float("nan")}, r"beta: expected a finite number"),
        ({"max_priority": 0}, r"max_priority: expected a finite number > 0.0, got 0"),
        ({"eps": "x"}, r"eps: expected a finite number"),
        ({"alpha": 10**400}, r"alpha: expected a finite number >= 0.0, got 1000"),  # past float's range
    ]:
        with pytest.raises(PriorityError, match=match):
            PrioritizedSampler(**kwargs)


def test_state_dict_round_trip_resumes_identically() -> None:
    rb = ReplayBuffer(50, sampler=PrioritizedSampler(beta_steps=10), seed=3)
    rb.extend(items(70))
    batch = rb.sample(16)
    rb.update_priority(batch["index"], torch.rand(16, generator=torch.Generator().manual_seed(0)))
    state = rb.state_dict()
    for value in state["sampler"].values():
        assert isinstance(value, (int, float, torch.Tensor))
    other = ReplayBuffer(50, sampler=PrioritizedSampler(beta_steps=10))
    other.load_state_dict(state)
    assert other.sampler.beta == rb.sampler.beta
    for _ in range(3):
        a, b = rb.sample(32), other.sample(32)
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
    for x, y in zip(rb.sampler._sum + rb.sampler._min, other.sampler._sum + other.sampler._min, strict=True):
        np.testing.assert_array_equal(x, y)


# chi-square critical value at p = 0.001 for 9 degrees of freedom
CHI2_9DF_P001 = 27.877


def test_sampling_frequencies_chi_square() -> None:
    """10 items, priorities 1..10 (alpha = 1): 200 samples of 64 draws (12,800). The
    statistic against P(i) = i / 55 must stay below the p = 0.001 critical value (a
    false alarm 1 run in 1,000 for i.i.d. draws; stratified draws vary less). The
    same counts against a uniform P must fail it, so the test can detect a wrong P."""
    rb = ReplayBuffer(10, sampler=PrioritizedSampler(alpha=1.0, eps=0.0), seed=1234)
    rb.extend(items(10))
    rb.update_priority(range(10), np.arange(1.0, 11.0))
    counts = np.zeros(10)
    for _ in range(200):
        np.add.at(counts, rb.sample(64)["index"].numpy(), 1)
    expected = np.arange(1, 11) / 55 * counts.sum()
    assert ((counts - expected) ** 2 / expected).sum() < CHI2_9DF_P001
    uniform = np.full(10, counts.sum() / 10)
    assert ((counts - uniform) ** 2 / uniform).sum() > 100 * CHI2_9DF_P001


def test_zero_priorities_are_never_drawn_and_do_not_break_weights() -> None:
    rb = ReplayBuffer(6, sampler=PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0), seed=0)
    rb.extend(items(3))
    rb.update_priority([0, 1, 2], [0.0, 1.0, 3.0])
    batch = rb.sample(64)
    assert set(batch["index"].tolist()) == {1, 2}
    weight = dict(zip(batch["index"].tolist(), batch["weight"].tolist(), strict=True))
    assert weight == pytest.approx({1: 1.0, 2: 1 / 3})
    rb.update_priority([1, 2], [0.0, 0.0])
    with pytest.raises(PriorityError, match=r"every stored priority is 0 .* no item can be drawn"):
        rb.sample(2)
