"""The prioritized sampler's compiled kernels (``sumtree_numba.draw_fresh``, ``.update``,
``.live_slots``) against the NumPy path, on random inputs.

Trees, stored priorities and weights must be bit-identical; drawn slots too (integer
priorities make every partial sum exact; with float priorities the kernels' descent is
the one ``find_prefix_sum`` takes with numba, compared directly). The checks' fast path
must return what the NumPy checks return, and leave every error to them.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sumtree_paths import kernels_fixture, numpy_path, random_slots  # noqa: F401 (the kernels fixture)
from xpbank import PrioritizedSampler, PriorityError, ReplayBuffer, StaleIndexError, XpbankIndexError
from xpbank.ring.ids import Ring
from xpbank.sampler import priorities, sumtree, sumtree_numba
from xpbank.sampler.lazymin import LazyMin
from xpbank.sampler.priorities import check_update, importance_weights

CAPACITIES = [1, 17, 300, 4096 * 16 + 3, 1_100_000]


def random_tree(rng: np.random.Generator, capacity: int, integer: bool) -> sumtree.Tree:
    """A partly filled tree: zeros among the leaves, ties, the newest leaf positive."""
    tree = sumtree.new_tree(capacity, np.add)
    filled = int(rng.integers(1, capacity + 1))
    values = rng.integers(0, 4, filled).astype(np.float64) if integer else rng.random(filled) ** 3
    values[rng.random(filled) < 0.2] = 0.0
    values[-1] = max(values[-1], 1.0)
    tree[0][:filled] = values
    sumtree.rebuild(tree, np.add)
    return tree


def test_kernels_raise_no_power_of_their_own() -> None:
    # NumPy's array power is a vector routine on AVX-512 CPUs and the C library's pow
    # elsewhere (they differ in the last bit of ~1 value in 20), so a power compiled into
    # a kernel matched NumPy's on some CPUs only: every power goes through priorities.power
    import inspect

    for name in ("draw_fresh", "draw_body", "update", "descend", "set_leaves"):
        source = inspect.getsource(getattr(sumtree_numba, name))
        assert "**" not in source.split('"""')[-1] and "pow(" not in source, name
    x = np.random.default_rng(0).random(1000) * 10.0 ** np.random.default_rng(1).integers(-90, 90, 1000)
    np.testing.assert_array_equal(priorities.power(x, 0.6), x**0.6)  # the one routine: NumPy's


def test_search_right_all_is_searchsorted() -> None:
    rng = np.random.default_rng(1)
    for n in [1, 2, 3, 7, 16, 100, 4096]:
        cums = np.concatenate([[0.0], np.cumsum(rng.integers(0, 3, n).astype(np.float64))])  # ties
        points = np.concatenate([cums, cums + 0.5, [-1.0, cums[-1] + 1.0]])
        expected = np.searchsorted(cums[1:], points, side="right")
        out = np.full(points.shape, -7, dtype=np.int64)
        sumtree_numba.search_right_all(cums, n, points, out)  # the batch in lockstep: each its own
        np.testing.assert_array_equal(out, expected)
    out = np.full(2, -7, dtype=np.int64)
    sumtree_numba.search_right_all(np.zeros(1), 0, np.array([1.0, -1.0]), out)
    assert out.tolist() == [0, 0]


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("normalize", [True, False])
def test_draw_matches_descent_and_weights(
    kernels: object, monkeypatch: pytest.MonkeyPatch, capacity: int, integer: bool, normalize: bool
) -> None:
    rng = np.random.default_rng(capacity * 4 + 2 * integer + normalize)
    for beta in [0.0, 0.4, 1.0]:
        tree = random_tree(rng, capacity, integer)
        cums = sumtree.top_prefix(tree)
        b = int(rng.integers(1, 300))
        draws = rng.random(b)
        draws[:2] = [0.0, np.nextafter(1.0, 0.0)]  # the extremes of the first two segments
        fractions = (np.arange(b) + draws) / b
        want, total = sumtree.find_prefix_sum(tree, fractions, cums)  # the compiled descent
        if integer:  # exact sums: the NumPy path's (and the naive inverse CDF's) leaf
            with monkeypatch.context() as m:
                numpy_path(m)
                np.testing.assert_array_equal(sumtree.find_prefix_sum(tree, fractions, cums)[0], want)
        n = int((tree[0] > 0).sum())
        smallest = float(tree[0][tree[0] > 0].min())
        scale, divisor = (1.0, smallest) if normalize else (float(n), total)
        slots, ratios, ids = np.empty(b, dtype=np.int64), np.empty(b), np.empty(b, dtype=np.int64)
        args = (slots, ratios, ids, 0, capacity)
        kernels.draw_fresh(tuple(tree), cums, False, draws, scale, divisor, *args)  # type: ignore[attr-defined]
        weights = priorities.power(ratios, -beta).astype(np.float32)  # as PrioritizedSampler does
        np.testing.assert_array_equal(slots, want)
        assert (tree[0][slots] > 0).all()
        ref = importance_weights(tree[0][slots], total, smallest, n, beta, normalize).astype(np.float32)
        np.testing.assert_array_equal(weights, ref)


