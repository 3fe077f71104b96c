"""Sum-/min-tree invariants and descent against naive NumPy references."""

from __future__ import annotations

import numpy as np
import pytest

from sumtree_paths import sumtree_path  # noqa: F401 (autouse: both sum-tree paths)
from xpbank.sampler import sumtree


def assert_invariants(tree: sumtree.Tree, op: np.ufunc) -> None:
    """Every inner node is the reduction of its children (sums to rounding: the tree
    adds 16 children with a dot product, whose order differs from ``np.add.reduce``)."""
    for j in range(1, len(tree)):
        expected = op.reduce(tree[j - 1].reshape(-1, sumtree.FANOUT), axis=1)
        if op is np.minimum:
            np.testing.assert_array_equal(tree[j], expected)
        else:
            np.testing.assert_allclose(tree[j], expected, rtol=1e-12, atol=0)
    assert tree[-1].shape[0] <= sumtree.TOP


@pytest.mark.parametrize("capacity", [1, 5, 16, 17, 300, 70_000])
def test_random_updates_keep_root_equal_to_leaves(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    sums, mins = sumtree.new_tree(capacity, np.add), sumtree.new_tree(capacity, np.minimum)
    naive = np.zeros(capacity)
    written = np.zeros(capacity, dtype=bool)
    for step in range(30):
        if step % 3 == 0:
            start = int(rng.integers(0, capacity))
            stop = int(rng.integers(start, capacity + 1))
            value = float(rng.random())
            sumtree.set_range(sums, start, stop, value, np.add)
            sumtree.set_range(mins, start, stop, value, np.minimum)
            naive[start:stop] = value
            written[start:stop] = True
        else:
            slots = rng.integers(0, capacity, int(rng.integers(1, 40)))
            values = rng.random(slots.shape[0])
            sumtree.set_leaves(sums, slots, values, np.add)
            sumtree.set_leaves(mins, slots, values, np.minimum)
            for s, v in zip(slots, values, strict=True):  # the last of a repeated slot wins
                naive[s] = v
                written[s] = True
        np.testing.assert_array_equal(sums[0][:capacity], naive)
        assert_invariants(sums, np.add)
        assert_invariants(mins, np.minimum)
        assert sumtree.top_reduce(sums, np.add) == pytest.approx(naive.sum(), rel=1e-12)
        expected_min = naive[written].min() if written.any() else np.inf
        assert sumtree.top_reduce(mins, np.minimum) == expected_min


def test_rebuild_is_bit_identical() -> None:
    rng = np.random.default_rng(0)
    tree = sumtree.new_tree(5000, np.add)
    sumtree.set_leaves(tree, rng.integers(0, 5000, 700), rng.random(700), np.add)
    copy = [level.copy() for level in tree]
    sumtree.rebuild(copy, np.add)
    for a, b in zip(tree, copy, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("capacity", [3, 40, 5000, 100_000])
def test_descent_matches_naive_inverse_cdf(capacity: int) -> None:
    """Integer priorities make every partial sum exact, so the answers must be equal."""
    rng = np.random.default_rng(capacity)
    leaves = rng.integers(0, 5, capacity).astype(np.float64)
    leaves[rng.integers(0, capacity)] = 3.0  # at least one positive
    tree = sumtree.new_tree(capacity, np.add)
    sumtree.set_leaves(tree, np.arange(capacity), leaves, np.add)
    fractions = np.concatenate([rng.random(500), [0.0, 1.0 - 1e-16]])
    slots, total = sumtree.find_prefix_sum(tree, fractions)
    assert total == leaves.sum()
    naive = np.searchsorted(np.cumsum(leaves), fractions * leaves.sum(), side="right")
    np.testing.assert_array_equal(slots, np.minimum(naive, np.flatnonzero(leaves)[-1]))
    assert (leaves[slots] > 0).all()


def test_descent_never_returns_a_zero_leaf_under_rounding() -> None:
    rng = np.random.default_rng(1)
    capacity = 20_000
    leaves = np.where(rng.random(capacity) < 0.5, 0.0, rng.random(capacity) * 1e-3)
    tree = sumtree.new_tree(capacity, np.add)
    sumtree.set_leaves(tree, np.arange(capacity), leaves, np.add)
    edge = np.nextafter(1.0, 0.0)
    slots, _ = sumtree.find_prefix_sum(tree, np.concatenate([rng.random(4000), np.full(8, edge)]))
    assert (leaves[slots] > 0).all()


def test_descent_with_shared_top_prefix_sums() -> None:
    """``top_prefix`` computed once and passed in gives the same leaves and total."""
    rng = np.random.default_rng(2)
    tree = sumtree.new_tree(70_000, np.add)
    sumtree.set_leaves(tree, np.arange(70_000), rng.random(70_000), np.add)
    cums = sumtree.top_prefix(tree)
    assert cums[0] == 0.0 and cums.shape == (tree[-1].shape[0] + 1,)
    np.testing.assert_array_equal(cums[1:], np.cumsum(tree[-1]))  # the same sequential sums
    fractions = rng.random(300)
    slots, total = sumtree.find_prefix_sum(tree, fractions, cums)
    again, total_again = sumtree.find_prefix_sum(tree, fractions)
    np.testing.assert_array_equal(slots, again)
    assert total == total_again == cums[-1]


@pytest.mark.parametrize("op", [np.add, np.minimum])
def test_levels_start_on_128_byte_boundaries(op: np.ufunc) -> None:
    # a node's 16 float64 children are then exactly two cache lines
    for capacity in [1, 17, 5000, 70_000]:
        tree = sumtree.new_tree(capacity, op)
        for level in tree:
            assert level.ctypes.data % 128 == 0 and level.flags.c_contiguous and level.flags.writeable
            assert (level == (np.inf if op is np.minimum else 0.0)).all()
