"""The table model on every buffer backend: a local ``ReplayBuffer`` (memory, memmap),
``ShmReplayBuffer`` and a (one-shard) ``RayReplayBuffer``, through ``buffer_factory``:
selectors, removers, ``max_times_sampled``, queue waits and staleness behave the same.

The multi-process and multi-shard sides (rows left in channels, reader processes, draws
split over shards) are in ``test_table_shm.py`` and ``test_table_ray.py``.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from conftest import BufferFactory
from xpbank import EmptyBufferError, Field, RateLimitTimeout, Spec, Table

SPEC = Spec({"x": Field((), torch.int64), "version": Field((), torch.int64)})


def items(first: int, n: int) -> dict[str, torch.Tensor]:
    x = torch.arange(first, first + n)
    return {"x": x, "version": x}


def xs(batch: object) -> list[int]:
    return batch["x"].tolist()  # type: ignore[index]


def test_a_queue_hands_out_each_item_once_oldest_first_and_waits(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC, sampler=Table.queue(timeout=0.2), seed=0)
    rb.extend(items(0, 3))
    assert xs(rb.sample(2)) == [0, 1] and len(rb) == 1
    rb.extend(items(3, 3))  # 4 live: full
    with pytest.raises(RateLimitTimeout, match="insert of 1 items still blocked"):
        rb.extend(items(6, 1))  # a writer waits while the queue is full, then gives up
    assert xs(rb.sample(4)) == [2, 3, 4, 5] and len(rb) == 0
    with pytest.raises(RateLimitTimeout, match=r"sample of 1 items still blocked after 0\.2 s"):
        rb.sample(1)  # a reader waits while it is empty
    rb.extend(items(6, 1))
    assert xs(rb.sample(1)) == [6]


def test_max_times_sampled_bounds_every_item_within_and_across_batches(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(8, SPEC, sampler=Table("uniform", max_times_sampled=3), seed=0)
    rb.extend(items(0, 5))
    first = Counter(xs(rb.sample(9)))
    assert max(first.values()) <= 3
    second = Counter(xs(rb.sample(6)))
    assert first + second == Counter({x: 3 for x in range(5)})  # each item exactly 3 times
    assert len(rb) == 0
    with pytest.raises(EmptyBufferError):
        rb.sample(1)


@pytest.mark.parametrize("selector, expected", [("max_heap", [9, 5, 4, 3]), ("min_heap", [1, 1, 3, 4])])
def test_heap_selectors_hand_out_by_priority_ties_oldest_first(
    buffer_factory: BufferFactory, selector: str, expected: list[int]
) -> None:
    rb = buffer_factory(8, SPEC, sampler=Table(selector, max_times_sampled=1), seed=0)
    ids = torch.as_tensor(rb.extend(items(0, 6)))
    priorities = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    rb.update_priority(ids, priorities)
    batch = rb.sample(4)
    assert priorities[batch["x"]].int().tolist() == expected
    if selector == "min_heap":
        assert xs(batch)[:2] == [1, 3]  # the tie: the older item first


def test_a_remover_picks_who_leaves_a_full_table(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC, sampler=Table("fifo", "lifo"), seed=0)
    rb.extend(items(0, 4))
    rb.extend(items(4, 1))  # full: the newest stored item (3) leaves
    assert sorted(xs(rb.sample_all())) == [0, 1, 2, 4]


def test_staleness_drops_items_older_than_the_window(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(16, SPEC, sampler=Table("fifo", max_times_sampled=1, version_key="version"), seed=0)
    rb.extend(items(0, 10))
    assert xs(rb.sample(2, max_staleness=2, current_version=9)) == [7, 8]
    assert len(rb) == 1  # versions below 7 left
    with pytest.raises(ValueError, match="go together"):
        rb.sample(1, max_staleness=2)
