"""The prioritized small calls' kernels at addresses (``sampler/prioritized_calls.py``)
against the array kernels of ``sumtree_numba`` (the same slots, ratios, ids, trees), the
min-tree they keep up to date against one rebuilt from the leaves, and the buffer's
tensor update path (``prioritized_fast._update_tensors``): what it takes, what it leaves
to the other paths, and the errors it leaves to the general path.
"""

from __future__ import annotations

import copy
import math
import pickle

import numpy as np
import pytest
import torch

from sumtree_paths import kernels_fixture  # noqa: F401 (the kernels fixture)
from xpbank import PrioritizedSampler, PriorityError, ReplayBuffer, StaleIndexError, XpbankIndexError
from xpbank.replay import writing
from xpbank.sampler import prioritized_calls, prioritized_fast, sumtree
from xpbank.sampler.lazymin import LazyMin
from xpbank.sampler.priorities import power, power_into
from xpbank.sampler.prioritized_calls import TreeCalls


@pytest.fixture(name="calls")
def calls_fixture(kernels: object) -> object:
    loaded = prioritized_calls.load()
    if loaded is None:
        pytest.skip("the compiled small calls did not compile")
    return loaded


def random_tree(rng: np.random.Generator, capacity: int) -> list[np.ndarray]:
    tree = sumtree.new_tree(capacity, np.add)
    leaves = rng.random(capacity) ** 3
    leaves[rng.random(capacity) < 0.1] = 0.0  # leaves that cannot be drawn
    leaves[0] = 0.5
    tree[0][:capacity] = leaves
    sumtree.rebuild(tree, np.add)
    return tree


def rebuilt_min(leaves: np.ndarray) -> list[np.ndarray]:
    tree = sumtree.new_tree(leaves.shape[0], np.minimum)
    tree[0][:] = np.where(leaves > 0, leaves, np.inf)
    sumtree.rebuild(tree, np.minimum)
    return tree


@pytest.mark.parametrize("capacity", [1, 17, 300, 70_000])
def test_draw_is_draw_fresh(kernels: object, calls: object, capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = random_tree(rng, capacity)
    tc = TreeCalls(tuple(tree), LazyMin(tree[0]))
    for fresh in (True, False):
        b = int(rng.integers(1, 64))
        draws = torch.rand(b, dtype=torch.float64, generator=torch.Generator().manual_seed(b))
        first = int(rng.integers(0, 5 * capacity))
        want_cums = kernels.prefix(tree[-1])  # type: ignore[attr-defined]
        want = (np.empty(b, dtype=np.int64), np.empty(b), np.empty(b, dtype=np.int64), first, capacity)
        kernels.draw_fresh(tuple(tree), want_cums, False, draws.numpy(), 1.0, 0.01, *want)  # type: ignore[attr-defined]
        tc.cums[:] = np.nan if fresh else want_cums
        rows, ids, ratios = (
            torch.empty(b, dtype=torch.int64),
            torch.empty(b, dtype=torch.int64),
            torch.empty(b, dtype=torch.float64),
        )
        records = np.zeros((capacity, 3), dtype=np.uint8)  # only prefetched
        tc.draw(
            tc.address, draws.data_ptr(), ratios.data_ptr(), rows.data_ptr(), ids.data_ptr(), b,
            fresh, 1.0, 0.01, first, capacity, records.ctypes.data, 3,
        )  # fmt: skip
        np.testing.assert_array_equal(tc.cums, want_cums)
        np.testing.assert_array_equal(rows.numpy(), want[0])
        np.testing.assert_array_equal(ratios.numpy(), want[1])
        np.testing.assert_array_equal(ids.numpy(), want[2])


def test_check_is_live_priorities(kernels: object, calls: object) -> None:
    rng = np.random.default_rng(3)
    tc = TreeCalls(tuple(random_tree(rng, 100)), LazyMin(np.zeros(112))).update_arrays(20)
    for trial in range(300):
        first = int(rng.integers(0, 400))
        ids = rng.integers(first - 3, first + 103, 20)  # a few stale or never issued
        if trial % 2:
            ids = rng.integers(first, first + 100, 20)
        values = rng.exponential(size=20).astype(np.float32 if trial % 3 else np.float64)
        if trial % 5 == 0:
            values[rng.integers(0, 20)] = [math.nan, math.inf, -1e-9, 0.0][trial % 4]
        want_slots, want_shifted = np.empty(20, dtype=np.int64), np.empty(20)
        ok = kernels.live_priorities(ids, values, first, first + 100, 100, 1e-6, want_slots, want_shifted)  # type: ignore[attr-defined]
        single = values.dtype == np.float32
        got = tc.check(
            ids.ctypes.data,
            values.ctypes.data,
            single,
            20,
            first,
            first + 100,
            100,
            1e-6,
            tc.slots_at,
            tc.shifted_at,
        )
        assert got == ok
        if ok:
            np.testing.assert_array_equal(tc.slots, want_slots)
            np.testing.assert_array_equal(tc.shifted, want_shifted)


@pytest.mark.parametrize("capacity", [17, 300, 70_000])
def test_write_is_update_and_keeps_the_min_tree(kernels: object, calls: object, capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    want, got = random_tree(rng, capacity), random_tree(rng, capacity)
    got[0][:] = want[0]
    sumtree.rebuild(got, np.add)
    smallest = LazyMin(got[0])
    assert smallest.value > 0  # the min-tree built: nothing pending
    tc = TreeCalls(tuple(got), smallest)
    for _ in range(30):
        n = int(rng.integers(1, 40))
        slots = rng.integers(0, capacity, n)
        shifted = rng.exponential(size=n) * 10.0 ** rng.integers(-3, 3)
        shifted[rng.random(n) < 0.2] = 0.0
        old = smallest.kept
        w = kernels.update(tuple(want), slots, shifted, power(shifted, 0.6), old)  # type: ignore[attr-defined]
        tc.update_arrays(n)
        tc.slots[:], tc.shifted[:] = slots, shifted
        power_into(tc.shifted, 0.6, tc.stored)
        largest, low, hit, exact = tc.write(
            tc.address, tc.slots_at, tc.shifted_at, tc.stored_at, n, old, smallest.in_sync
        )
        assert (largest, low, hit) == w
        for x, y in zip(got, want, strict=True):
            np.testing.assert_array_equal(x, y)
        smallest.kept_up(low, hit, exact)
        positive = got[0][got[0] > 0]
        assert smallest.value == (positive.min() if positive.size else math.inf)
        for x, y in zip(smallest.tree, rebuilt_min(got[0]), strict=True):
            np.testing.assert_array_equal(x, y)


def buffer(capacity: int = 50, **kw: object) -> ReplayBuffer:
    rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6, beta=0.4, **kw), seed=1)  # type: ignore[arg-type]
    rb.extend({"obs": torch.arange(capacity + 13, dtype=torch.float32)[:, None]})  # wrapped once
    return rb


