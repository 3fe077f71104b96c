"""Tables over several Ray shards: a batch is split within what each shard's table can
serve, so ``max_times_sampled`` holds across shards; a queue's sample waits for rows
another writer sends; staleness options reach every shard.

Rows without an env field go to the shards in turn, one ``extend`` to each.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

pytest.importorskip("ray")

from xpbank import EmptyBufferError, Field, RateLimitTimeout, Spec, StaleIndexError, Table
from xpbank.distributed.ray import RayReplayBuffer

SPEC = Spec({"x": Field((), torch.int64), "version": Field((), torch.int64)})


def items(first: int, n: int) -> dict[str, torch.Tensor]:
    x = torch.arange(first, first + n)
    return {"x": x, "version": x}


@pytest.fixture
def two_shards(ray_pool: Any) -> Iterator[Any]:
    made: list[RayReplayBuffer] = []

    def make(table: Table, capacity: int = 16) -> RayReplayBuffer:
        made.append(RayReplayBuffer(2, capacity, SPEC, sampler=table, flush_bytes=0, seed=0,
                                    shards=ray_pool.take(2, first=0)))  # fmt: skip
        return made[-1]

    yield make
    for rb in made:
        rb.close()


def test_max_times_sampled_holds_across_shards(two_shards: Any) -> None:
    rb = two_shards(Table("uniform", max_times_sampled=2))
    first, second = rb.extend(items(0, 5)), rb.extend(items(5, 3))
    assert {int(i) % 2 for i in torch.as_tensor(first)} != {int(i) % 2 for i in torch.as_tensor(second)}
    got = Counter(rb.sample(10)["x"].tolist()) + Counter(rb.sample(6)["x"].tolist())
    assert got == Counter({x: 2 for x in range(8)})  # the shards of 5 and 3 items: 10 and 6 draws
    with pytest.raises(EmptyBufferError, match="can serve 0 now"):
        rb.sample(1)


def test_a_queue_sample_waits_for_rows_another_writer_sends(two_shards: Any) -> None:
    rb = two_shards(Table.queue(timeout=0.3), capacity=8)
    rb.extend(items(0, 2))
    writer = rb.writer()
    with pytest.raises(RateLimitTimeout, match=r"sample of 3 items still blocked after 0\.3 s"):
        rb.sample(3)
    assert len(rb) == 2  # nothing drawn

    def send() -> None:
        writer.extend(items(2, 2))
        writer.flush()

    late = threading.Timer(0.3, send)
    late.start()
    got = set(rb.sample(3, timeout=30.0)["x"].tolist())
    late.join()
    assert len(got) == 3 and got <= {0, 1, 2, 3} and len(rb) == 1
    assert (0 in got or 1 not in got) and (2 in got or 3 not in got)  # oldest first on each shard


def test_staleness_reaches_every_shard(two_shards: Any) -> None:
    rb = two_shards(Table("fifo", max_times_sampled=1, version_key="version"))
    rb.extend(items(0, 6))
    rb.extend(items(6, 6))
    got = rb.sample(3, max_staleness=2, current_version=11)["x"].tolist()
    assert sorted(got) == [9, 10, 11] and len(rb) == 0  # versions below 9 left both shards


@pytest.mark.slow  # its own actors (10-30 s to start on the shared machine) and a restart
@pytest.mark.parametrize("kind", ["queue", "max_heap"])
def test_a_killed_table_shard_comes_back_with_its_checkpoint(ray_session: Any, kind: str) -> None:
    """As a plain buffer's shard (tests/test_ray.py): killed, restarted by Ray, it reloads
    its table from the checkpoint; what was written after it is lost, its ids stale."""
    table = Table.queue(timeout=0.0) if kind == "queue" else Table("max_heap")
    rb = RayReplayBuffer(2, 16, SPEC, sampler=table, flush_bytes=0, seed=0, probe_timeout=2.0)
    try:
        rb.extend(items(0, 6))  # shard 0
        rb.extend(items(6, 6))  # shard 1
        rb.checkpoint()
        lost = torch.as_tensor(rb.extend(items(12, 2)))  # shard 0, after its checkpoint
        ray_session.kill(rb.shards[0], no_restart=False)
        deadline, status = time.monotonic() + 120, rb.shard_status()[0]
        while time.monotonic() < deadline and not (status.state == "up" and status.restarts == 1):
            time.sleep(0.5)
            status = rb.shard_status()[0]
        assert (status.state, status.restarts, status.restored) == ("up", 1, 6), status
        assert len(rb) == 12
        if kind == "max_heap":
            with pytest.raises(StaleIndexError, match=r"lost in a shard restart \(shard 0"):
                rb.update_priority(lost, [1.0, 1.0])
        assert sorted(rb.sample(12, replace=False)["x"].tolist()) == list(range(12))
    finally:
        rb.close()