@pytest.mark.parametrize("capacity", CAPACITIES)
@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.6, 1.0, 2.0])
def test_update_matches_numpy(kernels: object, capacity: int, alpha: float) -> None:
    rng = np.random.default_rng(capacity + int(alpha * 10))
    eps = 1e-6
    a = random_tree(rng, capacity, integer=False)
    b = [level.copy() for level in a]
    for step in range(8):
        n = int(rng.integers(0, 300))
        slots = random_slots(rng, capacity, n, newest=step % 3 == 0, repeat=step % 2 == 1)
        prio = rng.exponential(size=slots.shape[0]) * 10.0 ** rng.integers(-3, 4, slots.shape[0])
        prio[rng.random(prio.shape[0]) < 0.1] = 0.0
        positive = b[0][b[0] > 0]
        smallest = float(positive.min()) if positive.size else math.inf
        if step == 4 and slots.size:
            b[0][slots[0]] = a[0][slots[0]] = smallest = 0.125  # a leaf holding the minimum
            sumtree.rebuild(a, np.add)
            sumtree.rebuild(b, np.add)
        old = b[0][slots].copy()
        p = prio + eps
        largest, low, hit = kernels.update(tuple(a), slots, p, priorities.power(p, alpha), smallest)  # type: ignore[attr-defined]
        with pytest.MonkeyPatch.context() as m:  # the NumPy path: set_leaves of (p + eps) ** alpha
            numpy_path(m)
            sumtree.set_leaves(b, slots, (prio + eps) ** alpha, np.add)
        for x, y in zip(a, b, strict=True):
            np.testing.assert_array_equal(x, y)
        new = b[0][slots]
        assert largest == (float((prio + eps).max()) if slots.size else -math.inf)
        assert low == (float(new[new > 0].min()) if (new > 0).any() else math.inf)
        assert hit == bool((old == smallest).any())


def test_update_float32_priorities_are_widened_first() -> None:
    sampler = PrioritizedSampler(alpha=0.6, eps=1e-6)
    buffer = ReplayBuffer(50, sampler=sampler)
    buffer.extend({"obs": torch.zeros(5, 2)})
    prio = np.array([0.1, 3.3, 7.7], dtype=np.float32)
    buffer.update_priority(torch.tensor([1, 2, 3]), torch.from_numpy(prio))
    np.testing.assert_array_equal(sampler.priority([1, 2, 3]), (prio.astype(np.float64) + 1e-6) ** 0.6)


def test_lazymin_noted_is_changed() -> None:
    # what the update kernel returns, given to noted(), keeps the minimum as changed() does
    rng = np.random.default_rng(3)
    leaves = np.zeros(500)
    a, b = LazyMin(leaves), LazyMin(leaves)
    for _ in range(200):
        slots = rng.integers(0, 500, int(rng.integers(1, 20)))
        old = leaves[slots].copy()
        leaves[slots] = np.where(rng.random(slots.shape[0]) < 0.2, 0.0, rng.integers(1, 9, slots.shape[0]))
        new = leaves[slots]
        low = float(new[new > 0].min()) if (new > 0).any() else math.inf
        a.changed(slots, old, new)
        b.noted(slots, low, bool((old == b.kept).any()))
        assert a.value == b.value == (float(leaves[leaves > 0].min()) if leaves.any() else math.inf)


def ring_at(capacity: int, next_id: int) -> Ring:
    return Ring(capacity, next_id, min(next_id, capacity))


def both_checks(monkeypatch: pytest.MonkeyPatch, ring: Ring, ids: object, prio: object, stale: str) -> list:
    """check_update's result or error, fast path first, then the NumPy checks alone."""
    out = []
    for numpy_only in (False, True):
        with monkeypatch.context() as m:
            if numpy_only:
                numpy_path(m)
            try:
                out.append(check_update(ring, ids, prio, stale))
            except (PriorityError, XpbankIndexError, StaleIndexError) as exc:
                out.append(f"{type(exc).__name__}: {exc}")
    return out


