"""The read fast path (replay/fast_read.py): ``sample(B)`` of every field from a uniform
CPU buffer. It must give exactly the batch the general path gives (same draws, keys in
the same order, dtypes, values, ids, device) and leave the generator in the same state.

Each test runs the same calls on two buffers built alike, one with the fast path
switched off (``rb._fast_read = False``, the private switch), and compares the batches.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from xpbank import Field, NStep, ReplayBuffer, Spec
from xpbank.replay.fast_read import ids_of_rows
from xpbank.ring.ids import Ring
from xpbank.sampler import PrioritizedSampler

SPEC = Spec(
    {
        "obs": Field((3,)),
        "action": Field((), torch.int64),
        "reward": Field(()),
        "terminated": Field((), torch.bool),
        ("next", "obs"): Field((3,)),
        "h": Field((2,), torch.bfloat16),
    }
)


def batch(rng: np.random.Generator, n: int) -> dict:
    return {
        "obs": torch.from_numpy(rng.standard_normal((n, 3)).astype(np.float32)),
        "action": torch.from_numpy(rng.integers(0, 5, n)),
        "reward": torch.from_numpy(rng.standard_normal(n).astype(np.float32)),
        "terminated": torch.from_numpy(rng.random(n) < 0.2),
        ("next", "obs"): torch.from_numpy(rng.standard_normal((n, 3)).astype(np.float32)),
        "h": torch.from_numpy(rng.standard_normal((n, 2)).astype(np.float32)).to(torch.bfloat16),
    }


def pair(capacity: int = 16, spec: Spec | None = SPEC, **kw) -> tuple[ReplayBuffer, ReplayBuffer]:
    fast = ReplayBuffer(capacity, spec, seed=3, **{k: v() if callable(v) else v for k, v in kw.items()})
    slow = ReplayBuffer(capacity, spec, seed=3, **{k: v() if callable(v) else v for k, v in kw.items()})
    slow._fast_read = False
    return fast, slow


def assert_same_batch(a, b) -> None:
    assert list(a.keys(include_nested=True, leaves_only=True)) == list(
        b.keys(include_nested=True, leaves_only=True)
    )
    assert a.batch_size == b.batch_size and a.device == b.device
    for key in b.keys(include_nested=True, leaves_only=True):
        x, y = a[key], b[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        if x.dtype == torch.bfloat16:  # the bits (torch.equal of bfloat16 compares as floats)
            x, y = x.view(torch.int16), y.view(torch.int16)
        assert torch.equal(x, y), key


def test_fast_sample_is_the_general_sample_through_wraps_and_clears():
    rng = np.random.default_rng(0)
    fast, slow = pair()
    for step in range(40):
        n = int(rng.integers(1, 7))
        data = batch(rng, n)
        fast.extend(data)
        slow.extend(data)
        if step % 13 == 12:
            fast.clear()
            slow.clear()
            continue
        for b in (1, 5, 32):
            assert_same_batch(fast.sample(b), slow.sample(b))
    assert fast.__dict__.get("_read_plan") is not None  # the fast path was taken
    assert slow.__dict__.get("_read_plan") is None
    assert torch.equal(fast.generator.get_state(), slow.generator.get_state())


def test_batches_are_fresh_memory_and_the_slot_tensor_never_leaks():
    rng = np.random.default_rng(1)
    rb = ReplayBuffer(16, SPEC, seed=0)
    rb.extend(batch(rng, 16))
    first = rb.sample(8)
    kept = first.clone()
    first["obs"].fill_(7.0)  # the batch is a copy: the storage is unchanged
    second = rb.sample(8)  # a new draw into the same slot tensor
    assert torch.equal(first["index"], kept["index"])  # the first batch's ids stay as they were
    assert not torch.equal(rb.sample_all()["obs"], torch.full((16, 3), 7.0))
    assert second["index"].data_ptr() != first["index"].data_ptr()


def test_many_batch_sizes_and_what_takes_the_general_path():
    fast, slow = pair()
    for rb in (fast, slow):
        rb.extend(batch(np.random.default_rng(5), 12))
    for b in [*range(1, 20), 3, 1 << 17]:  # more sizes than kept, and one past the fast path's
        assert_same_batch(fast.sample(b), slow.sample(b))
    for kw in ({"replace": False}, {"fields": ["obs"]}):
        assert_same_batch(fast.sample(4, **kw), slow.sample(4, **kw))
    with pytest.raises(ValueError, match="batch_size"):
        fast.sample(0)
    with pytest.raises(ValueError, match="batch_size"):
        fast.sample(True)
    with pytest.raises(ValueError, match="empty"):
        ReplayBuffer(4, SPEC).sample(2)


@pytest.mark.parametrize(
    ("kw", "fast_tail"),
    [
        ({"sampler": PrioritizedSampler}, True),  # its own draw, then the fast read
        ({"sampler": lambda: PrioritizedSampler(tree_device="cpu")}, True),
        ({"nstep": lambda: NStep(2, 0.9), "num_envs": 1}, False),
        ({"storage": "memmap"}, False),
        ({"device": "meta"}, False),
    ],
    ids=["prioritized", "prioritized-torch", "nstep", "memmap", "other-device"],
)
def test_other_buffers_sample_the_same(kw, fast_tail):
    keys = ("terminated", "truncated")
    spec = Spec({"obs": Field((3,)), "reward": Field(()), **{k: Field((), torch.bool) for k in keys}})
    fast, slow = pair(8, spec, **kw)
    rng = np.random.default_rng(3)
    for _ in range(5):
        data = {
            "obs": torch.from_numpy(rng.standard_normal((3, 3)).astype(np.float32)),
            "reward": torch.ones(3),
            **{k: torch.from_numpy(rng.random(3) < 0.3) for k in keys},
        }
        fast.extend(data)
        slow.extend(data)
        a, b = fast.sample(4), slow.sample(4)
        if kw.get("device") != "meta":
            assert_same_batch(a, b)
        if "weight" in b:  # the same priorities back: the same trees after
            for rb, batch in ((fast, a), (slow, b)):
                rb.update_priority(batch["index"], batch["obs"].abs().sum(-1))
    plan = fast.__dict__.get("_read_plan")
    assert (plan is not None and plan.usable and not plan.uniform) == fast_tail
    assert plan is None or not (plan.usable and plan.uniform)  # none of them draws here


def test_a_relaid_or_unpickled_storage_is_read_through_a_new_plan():
    rng = np.random.default_rng(4)
    fast, slow = pair()
    data = batch(rng, 10)
    fast.extend(data)
    slow.extend(data)
    assert_same_batch(fast.sample(4), slow.sample(4))
    plan = fast._read_plan
    copy = pickle.loads(pickle.dumps(fast))
    assert copy.__dict__.get("_read_plan") is None  # never pickled: it holds NumPy views
    assert_same_batch(copy.sample(4), slow.sample(4))
    fast.storage.initialize(SPEC)  # a new layout: the old plan reads a stale block
    fast.extend(data)
    fast.sample(3)
    assert fast._read_plan is not plan


def test_a_lazy_buffer_samples_the_same():
    rng = np.random.default_rng(6)
    fast, slow = pair(spec=None)
    data = {"obs": torch.from_numpy(rng.standard_normal((9, 2)).astype(np.float32)), "r": torch.arange(9)}
    fast.extend(data)
    slow.extend(data)
    assert_same_batch(fast.sample(6), slow.sample(6))


def test_ids_of_rows_is_the_rings_ids_of_slots():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        capacity = int(rng.integers(1, 12))
        ring = Ring(capacity)
        for _ in range(int(rng.integers(0, 6))):
            if rng.random() < 0.2:
                ring.clear()
            else:
                ring.advance(int(rng.integers(0, 3 * capacity)))
        if ring.size == 0:
            continue
        rows = rng.integers(0, ring.size, 6)  # the live slots: [0, size) until full
        want = ring.ids_of_slots(torch.from_numpy(rows)).numpy()
        assert np.array_equal(ids_of_rows(ring, rows), want)


@pytest.mark.parametrize("batch_size", [1, 32, 257])
def test_draw_into_draws_what_randint_draws(batch_size):
    from xpbank.sampler import UniformSampler

    ring = Ring(1000, next_id=1234, size=1000)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    kept = torch.empty(batch_size, dtype=torch.int64)
    for _ in range(3):  # the same tensor refilled: the same stream as fresh randint calls
        out = UniformSampler().draw_into(ring, kept, a)
        assert out is kept
        assert torch.equal(out, torch.randint(0, ring.size, (batch_size,), generator=b))