def assert_same(a: ReplayBuffer, b: ReplayBuffer) -> None:
    sa, sb = a.sampler, b.sampler
    for x, y in zip(sa._sum, sb._sum, strict=True):  # type: ignore[attr-defined]
        np.testing.assert_array_equal(x, y)
    assert sa.max_priority == sb.max_priority  # type: ignore[attr-defined]
    assert sa.totals() == sb.totals()  # type: ignore[attr-defined]
    for x, y in zip(sa._min, rebuilt_min(sa._sum[0]), strict=True):  # type: ignore[attr-defined]
        np.testing.assert_array_equal(x, y)


def test_tensor_updates_match_the_general_path(calls: object, monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = buffer(), buffer()
    taken: list[object] = []
    real = prioritized_fast._update_tensors

    def spy(*args: object) -> object:
        taken.append(real(*args))  # type: ignore[arg-type]
        return taken[-1]

    monkeypatch.setattr(prioritized_fast, "_update_tensors", spy)
    rng = np.random.default_rng(5)
    for step in range(60):
        a = fast.sample(16)
        with monkeypatch.context() as m:
            m.setattr(writing, "update_ids", lambda *args: False)  # the general path
            b = slow.sample(16)
            assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
            prio = rng.exponential(size=16) * 10.0 ** rng.integers(-3, 3)
            prio[rng.random(16) < 0.2] = 0.0
            p = torch.tensor(prio, dtype=torch.float32 if step % 2 else torch.float64)
            ids = a["index"] if step % 3 else torch.cat([a["index"], a["index"][:4]])  # the last wins
            p = p if step % 3 else torch.cat([p, p[:4] * 3])
            slow.update_priority(ids, p)
        fast.update_priority(ids, p)
        assert_same(fast, slow)
        if step % 7 == 0:  # new items (NumPy-path writes pending in the smallest's upkeep)
            rows = {"obs": torch.full((5, 1), float(step))}
            fast.extend(rows)
            slow.extend(rows)
    assert taken and all(t is True for t in taken)


def test_unusual_tensors_go_to_the_other_paths(calls: object, monkeypatch: pytest.MonkeyPatch) -> None:
    rb, ref = buffer(), buffer()
    sampler, ring = rb.sampler, rb._ring
    ids = torch.tensor([30, 31, 40, 41])
    p = torch.tensor([1.0, 2.0, 3.0, 4.0])
    for i, q in [
        (ids[::2], p[::2].contiguous()),  # not contiguous ids
        (ids[:2], p[::2]),  # not contiguous values
        (ids, p.clone().requires_grad_()),
        (ids, p.half()),
        (ids.int(), p),
        (ids[None], p[None]),  # 2-D
        (ids, p[:, None]),  # [B, 1]
        (ids, p[:3]),  # not one per id
        (ids[:0], p[:0]),  # nothing to write
        (ids, torch._neg_view(-p)),  # a negative view
        (ids, torch.empty(4, device="meta")),
    ]:
        assert prioritized_fast._update_tensors(sampler, ring, i, q) is None
        outcomes = []
        for target, general in ((rb, False), (ref, True)):
            with monkeypatch.context() as m:
                if general:
                    m.setattr(writing, "update_ids", lambda *args: False)
                try:
                    target.update_priority(i, q)
                    outcomes.append(None)
                except Exception as exc:  # the same error either way
                    outcomes.append((type(exc), str(exc)))
        assert outcomes[0] == outcomes[1]
        assert_same(rb, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("ids", "prio", "error", "match"),
    [
        ([30, 12], [1.0, 2.0], StaleIndexError, "item 12 has been overwritten"),  # live: 13 .. 62
        ([30, 63], [1.0, 2.0], XpbankIndexError, "item 63 was never issued"),
        ([30, 31], [1.0, math.nan], PriorityError, "got nan at position 1"),
        ([30, 31], [math.inf, 1.0], PriorityError, "got inf at position 0"),
        ([30, 31], [1.0, -1e-3], PriorityError, "at position 1"),
    ],
)
def test_refused_tensors_write_nothing(
    calls: object, dtype: torch.dtype, ids: list, prio: list, error: type, match: str
) -> None:
    rb = buffer()
    rb.update_priority(torch.tensor([30, 40]), torch.tensor([5.0, 0.5]))
    before = [level.copy() for level in rb.sampler._sum]  # type: ignore[attr-defined]
    largest, totals = rb.sampler.max_priority, rb.sampler.totals()  # type: ignore[attr-defined]
    i, p = torch.tensor(ids), torch.tensor(prio, dtype=dtype)
    assert prioritized_fast._update_tensors(rb.sampler, rb._ring, i, p) is False
    with pytest.raises(error, match=match):
        rb.update_priority(i, p)
    for x, y in zip(rb.sampler._sum, before, strict=True):  # type: ignore[attr-defined]
        np.testing.assert_array_equal(x, y)
    assert rb.sampler.max_priority == largest and rb.sampler.totals() == totals  # type: ignore[attr-defined]


def test_copies_rebuild_their_calls(calls: object) -> None:
    rb = buffer()
    rb.update_priority(rb.sample(8)["index"], torch.rand(8))
    assert pickle.loads(pickle.dumps(rb)).sampler._calls.levels == ()  # type: ignore[attr-defined]
    for _ in range(2):  # a copy of a copy too
        rb.sample(4)  # the top's sums kept: a copy must sum them anew into its own calls' array
        twin = copy.deepcopy(rb)
        assert twin.sampler._calls.levels == ()  # type: ignore[attr-defined]
        for _ in range(5):
            a, b = rb.sample(8), twin.sample(8)
            assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
            p = torch.rand(8)
            rb.update_priority(a["index"], p)
            twin.update_priority(b["index"], p)
        assert_same(rb, twin)
        assert twin.sampler._calls.levels is twin.sampler._levels  # type: ignore[attr-defined]
        rb = twin


def test_a_negative_view_of_priorities_is_read_by_value() -> None:
    """A priority tensor with the negative bit (the imaginary part of a conjugate) raised
    torch's RuntimeError from ``numpy()``; it now sets the priorities its values say."""
    ids = torch.tensor([30, 31, 40])
    values = torch.tensor([1.0, 2.0, 3.5])
    z = torch.complex(torch.zeros(3), -values).conj()  # imaginary part: +values, negative bit
    assert z.imag.is_neg()
    rb, ref = buffer(), buffer()
    rb.update_priority(ids, z.imag)
    ref.update_priority(ids, values.clone())
    assert_same(rb, ref)
