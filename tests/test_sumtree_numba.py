"""The sum-tree's compiled kernels (numba) against its NumPy path, on random inputs.

Trees must be bit-identical (both add 16 children pairwise in the same order). Descents
must pick the same leaves: exactly with integer priorities (every partial sum exact);
with float priorities the two paths' prefix sums of 16 children may differ in the last
bit (NumPy's come from a BLAS product), which changes a leaf only for a draw within
rounding of a boundary (~1e-16 per draw): none occurs with these seeds.
"""

from __future__ import annotations

import numpy as np
import pytest

from sumtree_paths import kernels_fixture, numpy_path, random_slots  # noqa: F401 (the kernels fixture)
from xpbank.sampler import sumtree

CAPACITIES = [1, 5, 16, 17, 300, 4096 * 16 + 3, 1_100_000]


def both_set_leaves(
    monkeypatch: pytest.MonkeyPatch, a: sumtree.Tree, b: sumtree.Tree, slots: np.ndarray, values: np.ndarray
) -> None:
    """``set_leaves`` on tree ``a`` by the kernel, on tree ``b`` by NumPy."""
    sumtree.set_leaves(a, slots, values, np.add)
    with monkeypatch.context() as m:
        numpy_path(m)
        sumtree.set_leaves(b, slots, values, np.add)


def assert_same(a: sumtree.Tree, b: sumtree.Tree) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_set_leaves_matches_numpy_and_rebuild(
    kernels: object, monkeypatch: pytest.MonkeyPatch, capacity: int
) -> None:
    rng = np.random.default_rng(capacity)
    a, b = sumtree.new_tree(capacity, np.add), sumtree.new_tree(capacity, np.add)
    for step in range(12):
        n = int(rng.integers(1, 300))
        # duplicates (a small range), the last slots (the newest items of a full ring), zeros
        slots = random_slots(rng, capacity, n, newest=step % 3 == 0, repeat=step % 4 == 1)
        values = rng.random(slots.shape[0]) * 10.0 ** rng.integers(-6, 7, slots.shape[0])
        values[rng.random(values.shape[0]) < 0.1] = 0.0
        both_set_leaves(monkeypatch, a, b, slots, values)
        assert_same(a, b)
    rebuilt = [level.copy() for level in a]
    sumtree.rebuild(rebuilt, np.add)
    assert_same(a, rebuilt)


def test_set_leaves_repeated_slot_keeps_last(kernels: object) -> None:
    tree = sumtree.new_tree(40, np.add)
    sumtree.set_leaves(tree, np.array([7, 3, 7, 7]), np.array([1.0, 2.0, 3.0, 5.0]), np.add)
    assert tree[0][7] == 5.0 and tree[0][3] == 2.0
    assert tree[-1].tolist() == [7.0, 0.0, 0.0]


def fractions_for(rng: np.random.Generator, leaves: np.ndarray, b: int, bounds: bool) -> np.ndarray:
    """Stratified draws, the extremes, and (``bounds``) the exact boundaries between leaves."""
    draws = [(np.arange(b) + rng.random(b)) / b, np.array([0.0, np.nextafter(1.0, 0.0), 1.0 - 1e-12])]
    cum = np.cumsum(leaves)[:-1]
    if bounds and cum.shape[0]:
        draws.append(rng.choice(cum, b) / leaves.sum())
    return np.concatenate(draws)


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("integer", [True, False])
def test_descent_matches_numpy(
    kernels: object, monkeypatch: pytest.MonkeyPatch, capacity: int, integer: bool
) -> None:
    rng = np.random.default_rng(capacity + integer)
    tree = sumtree.new_tree(capacity, np.add)
    for _ in range(3):
        filled = int(rng.integers(1, capacity + 1))  # a partly filled ring: zero leaves after it
        values = rng.integers(0, 50, filled).astype(np.float64) if integer else rng.random(filled) ** 3
        values[-1] = max(values[-1], 1.0)  # the newest item, last, positive
        values[rng.random(filled) < 0.2] = 0.0  # zeros among them are never drawn
        if not values.any():
            values[0] = 1.0
        sumtree.set_leaves(tree, np.arange(filled), values, np.add)
        # a boundary draw with float priorities is where the two paths' last bits may differ
        fractions = fractions_for(rng, tree[0], 256, bounds=integer)
        fast, total = sumtree.find_prefix_sum(tree, fractions)
        with monkeypatch.context() as m:
            numpy_path(m)
            slow, total_np = sumtree.find_prefix_sum(tree, fractions)
        assert total == total_np
        assert fast.dtype == slow.dtype == np.int64
        np.testing.assert_array_equal(fast, slow)
        assert (tree[0][fast] > 0).all()
        if integer:  # exact sums: the naive inverse CDF's leaf
            naive = np.searchsorted(np.cumsum(tree[0]), fractions * total, side="right")
            np.testing.assert_array_equal(fast, np.minimum(naive, np.flatnonzero(tree[0])[-1]))


@pytest.mark.parametrize("capacity", CAPACITIES)
def test_top_prefix_matches_torch_cumsum(
    kernels: object, monkeypatch: pytest.MonkeyPatch, capacity: int
) -> None:
    rng = np.random.default_rng(capacity)
    tree = sumtree.new_tree(capacity, np.add)
    tree[-1][:] = rng.random(tree[-1].shape[0]) * 10.0 ** rng.integers(-8, 9, tree[-1].shape[0])
    fast = sumtree.top_prefix(tree)
    with monkeypatch.context() as m:
        numpy_path(m)
        slow = sumtree.top_prefix(tree)
    np.testing.assert_array_equal(fast, slow)
    assert fast[0] == 0.0 and fast.shape == (tree[-1].shape[0] + 1,)


def test_descent_past_the_total_takes_last_positive_leaf(
    kernels: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a sum that rounds: u = fraction * total can reach a node's sum; the last positive leaf wins
    tree = sumtree.new_tree(100, np.add)
    values = np.zeros(100)
    values[[2, 40, 41]] = [0.1, 0.2, 0.3]
    sumtree.set_leaves(tree, np.arange(100), values, np.add)
    fractions = np.array([np.nextafter(1.0, 0.0), 0.0])
    fast, _ = sumtree.find_prefix_sum(tree, fractions)
    with monkeypatch.context() as m:
        numpy_path(m)
        slow, _ = sumtree.find_prefix_sum(tree, fractions)
    np.testing.assert_array_equal(fast, slow)
    assert fast.tolist() == [41, 2]


def test_switched_off_by_env_var_in_a_fresh_process() -> None:
    import os
    import subprocess
    import sys

    code = "from xpbank.sampler import sumtree_numba as m; print(m.ENABLED, m.load() is None)"
    env = {**os.environ, "XPBANK_NO_NUMBA": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.split() == ["False", "True"]
