"""LazyMin: the smallest positive leaf against a brute-force minimum after every write."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from xpbank import PrioritizedSampler, ReplayBuffer, XpbankIndexError
from xpbank.sampler import sumtree
from xpbank.sampler.lazymin import LazyMin


def brute_min(leaves: np.ndarray) -> float:
    positive = leaves[leaves > 0]
    return float(positive.min()) if positive.size else float("inf")


def rebuilt(leaves: np.ndarray) -> sumtree.Tree:
    tree = sumtree.new_tree(leaves.shape[0], np.minimum)
    tree[0][: leaves.shape[0]] = np.where(leaves > 0, leaves, np.inf)
    sumtree.rebuild(tree, np.minimum)
    return tree


class LazyMinMachine(RuleBasedStateMachine):
    """Slot and range writes over a few small integer values (so that ties with the
    minimum, raising the minimum's leaf and zeros all happen often)."""

    @initialize(n=st.sampled_from([1, 7, 40, 2000]))
    def setup(self, n: int) -> None:
        self.leaves = np.zeros(n)
        self.lazy = LazyMin(self.leaves)

    @rule(data=st.data())
    def write_slots(self, data: st.DataObject) -> None:
        n = self.leaves.shape[0]
        slots = np.array(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=12)))
        values = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.0]), min_size=len(slots),
                                             max_size=len(slots))))  # fmt: skip
        old = self.leaves[slots]
        self.leaves[slots] = values  # a repeated slot keeps its last value
        self.lazy.changed(slots, old, self.leaves[slots])

    @rule(data=st.data(), value=st.sampled_from([0.0, 1.0, 2.0, 3.0]))
    def write_range(self, data: st.DataObject, value: float) -> None:
        n = self.leaves.shape[0]
        start = data.draw(st.integers(0, n))
        stop = data.draw(st.integers(start, n) | st.integers(start, min(n, start + 9)))  # short: pending
        self.lazy.changed(slice(start, stop), self.leaves[start:stop], np.full(1, value))  # before
        self.leaves[start:stop] = value

    @rule()
    def raise_the_minimum(self) -> None:
        """Raise every leaf holding the minimum: the case that needs the tree."""
        at = np.flatnonzero(self.leaves == brute_min(self.leaves))
        old = self.leaves[at]
        self.leaves[at] += 1.0
        self.lazy.changed(at, old, self.leaves[at])

    @rule()
    def reset(self) -> None:
        self.lazy.reset()

    @invariant()
    def minimum_is_exact(self) -> None:
        assert self.lazy.value == brute_min(self.leaves)

    @rule()
    def tree_equals_a_rebuild(self) -> None:
        for got, want in zip(self.lazy.tree, rebuilt(self.leaves), strict=True):
            np.testing.assert_array_equal(got, want)


TestLazyMinMachine = LazyMinMachine.TestCase
TestLazyMinMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


@pytest.mark.parametrize("n", [50, 5000])
def test_random_batches_with_the_minimum_raised(n: int) -> None:
    """Batches of random slots with random values, some raising the current minimum's
    leaf, some overwriting ranges (the pending list overflows into a full rebuild)."""
    rng = np.random.default_rng(n)
    leaves = np.zeros(n)
    lazy = LazyMin(leaves)
    for step in range(200):
        if step % 7 == 0:
            start = int(rng.integers(0, n))
            stop = int(rng.integers(start, n + 1))
            value = float(rng.random())
            lazy.changed(slice(start, stop), leaves[start:stop], np.full(1, value))
            leaves[start:stop] = value
        else:
            slots = rng.integers(0, n, 16)
            if step % 3 == 0:
                slots[0] = int(np.argmin(np.where(leaves > 0, leaves, np.inf)))  # the minimum's leaf
            values = np.where(rng.random(16) < 0.1, 0.0, rng.random(16))
            if step % 3 == 0:
                values[0] = 2.0  # raised above every other value
            old = leaves[slots]
            leaves[slots] = values
            lazy.changed(slots, old, leaves[slots])
        if step % 4 == 0 or step > 190:
            assert lazy.value == brute_min(leaves)
    for got, want in zip(lazy.tree, rebuilt(leaves), strict=True):
        np.testing.assert_array_equal(got, want)


def test_pending_writes_are_replayed_without_a_rebuild() -> None:
    """Few small writes (slots and ranges) are refreshed one by one, not by a rebuild."""
    rng = np.random.default_rng(3)
    leaves = np.zeros(20_000)  # up to 20_000 // 64 = 312 pending leaves before a rebuild
    lazy = LazyMin(leaves)
    for step in range(12):
        if step % 2:
            start = int(rng.integers(0, 19_990))
            lazy.changed(slice(start, start + 7), leaves[start : start + 7], np.full(1, 1.0 + step))
            leaves[start : start + 7] = 1.0 + step
        else:
            slots = rng.integers(0, 20_000, 9)
            old = leaves[slots]
            leaves[slots] = rng.random(9) + 0.5
            lazy.changed(slots, old, leaves[slots])
    at = np.flatnonzero(leaves == brute_min(leaves))
    old = leaves[at]
    leaves[at] = 50.0
    lazy.changed(at, old, leaves[at])
    assert not lazy._rebuild and lazy._pending
    assert lazy.value == brute_min(leaves)
    for got, want in zip(lazy.tree, rebuilt(leaves), strict=True):
        np.testing.assert_array_equal(got, want)


