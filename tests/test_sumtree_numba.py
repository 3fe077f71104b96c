"""The sum-tree's compiled kernels (numba) against its NumPy path, on random inputs.

Trees must be bit-identical (both add 16 children pairwise in the same order). Descents
must pick the same leaves, on every CPU, for every draw, boundaries included: both sum a
node's children in order (no BLAS, whose order varies by CPU). Every leaf drawn is
positive and is, within rounding, the exact inverse CDF's (a brute-force reference in
exact rational arithmetic).
"""

from __future__ import annotations

import bisect
from fractions import Fraction

import numpy as np
import pytest
import torch

from sumtree_paths import kernels_fixture, numpy_path, random_slots  # noqa: F401 (the kernels fixture)
from xpbank.sampler import sumtree, sumtree_torch

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
        fractions = fractions_for(rng, tree[0], 256, bounds=True)
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


def exact_cums(leaves: np.ndarray) -> list[Fraction]:
    """``cums[i] = sum(leaves[:i])`` in exact rational arithmetic."""
    cums = [Fraction(0)]
    for v in leaves.tolist():
        cums.append(cums[-1] + Fraction(v))
    return cums


def check_against_exact(leaves: np.ndarray, fractions: np.ndarray, total: float, got: np.ndarray) -> None:
    """Brute force: the exact inverse CDF's leaf for ``u = fraction * total`` is ``i`` with
    ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])`` (the last positive leaf past the end).
    A float64 descent must return it, or, where ``u`` lies within rounding (1e-12 of the
    total) of a boundary, a positive leaf whose exact interval is that close to ``u``."""
    cums = exact_cums(leaves)
    last = int(np.flatnonzero(leaves)[-1])
    tol = Fraction(total) * Fraction(1, 10**12)
    for f, g in zip(fractions.tolist(), got.tolist(), strict=True):
        u = Fraction(f) * Fraction(total)
        want = min(bisect.bisect_right(cums, u) - 1, last)
        assert leaves[g] > 0, f"fraction {f!r}: leaf {g} is empty"
        if g != want:
            distance = max(cums[g] - u, u - cums[g + 1], Fraction(0))
            assert distance <= tol, f"fraction {f!r}: leaf {g}, the exact leaf is {want}"


def boundary_fractions(leaves: np.ndarray) -> np.ndarray:
    """Every boundary between leaves as a fraction of the total, the two floats either side
    of it, and the extremes 0 and 1 - 2**-53."""
    cum = np.cumsum(leaves)
    at = cum[:-1] / cum[-1]
    near = [at, np.nextafter(at, 0.0), np.nextafter(at, 1.0), [0.0, np.nextafter(1.0, 0.0)]]
    return np.clip(np.concatenate(near), 0.0, np.nextafter(1.0, 0.0))


def boundary_trees() -> list[np.ndarray]:
    """Leaf values: the reported case (16 slots, 10 filled, zeros after: a draw of
    1 - 2**-53 once took the empty leaf 14), zeros among positive leaves, ties, tiny and
    huge values side by side, and larger random trees (two and three levels)."""
    rng = np.random.default_rng(7)
    trees = []
    reported = np.zeros(16)
    reported[:10] = rng.random(10) ** 3
    trees.append(reported)
    mixed = np.zeros(300)
    mixed[:250] = rng.random(250) * 10.0 ** rng.integers(-8, 8, 250)
    mixed[rng.random(300) < 0.3] = 0.0
    mixed[249] = 1.0
    trees.append(mixed)
    trees.append(np.array([0.1, 0.2, 0.0, 0.3, 0.0, 0.0, 1e-300, 0.7] * 3 + [0.0] * 9))
    for n in (5000, 70_000):
        values = rng.exponential(1.0, n)
        values[rng.random(n) < 0.2] = 0.0
        trees.append(values)
    return trees


