"""The torch backend of prioritized replay (sumtree_torch.py, prioritized_torch.py)
against the NumPy trees, exact weight formulas, errors, state across backends and a
frequency test. Every test runs on CPU tensors (the torch backend forced) and, marked
``cuda``, on a CUDA device where there is one."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from sumtree_paths import random_slots, sumtree_path  # noqa: F401 (autouse: both NumPy paths)
from xpbank import PrioritizedSampler, PriorityError, ReplayBuffer, StaleIndexError, XpbankIndexError
from xpbank.sampler import make_sampler, sampler_config, sumtree
from xpbank.sampler import sumtree_torch as st

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")],
    ),
]


@pytest.fixture(params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def items(n: int) -> dict:
    return {"obs": torch.arange(n, dtype=torch.float32)}


def positive(values: np.ndarray) -> np.ndarray:
    return np.where(values > 0, values, np.inf)


def assert_same_levels(torch_tree: st.Tree, numpy_tree: sumtree.Tree) -> None:
    """Level by level, bit for bit: a parent is its 16 children added (or min-ed) pairwise
    in the same order in both, and float64 additions are correctly rounded everywhere."""
    assert [t.shape[0] for t in torch_tree] == [a.shape[0] for a in numpy_tree]
    for level, (t, a) in enumerate(zip(torch_tree, numpy_tree, strict=True)):
        np.testing.assert_array_equal(t.cpu().numpy(), a, err_msg=f"level {level}")


@pytest.mark.parametrize("capacity", [5, 1000, 70_000])  # 2, 2 and 3 levels
def test_trees_match_numpy_after_random_writes(device: str, capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    ts, tm = st.new_tree(capacity, "sum", device), st.new_tree(capacity, "min", device)
    ns, nm = sumtree.new_tree(capacity, np.add), sumtree.new_tree(capacity, np.minimum)
    cursor = 0
    for step in range(40):
        kind = step % 4
        if kind == 0:  # new items, split at the wrap as the ring does
            n, value = int(rng.integers(1, capacity + 1)), float(rng.uniform(0.5, 2.0))
            first = min(n, capacity - cursor)
            for start, stop in [(cursor, cursor + first), (0, n - first)]:
                st.set_range(ts, start, stop, value, "sum")
                st.set_range(tm, start, stop, value, "min")
                sumtree.set_range(ns, start, stop, value, np.add)
                sumtree.set_range(nm, start, stop, value, np.minimum)
            cursor = (cursor + n) % capacity
        elif kind in (1, 2):  # updates, repeated slots (the last wins), some zeros
            slots = random_slots(rng, capacity, 64, newest=kind == 2, repeat=True)
            values = rng.exponential(1.0, slots.shape[0]) * (rng.random(slots.shape[0]) > 0.1)
            s, v = torch.from_numpy(slots).to(device), torch.from_numpy(values).to(device)
            st.set_leaves(ts, s, v, "sum")
            st.set_leaves(tm, s, st.positive(v), "min")
            sumtree.set_leaves(ns, slots, values, np.add)
            sumtree.set_leaves(nm, slots, positive(values), np.minimum)
        elif step % 16 == 15:  # clear
            ts, tm = st.new_tree(capacity, "sum", device), st.new_tree(capacity, "min", device)
            ns, nm = sumtree.new_tree(capacity, np.add), sumtree.new_tree(capacity, np.minimum)
            cursor = 0
        assert_same_levels(ts, ns)
        assert_same_levels(tm, nm)
        leaves = ts[0].cpu().numpy()
        # the root sums the leaves in another order (pairwise by groups): equal within rounding
        assert float(st.total(ts)) == pytest.approx(leaves.sum(), rel=1e-12, abs=0)
        assert float(st.total(tm, "min")) == positive(leaves).min()
    rebuilt = [level.clone() for level in ts]
    st.rebuild(rebuilt, "sum")
    assert all(torch.equal(a, b) for a, b in zip(rebuilt, ts, strict=True))


def test_last_of_each_keeps_the_last_write(device: str) -> None:
    slots = torch.tensor([7, 3, 7, 1, 3, 7], device=device)
    unique, where = st.last_of_each(slots)
    assert unique.tolist() == [1, 3, 7] and where.tolist() == [3, 4, 5]


def _filled_pair(device: str, capacity: int, integers: bool, seed: int) -> tuple[st.Tree, sumtree.Tree]:
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 5, capacity).astype(np.float64) if integers else rng.exponential(1.0, capacity)
    values[rng.random(capacity) < 0.2] = 0.0
    slots = np.arange(capacity)
    ts, ns = st.new_tree(capacity, "sum", device), sumtree.new_tree(capacity, np.add)
    st.set_leaves(ts, torch.from_numpy(slots).to(device), torch.from_numpy(values).to(device), "sum")
    sumtree.set_leaves(ns, slots, values, np.add)
    return ts, ns


@pytest.mark.parametrize("capacity", [1000, 70_000])
def test_descent_matches_numpy_on_integer_priorities(device: str, capacity: int) -> None:
    """Integer priorities: every partial sum is exact, so both descents give the same leaf."""
    ts, ns = _filled_pair(device, capacity, integers=True, seed=1)
    fractions = np.random.default_rng(2).random(4096)
    expected, total = sumtree.find_prefix_sum(ns, fractions)
    slots, tot = st.find_prefix_sum(ts, torch.from_numpy(fractions).to(device))
    assert float(tot) == total
    np.testing.assert_array_equal(slots.cpu().numpy(), expected)


@pytest.mark.parametrize("capacity", [1000, 70_000])
def test_descent_matches_numpy_away_from_boundaries(device: str, capacity: int) -> None:
    """Real priorities: both descents sum a node's children in order (NumPy's cumulative
    sum, torch.cumsum), so on the CPU they agree on every draw. A CUDA scan may add in
    another order, so there a draw within rounding of a boundary between two leaves may
    go either way: draws within 1e-9 of the total from a boundary are left out of the
    comparison. Every leaf drawn is positive."""
    ts, ns = _filled_pair(device, capacity, integers=False, seed=3)
    fractions = np.random.default_rng(4).random(4096)
    expected, total = sumtree.find_prefix_sum(ns, fractions)
    slots, tot = st.find_prefix_sum(ts, torch.from_numpy(fractions).to(device))
    leaves = ns[0][:capacity]
    got = slots.cpu().numpy()
    assert (leaves[got] > 0).all()
    if device == "cpu":
        np.testing.assert_array_equal(got, expected)
    bounds = np.concatenate([[0.0], np.cumsum(leaves)])
    u = fractions * total
    at = np.clip(np.searchsorted(bounds, u), 1, capacity)  # the boundaries either side of u
    gap = np.minimum(np.abs(bounds[at] - u), np.abs(u - bounds[at - 1]))
    far = gap > 1e-9 * total
    assert far.mean() > 0.99
    np.testing.assert_array_equal(got[far], expected[far])
    assert float(tot) == pytest.approx(total, rel=1e-12)


def _buffer(tree_device: str | None, seed: int = 0, **kwargs: object) -> ReplayBuffer:
    sampler = PrioritizedSampler(alpha=0.7, beta=0.5, eps=1e-3, tree_device=tree_device, **kwargs)  # type: ignore[arg-type]
    rb = ReplayBuffer(300, sampler=sampler, seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(4):  # wraps: 400 items into 300 slots
        ids = rb.extend(items(100))
        rb.update_priority(list(ids)[::2], rng.exponential(1.0, 50))
    rb.update_priority(rb.sample(64)["index"], rng.exponential(1.0, 64))
    return rb


@pytest.mark.parametrize("normalize", [True, False])
def test_weights_exactly_as_brute_force_from_priorities(device: str, normalize: bool) -> None:
    rb = _buffer(device, normalize_weights=normalize)
    batch = rb.sample(128)
    assert batch["weight"].dtype == torch.float32
    every = torch.from_numpy(rb.sampler.priority(np.arange(300)))
    stored = every[batch["index"].cpu() % 300]
    beta = 0.5
    if normalize:
        expected = (stored / every[every > 0].min()) ** -beta
    else:
        expected = (300 * stored / every.sum()) ** -beta
    # torch's pow on both sides; the total differs from the tree's by summation order only
    torch.testing.assert_close(batch["weight"].cpu(), expected.float(), rtol=0 if normalize else 1e-6, atol=0)


def test_torch_and_numpy_backends_sample_the_same(device: str) -> None:
    a, b = _buffer(None), _buffer(device)
    assert b.sampler._trees is not None and a.sampler._trees is None
    for _ in range(3):
        x, y = a.sample(64), b.sample(64)
        assert torch.equal(x["index"], y["index"].cpu())
        torch.testing.assert_close(x["weight"], y["weight"].cpu(), rtol=1e-6, atol=0)
    assert b.sampler.totals() == pytest.approx(a.sampler.totals(), rel=1e-12)


@pytest.mark.parametrize(
    ("ids", "prio", "error", "match"),
    [
        ([301, 302], [1.0, float("nan")], PriorityError, r"got nan at position 1"),
        ([301, 302], [1.0, -1.0], PriorityError, r"got -1.0 at position 1"),
        ([301, 302], [1.0], PriorityError, r"expected one per index \(2\)"),
        ([0, 301], [1.0, 1.0], StaleIndexError, r"item 0 has been overwritten"),
        ([301, 999], [1.0, 1.0], XpbankIndexError, r"item 999 was never issued"),
    ],
)
def test_bad_updates_write_nothing(device: str, ids: list, prio: list, error: type, match: str) -> None:
    rb = _buffer(device)
    before = rb.sampler.state_dict()
    with pytest.raises(error, match=match):
        rb.update_priority(ids, prio)
    after = rb.sampler.state_dict()
    assert torch.equal(before["priorities"], after["priorities"])
    assert before["max_priority"] == after["max_priority"]


def test_state_round_trips_across_backends(device: str) -> None:
    numpy_rb = _buffer(None, seed=5)
    sampler = PrioritizedSampler(alpha=0.7, beta=0.5, eps=1e-3, tree_device=device)
    torch_rb = ReplayBuffer(300, sampler=sampler)
    torch_rb.load_state_dict(numpy_rb.state_dict())
    assert_same_levels(torch_rb.sampler._trees.sum, numpy_rb.sampler._sum)
    for _ in range(2):
        x, y = numpy_rb.sample(32), torch_rb.sample(32)
        assert torch.equal(x["index"], y["index"].cpu())
    state = torch_rb.state_dict()
    assert state["sampler"]["priorities"].device.type == "cpu"
    back = ReplayBuffer(300, sampler=PrioritizedSampler(alpha=0.7, beta=0.5, eps=1e-3))
    back.load_state_dict(state)
    assert_same_levels(torch_rb.sampler._trees.sum, back.sampler._sum)
    np.testing.assert_array_equal(back.sampler._min[0], torch_rb.sampler._trees.min[0].cpu().numpy())
    assert torch.equal(back.sample(32)["index"], torch_rb.sample(32)["index"].cpu())


def test_clear_and_wrap_draw_only_live_items(device: str) -> None:
    rb = ReplayBuffer(8, sampler=PrioritizedSampler(tree_device=device), seed=0)
    rb.extend(items(13))
    assert set(rb.sample(200)["index"].tolist()) <= set(range(5, 13))
    rb.clear()
    rb.extend(items(3))
    assert set(rb.sample(100)["index"].tolist()) == {16, 17, 18}
    rb.update_priority([16, 17, 18], [0.0, 0.0, 0.0])
    rb.sampler.eps = 0.0
    rb.update_priority([16, 17, 18], [0.0, 0.0, 0.0])
    with pytest.raises(PriorityError, match=r"every stored priority is 0"):
        rb.sample(2)


CHI2_9DF_P001 = 27.877  # chi-square critical value at p = 0.001, 9 degrees of freedom


def test_sampling_frequencies_chi_square(device: str) -> None:
    """As tests/test_prioritized.py: priorities 1..10 (alpha 1), 12,800 draws; the
    statistic against P(i) = i / 55 stays below the p = 0.001 critical value (a false
    alarm 1 run in 1,000 for i.i.d. draws; stratified draws vary less) and a uniform P
    fails it by far."""
    rb = ReplayBuffer(10, sampler=PrioritizedSampler(alpha=1.0, eps=0.0, tree_device=device), seed=1234)
    rb.extend(items(10))
    rb.update_priority(range(10), np.arange(1.0, 11.0))
    counts = np.zeros(10)
    for _ in range(200):
        np.add.at(counts, rb.sample(64)["index"].cpu().numpy(), 1)
    expected = np.arange(1, 11) / 55 * counts.sum()
    assert ((counts - expected) ** 2 / expected).sum() < CHI2_9DF_P001
    uniform = np.full(10, counts.sum() / 10)
    assert ((counts - uniform) ** 2 / uniform).sum() > 100 * CHI2_9DF_P001


def test_tree_device_config_and_binding() -> None:
    sampler = PrioritizedSampler(tree_device=torch.device("cpu"))
    description = sampler_config(sampler)
    assert description["config"]["tree_device"] == "cpu"
    assert make_sampler(json.loads(json.dumps(description))).tree_device == "cpu"
    assert PrioritizedSampler(tree_device="numpy").config()["tree_device"] == "numpy"
    with pytest.raises(PriorityError, match=r"tree_device: expected None, 'numpy' or a torch device"):
        PrioritizedSampler(tree_device="gpu0")
    follow = PrioritizedSampler()
    rb = ReplayBuffer(10, sampler=follow, seed=0)
    rb.extend(items(4))
    assert follow._trees is None  # CPU storage: NumPy trees
    rb.update_priority([1], [3.0])
    before = follow.priority(np.arange(4))
    follow.tree_device = "cpu"  # stands in for a CUDA storage: the next bind moves built trees
    follow.bind_device("cpu")
    assert follow._trees is not None
    np.testing.assert_array_equal(follow.priority(np.arange(4)), before)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_storage_keeps_numpy_trees_unless_told() -> None:
    host = ReplayBuffer(100, storing_device="cuda", sampler=PrioritizedSampler(), seed=0)
    host.extend(items(50))
    batch = host.sample(16)
    assert host.sampler._trees is None  # the compiled NumPy trees (see bench_cuda.py)
    assert batch["index"].device.type == "cuda" and batch["weight"].device.type == "cuda"
    host.update_priority(batch["index"], torch.rand(16, device="cuda"))
    rb = ReplayBuffer(100, storing_device="cuda", sampler=PrioritizedSampler(tree_device="cuda"), seed=0)
    rb.extend(items(50))
    batch = rb.sample(16)
    assert rb.sampler._trees is not None and rb.sampler._trees.sum[0].device.type == "cuda"
    assert batch["index"].device.type == "cuda" and batch["weight"].device.type == "cuda"
    rb.update_priority(batch["index"], torch.rand(16, device="cuda"))
    assert rb.sampler.state_dict()["priorities"].device.type == "cpu"
    follow = PrioritizedSampler()
    cpu = ReplayBuffer(100, sampler=follow, seed=0)
    cpu.extend(items(50))
    before = follow.priority(np.arange(50))
    follow.tree_device = "cuda"
    follow.bind_device("cuda")  # built trees move to the backend asked for
    assert follow._trees is not None and follow._trees.device.type == "cuda"
    np.testing.assert_array_equal(follow.priority(np.arange(50)), before)
