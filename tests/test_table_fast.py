"""A table's small calls (xpbank.table.fast) against the general path: the compiled
priority update (vs the NumPy checks, then ops.set_priorities) and a heap selector's
first items (vs ops.sample, then the general read): the same arrays, batches and order
after the same calls; bad input raises the general path's error with nothing written."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import Field, ReplayBuffer, Spec, Table
from xpbank.errors import PriorityError, StaleIndexError, XpbankIndexError
from xpbank.table import fast, heap

SPEC = Spec({"x": Field(())})


def _pair(selector: str, remover: str) -> tuple[ReplayBuffer, ReplayBuffer]:
    """Two equal buffers; the second without the compiled update (the general path)."""
    a, b = (ReplayBuffer(40, SPEC, sampler=Table(selector, remover)) for _ in range(2))
    b.__dict__.pop("_update_ids")
    b.__dict__.pop("_take_first")
    return a, b


def _arrays(rb: ReplayBuffer) -> dict[str, object]:
    ring = rb._ring
    return {
        "priority": ring.priority.tolist(),
        "stamp": ring.stamp.tolist(),
        "stamps": ring.stamps,
        "live": ring.live.tolist(),
        "times": ring.times.tolist(),
    }


@pytest.mark.parametrize(
    ("selector", "remover"), [("max_heap", "fifo"), ("min_heap", "max_heap"), ("fifo", "min_heap")]
)
@pytest.mark.parametrize("seed", range(3))
def test_compiled_update_leaves_what_the_general_path_leaves(selector: str, remover: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = _pair(selector, remover)
    for step in range(30):
        x = torch.arange(int(rng.integers(1, 12)), dtype=torch.float32)
        ids = [torch.as_tensor(rb.extend({"x": x})) for rb in (a, b)]
        assert ids[0].tolist() == ids[1].tolist()
        live = np.flatnonzero(a._ring.live)
        chosen = torch.as_tensor(a._ring.ids[rng.choice(live, int(rng.integers(1, live.size + 1)))])
        if step % 3 == 0:  # ties; a repeated id (the general path takes those)
            prios = torch.from_numpy(rng.integers(0, 3, chosen.shape[0]).astype(np.float32))
        else:
            prios = torch.from_numpy(rng.exponential(size=chosen.shape[0]))
        for rb in (a, b):
            rb.update_priority(chosen, prios)
        assert _arrays(a) == _arrays(b)
        if step % 4 == 1:
            k = int(rng.integers(1, 6))
            got = [rb.sample(k, replace=False) for rb in (a, b)]
            assert got[0]["index"].tolist() == got[1]["index"].tolist()
            assert torch.equal(got[0]["x"], got[1]["x"])
            assert _arrays(a) == _arrays(b)


@pytest.mark.parametrize(("selector", "remover"), [("max_heap", "fifo"), ("min_heap", "max_heap")])
def test_an_update_of_the_sample_just_taken_in_any_order(selector: str, remover: str) -> None:
    """The compiled update finds a taken item's kept key by its place in the sample when
    the ids come in the sample's order, else by the slot: the same arrays and batches as
    the general path either way (in order, reversed, a prefix, a suffix, others too)."""
    rng = np.random.default_rng(7)
    a, b = _pair(selector, remover)
    for rb in (a, b):
        rb.update_priority(torch.as_tensor(rb.extend({"x": torch.arange(30.0)})), torch.ones(30))
    for step in range(12):
        got = [rb.sample(8, replace=False)["index"] for rb in (a, b)]
        assert got[0].tolist() == got[1].tolist()
        ids = got[0]
        ids = (ids, ids.flip(0), ids[:5], ids[3:], torch.cat([ids[:4], ids[5:] + 1]))[step % 5]
        ids = ids[ids < a._ring.next_id]
        prios = torch.from_numpy(rng.integers(0, 4, ids.shape[0]).astype(np.float64))  # ties
        for rb in (a, b):
            rb.update_priority(ids, prios, stale="skip")
        assert _arrays(a) == _arrays(b)


def test_the_compiled_update_takes_the_usual_call() -> None:
    if heap.load() is None or fast._kernel() is None:
        pytest.skip("numba is not installed: the general path takes every call")
    rb = ReplayBuffer(16, SPEC, sampler=Table("max_heap"))
    ids = torch.as_tensor(rb.extend({"x": torch.zeros(8)}))
    assert fast.update_ids(rb.sampler, ids, torch.ones(8), "raise")
    before = _arrays(rb)
    assert not fast.update_ids(rb.sampler, ids[[1, 0, 1]], torch.ones(3), "raise")  # repeated: declined
    assert _arrays(rb) == before  # nothing written
    assert fast.update_ids(rb.sampler, ids[:3], torch.tensor([3.0, 2.0, 1.0]), "raise")
    assert rb._ring.priority[:4].tolist() == [3.0, 2.0, 1.0, 1.0]
    assert rb.sample(2, replace=False)["index"].tolist() == ids[:2].tolist()


@pytest.mark.parametrize(
    ("ids", "prios", "error"),
    [
        ([0, 99], [1.0, 1.0], XpbankIndexError),  # never issued
        ([0, -1], [1.0, 1.0], XpbankIndexError),
        ([0, 1], [1.0, float("nan")], PriorityError),
        ([0, 1], [1.0, -1.0], PriorityError),
        ([0, 1], [1.0, float("inf")], PriorityError),
        ([0, 0], [1.0], PriorityError),
    ],
)
def test_bad_input_raises_and_writes_nothing(ids: list[int], prios: list[float], error: type) -> None:
    rb = ReplayBuffer(16, SPEC, sampler=Table("max_heap", max_times_sampled=1))
    rb.extend({"x": torch.zeros(10)})
    before = _arrays(rb)
    with pytest.raises(error):
        rb.update_priority(torch.tensor(ids), torch.tensor(prios, dtype=torch.float64))
    assert _arrays(rb) == before


def test_a_stale_id_raises_or_is_skipped() -> None:
    rb = ReplayBuffer(16, SPEC, sampler=Table("max_heap", max_times_sampled=1))
    ids = torch.as_tensor(rb.extend({"x": torch.zeros(10)}))
    gone = rb.sample(1, replace=False)["index"]  # used up: removed
    before = _arrays(rb)
    both = torch.cat([ids[5:6], gone])
    with pytest.raises(StaleIndexError):
        rb.update_priority(both, torch.tensor([4.0, 4.0]))
    assert _arrays(rb) == before
    rb.update_priority(both, torch.tensor([4.0, 4.0]), stale="skip")
    assert rb._ring.priority[5] == 4.0
    assert rb.sample(1, replace=False)["index"].tolist() == [5]


def test_first_items_are_taken_only_where_the_general_path_would_take_them_so() -> None:
    if heap.load() is None:
        pytest.skip("numba is not installed: the general path takes every call")
    plain = ReplayBuffer(16, SPEC, sampler=Table("max_heap"))
    limited = ReplayBuffer(16, SPEC, sampler=Table("max_heap", max_times_sampled=2))
    fifo = ReplayBuffer(16, SPEC, sampler=Table("fifo", "max_heap"))
    for rb in (plain, limited, fifo):
        rb.extend({"x": torch.arange(6, dtype=torch.float32)})
        rb.update_priority(torch.arange(6), torch.tensor([1.0, 5.0, 2.0, 5.0, 0.0, 3.0]))
    before = _arrays(plain)
    for b in (0, 7, 2.0, True):  # the general path raises (or reads) these
        assert fast.take_first(plain.sampler, b) is None
    assert _arrays(plain) == before
    assert fast.take_first(limited.sampler, 2) is None
    assert fast.take_first(fifo.sampler, 2) is None
    got = fast.take_first(plain.sampler, 3)
    assert got is not None
    slots, ids = got
    assert slots.tolist() == [1, 3, 5]
    assert ids.tolist() == [1, 3, 5]  # ties: the older first
    assert plain._ring.times[:6].tolist() == [0, 1, 0, 1, 0, 1]
    batch = plain.sample(3, replace=False)  # the taken ones are back, with their priorities
    assert batch["index"].tolist() == [1, 3, 5]
    assert batch["x"].tolist() == [1.0, 3.0, 5.0]