@pytest.mark.parametrize("wrap", [False, True])
def test_fast_check_returns_what_numpy_checks_return(
    kernels: object, monkeypatch: pytest.MonkeyPatch, wrap: bool
) -> None:
    rng = np.random.default_rng(wrap)
    capacity = 100
    ring = ring_at(capacity, 250 if wrap else 60)
    for trial in range(300):
        b = int(rng.integers(0, 40))
        ids = rng.integers(ring.first_id, ring.next_id, b)
        prio = rng.exponential(size=b)
        kind = trial % 10
        if b and kind == 1:
            ids[rng.integers(b)] = ring.first_id - 1 if wrap else ring.next_id  # stale or never issued
        elif b and kind == 2:
            ids[rng.integers(b)] = ring.next_id + 5  # never issued
        elif b and kind == 3:
            prio[rng.integers(b)] = [np.nan, np.inf, -1e-9][trial % 3]
        elif kind == 4:
            prio = prio.astype(np.float32)
        elif kind == 5:
            ids, prio = torch.from_numpy(ids), torch.from_numpy(prio)
        elif kind == 6:
            prio = prio[: max(0, b - 1)]  # not one per id
        elif kind == 7:
            ids = ids.astype(np.int32)  # not int64: the NumPy path converts it
        fast, slow = both_checks(monkeypatch, ring, ids, prio, "skip" if trial % 2 else "raise")
        if isinstance(slow, str):
            assert fast == slow
        else:
            for x, y in zip(fast, slow, strict=True):
                assert x.dtype == y.dtype and x.dtype in (np.int64, np.float64)
                np.testing.assert_array_equal(x, y)


def test_fast_check_errors_are_the_numpy_ones(kernels: object) -> None:
    ring = ring_at(10, 25)
    with pytest.raises(StaleIndexError, match=r"item 14 has been overwritten .* nothing was updated"):
        check_update(ring, np.array([20, 14]), np.array([1.0, 2.0]), "raise")
    with pytest.raises(XpbankIndexError, match=r"item 25 was never issued"):
        check_update(ring, torch.tensor([20, 25]), torch.tensor([1.0, 2.0]), "skip")
    with pytest.raises(PriorityError, match=r"got nan at position 1; nothing was updated"):
        check_update(ring, np.array([20, 21]), np.array([1.0, np.nan], dtype=np.float32), "raise")
    with pytest.raises(PriorityError, match=r"stale: expected 'raise' or 'skip', got 'drop'"):
        check_update(ring, np.array([20]), np.array([1.0]), "drop")
    slots, values = check_update(ring, np.array([14, 20]), np.array([1.0, 2.0]), "skip")
    assert slots.tolist() == [0] and values.tolist() == [2.0]


def test_fast_check_leaves_other_inputs_to_numpy(kernels: object, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = sumtree_numba.load()
    monkeypatch.setattr(
        sumtree_numba, "_loaded", type(real)(**{**vars(real), "live_slots": lambda *a: calls.append(a)})
    )
    ring = ring_at(10, 25)
    needs_grad = torch.tensor([1.0], requires_grad=True)
    for ids, prio in [([20], [1.0]), (np.array([20]), needs_grad), (np.array([20]), np.array([[1.0]]))]:
        slots, values = check_update(ring, ids, prio, "raise")
        assert slots.tolist() == [0] and values.tolist() == [1.0]
    assert calls == []  # lists, tensors that need grad, [B, 1] priorities: the NumPy checks
    assert priorities._all_live(ring, np.array([20]), np.array([1.0]), "raise") is None  # the kernel said no


@pytest.mark.parametrize("normalize", [True, False])
def test_buffer_same_batches_and_trees_with_and_without_kernels(
    kernels: object, monkeypatch: pytest.MonkeyPatch, normalize: bool
) -> None:
    # integer priorities, alpha 1, eps 0: exact sums, so both paths draw the same leaves
    def make() -> ReplayBuffer:
        sampler = PrioritizedSampler(alpha=1.0, beta=0.4, eps=0.0, normalize_weights=normalize)
        return ReplayBuffer(97, sampler=sampler, seed=5)

    fast, slow = make(), make()
    rng = np.random.default_rng(normalize)

    def on_numpy(fn: object, *args: object) -> object:
        with monkeypatch.context() as m:
            numpy_path(m)
            return fn(*args)  # type: ignore[operator]

    for step in range(60):
        n = int(rng.integers(1, 40))  # wraps the ring of 97 many times
        rows = {"obs": torch.full((n, 2), float(step))}
        fast.extend(rows)
        on_numpy(slow.extend, rows)
        a, b = fast.sample(64), on_numpy(slow.sample, 64)
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])  # type: ignore[index]
        prio = torch.from_numpy(rng.integers(0, 9, 64).astype(np.float64))
        ids = a["index"].clone()
        ids[:3] = max(0, int(ids.max()) - 200)  # some stale by now, skipped
        fast.update_priority(ids, prio, stale="skip")
        on_numpy(slow.update_priority, ids, prio, "skip")
        for x, y in zip(fast.sampler._sum, slow.sampler._sum, strict=True):  # type: ignore[attr-defined]
            np.testing.assert_array_equal(x, y)
        assert fast.sampler.max_priority == slow.sampler.max_priority  # type: ignore[attr-defined]
        assert fast.sampler.totals() == slow.sampler.totals()  # type: ignore[attr-defined]