def test_tree_is_left_alone_until_the_minimum_is_unknown() -> None:
    leaves = np.zeros(64)
    lazy = LazyMin(leaves)
    leaves[:4] = [3.0, 1.0, 2.0, 5.0]
    lazy.changed(np.arange(4), np.zeros(4), leaves[:4])
    old = leaves[[0, 2]]
    leaves[[0, 2]] = [4.0, 6.0]  # no old value is the minimum 1.0: still known
    lazy.changed(np.array([0, 2]), old, leaves[[0, 2]])
    assert lazy._known and lazy.value == 1.0
    assert lazy._tree[-1].min() == np.inf  # not flushed: nothing needed it
    old = leaves[[1]]
    leaves[1] = 7.0
    lazy.changed(np.array([1]), old, leaves[[1]])
    assert not lazy._known
    assert lazy.value == 4.0 and lazy._known
    assert lazy._tree[-1].min() == 4.0


def test_sampler_weights_follow_a_raised_minimum() -> None:
    """Raising the item of smallest priority changes every normalized weight."""
    rb = ReplayBuffer(8, sampler=PrioritizedSampler(alpha=1.0, beta=1.0, eps=0.0), seed=0)
    rb.extend({"obs": np.arange(3.0)})
    rb.update_priority([0, 1, 2], [1.0, 2.0, 4.0])
    first = rb.sample(64)
    assert dict(zip(first["index"].tolist(), first["weight"].tolist(), strict=True))[2] == pytest.approx(0.25)
    rb.update_priority([0], [8.0])  # the minimum 1.0 is gone: the new one is 2.0
    batch = rb.sample(64)
    weight = dict(zip(batch["index"].tolist(), batch["weight"].tolist(), strict=True))
    assert weight == pytest.approx({0: 0.25, 1: 1.0, 2: 0.5})


def test_sampler_sees_every_write_after_a_cached_sample() -> None:
    """The top's prefix sums are kept between samples: each kind of write must drop them."""
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(alpha=1.0, eps=0.0), seed=0)
    rb.extend({"obs": np.arange(2.0)})
    rb.sample(8)
    rb.update_priority([0], [0.0])
    assert set(rb.sample(64)["index"].tolist()) == {1}
    rb.update_priority([1], [0.0])
    rb.extend({"obs": np.arange(1.0)})  # id 2, the largest priority so far
    assert set(rb.sample(64)["index"].tolist()) == {2}
    rb.clear()
    rb.extend({"obs": np.arange(3.0)})
    assert set(rb.sample(256)["index"].tolist()) == {4, 5, 6}
    other = ReplayBuffer(4, sampler=PrioritizedSampler(alpha=1.0, eps=0.0), seed=0)
    other.extend({"obs": np.arange(1.0)})
    other.sample(8)
    other.load_state_dict(rb.state_dict())
    assert set(other.sample(256)["index"].tolist()) == {4, 5, 6}


def test_priorities_that_require_grad_are_taken() -> None:
    """``td_error.abs()`` straight from the loss (requires grad) needs no ``.detach()``."""
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(alpha=1.0, eps=0.0), seed=0)
    rb.extend({"obs": np.arange(2.0)})
    td_error = torch.tensor([0.5, -2.0], requires_grad=True) * 1.0
    rb.update_priority(torch.tensor([0, 1], dtype=torch.int32), td_error.abs())
    assert rb.sampler.priority([0, 1]).tolist() == [0.5, 2.0]


def test_bfloat16_priorities_are_taken_and_bfloat16_ids_refused() -> None:
    """A mixed-precision TD error (bfloat16, which NumPy lacks) is a valid priority; ids
    must still be integers, refused by name with nothing written."""
    rb = ReplayBuffer(4, sampler=PrioritizedSampler(alpha=1.0, eps=0.0), seed=0)
    rb.extend({"obs": np.arange(2.0)})
    rb.update_priority(torch.tensor([0, 1]), torch.tensor([0.5, 2.0], dtype=torch.bfloat16))
    assert rb.sampler.priority([0, 1]).tolist() == [0.5, 2.0]
    with pytest.raises(XpbankIndexError, match=r"indices: expected integers, got dtype float32"):
        rb.update_priority(torch.tensor([0.0, 1.0], dtype=torch.bfloat16), torch.ones(2))
    assert rb.sampler.priority([0, 1]).tolist() == [0.5, 2.0]
