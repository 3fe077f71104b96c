"""The prioritized sampler's small-call paths (``sampler/prioritized_fast.py``): the
buffer's compiled update (``update_ids``) and its fast sample (``fast_read.try_prioritized``
through ``draw_into`` and the ``draw_fresh`` kernel).

The update must leave exactly the trees, largest priority and smallest priority that the
general path (the checks, then ``sampler.update_priority``) leaves, and decline every
input it does not accept before writing anything, so that the general path raises or
skips. The fast sample must give the general path's batches and schedule.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from sumtree_paths import kernels_fixture  # noqa: F401 (the kernels fixture)
from xpbank import PrioritizedSampler, PriorityError, ReplayBuffer, StaleIndexError, XpbankIndexError
from xpbank.replay import writing
from xpbank.replay.fast_read import ids_of_rows
from xpbank.ring.ids import Ring
from xpbank.sampler import prioritized_fast


def buffer(capacity: int = 50, **kw: object) -> ReplayBuffer:
    rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6, beta=0.4, **kw), seed=1)  # type: ignore[arg-type]
    rb.extend({"obs": torch.arange(capacity + 13, dtype=torch.float32)[:, None]})  # wrapped once
    return rb


def trees(rb: ReplayBuffer) -> list[np.ndarray]:
    return [level.copy() for level in rb.sampler._sum]  # type: ignore[attr-defined]


def assert_same_sampler(a: ReplayBuffer, b: ReplayBuffer) -> None:
    for x, y in zip(trees(a), trees(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert a.sampler.max_priority == b.sampler.max_priority  # type: ignore[attr-defined]
    assert a.sampler.totals() == b.sampler.totals()  # type: ignore[attr-defined]


def test_live_priorities_is_live_slots_plus_eps(kernels: object) -> None:
    rng = np.random.default_rng(0)
    for trial in range(200):
        b = int(rng.integers(0, 30))
        ids = rng.integers(40, 140, b)
        values = rng.exponential(size=b).astype(np.float32 if trial % 2 else np.float64)
        if b and trial % 5 == 1:
            values[rng.integers(b)] = [np.nan, -np.inf, np.inf, -1e-30][trial % 4]
        if b and trial % 5 == 2:
            ids[rng.integers(b)] = [39, 140][trial % 2]  # stale, never issued
        want_slots = np.empty(b, dtype=np.int64)
        want = kernels.live_slots(ids, values, 40, 140, 100, want_slots)  # type: ignore[attr-defined]
        slots, shifted = np.empty(b, dtype=np.int64), np.empty(b)
        got = kernels.live_priorities(ids, values, 40, 140, 100, 1e-6, slots, shifted)  # type: ignore[attr-defined]
        assert got == want
        if got:
            np.testing.assert_array_equal(slots, want_slots)
            np.testing.assert_array_equal(shifted, values.astype(np.float64) + 1e-6)  # NumPy's add


@pytest.mark.parametrize("normalize", [True, False])
def test_update_matches_the_general_path(
    kernels: object, monkeypatch: pytest.MonkeyPatch, normalize: bool
) -> None:
    fast, slow = buffer(normalize_weights=normalize), buffer(normalize_weights=normalize)
    slow._fast_read = False  # and the sampler's own sample: fresh prefix sums after each write
    taken = []
    real = prioritized_fast.update_ids

    def spy(*args: object) -> bool:
        taken.append(real(*args))  # type: ignore[arg-type]
        return taken[-1]

    monkeypatch.setattr(writing, "update_ids", spy)
    rng = np.random.default_rng(normalize)
    for step in range(40):
        a = fast.sample(16)
        with monkeypatch.context() as m:
            m.setattr(writing, "update_ids", lambda *args: False)  # the general path
            b = slow.sample(16)
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
        prio = rng.exponential(size=16) * 10.0 ** rng.integers(-3, 3)
        prio[rng.random(16) < 0.2] = 0.0  # zeros: eps keeps them drawable
        ids = a["index"]
        if step % 3 == 0:
            ids, prio = ids.numpy(), prio.astype(np.float32)  # arrays; float32 widened first
        elif step % 3 == 1:
            ids, prio = torch.cat([ids, ids[:4]]), np.concatenate([prio, prio[:4] * 3])  # the last wins
        fast.update_priority(ids, torch.as_tensor(prio))
        with monkeypatch.context() as m:
            m.setattr(writing, "update_ids", lambda *args: False)
            slow.update_priority(ids, torch.as_tensor(prio))
        assert_same_sampler(fast, slow)
        if step % 7 == 0:  # new items at the largest priority: the upkeep of the smallest
            rows = {"obs": torch.full((5, 1), float(step))}
            fast.extend(rows)
            slow.extend(rows)
    assert all(taken)  # every update above went through the compiled path


@pytest.mark.parametrize(
    ("ids", "prio", "error", "match"),
    [
        ([30, 12], [1.0, 2.0], StaleIndexError, "item 12 has been overwritten"),  # live: 13 .. 62
        ([30, 63], [1.0, 2.0], XpbankIndexError, "item 63 was never issued"),
        ([30, -1], [1.0, 2.0], XpbankIndexError, "item -1 was never issued"),
        ([30, 31], [1.0, math.nan], PriorityError, "got nan at position 1"),
        ([30, 31], [math.inf, 1.0], PriorityError, "got inf at position 0"),
        ([30, 31], [1.0, -1e-9], PriorityError, "got -1e-09 at position 1"),
        ([30, 31], [1.0], PriorityError, r"expected one per index \(2\), got shape \(1,\)"),
    ],
)
def test_update_declines_and_writes_nothing(
    kernels: object, ids: list, prio: list, error: type, match: str
) -> None:
    rb = buffer()
    rb.update_priority(torch.tensor([30, 40]), torch.tensor([5.0, 0.5], dtype=torch.float64))
    before, largest = trees(rb), rb.sampler.max_priority  # type: ignore[attr-defined]
    for i, p in (
        (torch.tensor(ids), torch.tensor(prio, dtype=torch.float64)),
        (np.array(ids), np.array(prio)),
    ):
        assert not prioritized_fast.update_ids(rb.sampler, rb._ring, i, p, "raise")
        with pytest.raises(error, match=match):
            rb.update_priority(i, p)
        for x, y in zip(trees(rb), before, strict=True):
            np.testing.assert_array_equal(x, y)
        assert rb.sampler.max_priority == largest  # type: ignore[attr-defined]


def test_update_leaves_other_inputs_to_the_general_path(kernels: object) -> None:
    rb = buffer()
    sampler, ring = rb.sampler, rb._ring
    for ids, prio in [
        ([30], [1.0]),  # lists
        (np.array([30], dtype=np.int32), np.array([1.0])),  # int32 ids
        (np.array([30]), np.array([1], dtype=np.int64)),  # integer priorities
        (np.array([30]), np.array([[1.0]])),  # [B, 1]
        (np.array([30]), torch.tensor([1.0], requires_grad=True)),
        (np.array([], dtype=np.int64), np.array([])),  # nothing to write
    ]:
        assert not prioritized_fast.update_ids(sampler, ring, ids, prio, "raise")
        rb.update_priority(ids, prio)  # the general path converts them
    assert not prioritized_fast.update_ids(sampler, ring, np.array([30]), np.array([1.0]), "drop")
    slots = np.array([30 % 50])
    assert sampler.priority(slots)[0] == pytest.approx((1.0 + 1e-6) ** 0.6)  # type: ignore[attr-defined]


def test_stale_skip_goes_through_the_general_path(kernels: object) -> None:
    fast, slow = buffer(), buffer()
    ids, prio = torch.tensor([12, 30, 31]), torch.tensor([9.0, 2.0, 3.0], dtype=torch.float64)
    assert not prioritized_fast.update_ids(fast.sampler, fast._ring, ids, prio, "skip")
    fast.update_priority(ids, prio, stale="skip")
    slow.update_priority(ids[1:], prio[1:])
    assert_same_sampler(fast, slow)


def test_fast_sample_is_the_samplers_own(kernels: object) -> None:
    # the same batches, weights and beta schedule as the sampler's sample (the general path)
    fast, slow = buffer(beta_steps=7), buffer(beta_steps=7)
    slow._fast_read = False
    for step in range(12):
        a, b = fast.sample(1 + step % 5), slow.sample(1 + step % 5)
        assert torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
        assert torch.equal(a["obs"], b["obs"]) and list(a.keys()) == list(b.keys())
        assert fast.sampler.beta == slow.sampler.beta  # type: ignore[attr-defined]
    assert fast._read_plan.prioritized  # type: ignore[attr-defined]
    state = fast.state_dict()
    again = [fast.sample(4)["index"] for _ in range(3)]
    fast.load_state_dict(state)
    assert all(torch.equal(fast.sample(4)["index"], ids) for ids in again)


def test_fast_sample_leaves_nothing_to_draw_to_the_sampler(kernels: object) -> None:
    rb = buffer(eps=0.0)
    rb.update_priority(torch.arange(13, 63), torch.zeros(50, dtype=torch.float64))
    with pytest.raises(PriorityError, match="every stored priority is 0"):
        rb.sample(4)
    with pytest.raises(PriorityError, match="replace=False"):
        buffer().sample(4, replace=False)


def test_draw_fresh_is_prefix_then_draw(kernels: object) -> None:
    from xpbank.sampler import sumtree

    rng = np.random.default_rng(2)
    for capacity in [1, 17, 300, 70_000]:
        tree = sumtree.new_tree(capacity, np.add)
        tree[0][:capacity] = rng.random(capacity) ** 3
        sumtree.rebuild(tree, np.add)
        b = int(rng.integers(1, 64))
        draws = rng.random(b)
        want_cums = kernels.prefix(tree[-1])  # type: ignore[attr-defined]
        want_slots, want_ratios = np.empty(b, dtype=np.int64), np.empty(b)
        want = (want_slots, want_ratios, np.empty(b, dtype=np.int64), 0, capacity)
        kernels.draw_fresh(tuple(tree), want_cums, False, draws, 1.0, 0.01, *want)  # type: ignore[attr-defined]
        for fresh in (True, False):
            cums = np.full(want_cums.shape, np.nan) if fresh else want_cums.copy()
            slots, ratios, ids = np.empty(b, dtype=np.int64), np.empty(b), np.empty(b, dtype=np.int64)
            first = int(rng.integers(0, 5 * capacity))  # a ring at any point: ids of its live slots
            args = (slots, ratios, ids, first, capacity)
            kernels.draw_fresh(tuple(tree), cums, fresh, draws, 1.0, 0.01, *args)  # type: ignore[attr-defined]
            np.testing.assert_array_equal(cums, want_cums)
            np.testing.assert_array_equal(slots, want_slots)
            np.testing.assert_array_equal(ratios, want_ratios)
            ring = Ring(capacity, first + capacity, capacity)  # full: every slot live
            np.testing.assert_array_equal(ids, ids_of_rows(ring, slots))


def test_a_draw_written_into_given_arrays_is_the_samples_own(kernels: object) -> None:
    """fast_read.draw_prioritized_at (a Mixture's share): the ids at the given address and
    the weights in the given slice are those of the buffer's own sample, and the schedule
    moves on as there; declined (a field list's buffer, nothing stored) writes nothing."""
    from xpbank.replay import fast_read

    rb, twin = buffer(beta_steps=5), buffer(beta_steps=5)
    for k in (1, 7, 32):
        ids, weights = np.full(k + 3, -1, dtype=np.int64), np.full(k + 3, -1, dtype=np.float32)
        with rb.lock:
            rows = fast_read.draw_prioritized_at(
                rb, k, torch.from_numpy(ids).data_ptr() + 8 * 2, weights[2 : 2 + k]
            )
        want = twin.sample(k)
        assert rows is not None and rows.shape == (k,)
        assert ids[:2].tolist() == [-1, -1] and ids[2 + k :].tolist() == [-1]  # nothing else written
        assert torch.equal(torch.from_numpy(ids[2 : 2 + k]), want["index"])
        assert torch.equal(torch.from_numpy(weights[2 : 2 + k]), want["weight"])
        assert torch.equal(torch.from_numpy(rb.storage.view("obs").numpy()[rows]), want["obs"])
        assert rb.sampler.beta == twin.sampler.beta  # type: ignore[attr-defined]
    empty = ReplayBuffer(8, sampler=PrioritizedSampler(), seed=0)
    out = np.full(4, -1, dtype=np.float32)
    assert (
        fast_read.draw_prioritized_at(empty, 4, torch.from_numpy(np.empty(4, dtype=np.int64)).data_ptr(), out)
        is None
    )
    assert out.tolist() == [-1.0] * 4