@pytest.mark.parametrize("case", range(5))
def test_descent_at_and_beside_every_boundary(
    kernels: object, monkeypatch: pytest.MonkeyPatch, case: int
) -> None:
    values = boundary_trees()[case]
    tree = sumtree.new_tree(values.shape[0], np.add)
    sumtree.set_leaves(tree, np.arange(values.shape[0]), values, np.add)
    fractions = boundary_fractions(tree[0])
    if fractions.shape[0] > 3000:  # the big trees: a seeded sample of their boundaries
        fractions = np.random.default_rng(case).choice(fractions, 3000, replace=False)
    fast, total = sumtree.find_prefix_sum(tree, fractions)
    with monkeypatch.context() as m:
        numpy_path(m)
        slow, _ = sumtree.find_prefix_sum(tree, fractions)
    on_torch, _ = sumtree_torch.find_prefix_sum(
        [torch.from_numpy(level) for level in tree], torch.from_numpy(fractions)
    )
    np.testing.assert_array_equal(fast, slow)  # the same sums in the same order
    np.testing.assert_array_equal(on_torch.numpy(), slow)  # torch's CPU cumsum is sequential too
    # the same draws in batches of other sizes (a BLAS product's order changed with the
    # batch size: one row alone and 259 rows summed a node's children differently)
    with monkeypatch.context() as m:
        numpy_path(m)
        for size in (1, 2, 7, 17, 259):
            parts = [fractions[i : i + size] for i in range(0, min(fractions.shape[0], 40 * size), size)]
            alone = np.concatenate([sumtree.find_prefix_sum(tree, part)[0] for part in parts])
            np.testing.assert_array_equal(alone, slow[: alone.shape[0]], err_msg=f"batches of {size}")
    assert (tree[0][fast] > 0).all(), "a draw landed on an empty slot"
    check_against_exact(tree[0], fractions, total, fast)


def test_reported_empty_slot_draw(monkeypatch: pytest.MonkeyPatch) -> None:
    # the reported case: 16 slots, 10 filled; in a batch of 259 draws the NumPy descent's
    # matrix-product sums put a draw of 1 - 2**-53 on leaf 14, which holds nothing
    leaves = [0.06441705680170243, 5.557782079241292e-05, 0.5347108011703278, 0.0810852343503354,
              0.3289453658714343, 0.6723389507286656, 0.6209769664772822, 0.7088171348558289,
              0.17545955450596823, 1.0]  # fmt: skip
    tree = sumtree.new_tree(16, np.add)
    sumtree.set_leaves(tree, np.arange(10), np.array(leaves), np.add)
    draws = np.random.default_rng(0).random(256)
    fractions = np.concatenate([(np.arange(256) + draws) / 256, [0.0, np.nextafter(1.0, 0.0), 1.0 - 1e-12]])
    for path in ("compiled", "numpy"):
        with monkeypatch.context() as m:
            if path == "numpy":
                numpy_path(m)
            slots, total = sumtree.find_prefix_sum(tree, fractions)
        assert (tree[0][slots] > 0).all(), path
        assert slots[-2] == 9, path  # the last positive leaf
        check_against_exact(tree[0], fractions, total, slots)


def test_torch_descent_never_takes_a_zero_leaf_whatever_the_scan_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a parallel scan (CUDA) may sum each position in its own order: a later sum may round
    # below an earlier one, or step up at a zero child. Emulate the worst case on the CPU:
    # every position's sum nudged by an ulp either way
    rng = np.random.default_rng(11)
    real_cumsum = torch.cumsum

    def jittered(x: torch.Tensor, dim: int, **kw: object) -> torch.Tensor:
        out = real_cumsum(x, dim, **kw)  # type: ignore[arg-type]
        if x.dim() != 2:
            return out
        step = torch.from_numpy(rng.integers(-1, 2, tuple(out.shape)).astype(np.float64))
        up, down = torch.nextafter(out, out + 1), torch.nextafter(out, out - 1)
        return torch.where(step > 0, up, torch.where(step < 0, down, out))

    values = boundary_trees()[2]
    tree = [torch.from_numpy(level) for level in sumtree.new_tree(values.shape[0], np.add)]
    sumtree_torch.set_leaves(tree, torch.arange(values.shape[0]), torch.from_numpy(values), "sum")
    fractions = torch.from_numpy(boundary_fractions(tree[0].numpy()))
    monkeypatch.setattr(torch, "cumsum", jittered)
    for _ in range(20):
        slots, _ = sumtree_torch.find_prefix_sum(tree, fractions)
        assert (tree[0][slots] > 0).all()


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
