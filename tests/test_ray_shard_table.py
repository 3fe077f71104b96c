"""A shard whose buffer holds a :class:`~xpbank.Table` (a FIFO queue, a max-heap) through
a restart, as Ray runs it (the constructor again, in this process): it reloads its
checkpoint with the table's state (order, counts, priorities), the ids handed out before
a checkpoint stay valid, and after a restart that lost items no id is handed out twice,
also where the table reuses slots out of order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from xpbank import Table
from xpbank.distributed.ray.shard import Shard

QUEUE = {"sampler": {"name": "table", "config": Table.queue(timeout=0.0).config()}, "seed": 0}
HEAP = {"sampler": {"name": "table", "config": Table("max_heap", "min_heap").config()}, "seed": 0}


def rows(start: int, n: int) -> dict[str, torch.Tensor]:
    return {"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1)}


def make(tmp_path: Path, options: dict[str, Any]) -> Shard:
    return Shard(1, 2, 8, None, options, str(tmp_path))


def drawn(shard: Shard, n: int) -> tuple[list[int], list[float]]:
    out = shard.sample(n, None, False, replace=False, options={})
    return out["ids"].tolist(), out["data"]["obs"][:, 0].tolist()


def test_a_restarted_queue_reloads_its_checkpoint(tmp_path: Path) -> None:
    shard = make(tmp_path, QUEUE)
    shard.extend(rows(0, 6))
    assert drawn(shard, 2) == ([0, 1], [0.0, 1.0])  # consumed: they left the queue
    assert shard.checkpoint()["items"] == 4
    again = make(tmp_path, QUEUE)
    assert (again.incarnation, again.restored, again.offset) == (2, 4, 0)
    assert again.check_ids(np.arange(2, 6)) is None and again.check_ids(np.array([1]))["kind"] == "stale"
    assert drawn(again, 3) == ([2, 3, 4], [2.0, 3.0, 4.0])  # oldest first, each once
    assert again.extend(rows(6, 4))["count"] == 4  # room for 4 more: the limiter's counts came back
    assert drawn(again, 5)[1] == [5.0, 6.0, 7.0, 8.0, 9.0]


def test_a_restarted_heap_keeps_its_priorities_and_ids(tmp_path: Path) -> None:
    shard = make(tmp_path, HEAP)
    shard.extend(rows(0, 6))
    shard.update_priority(np.arange(6), np.array([0.5, 4.0, 1.0, 3.0, 2.0, 0.25]))
    shard.checkpoint()
    again = make(tmp_path, HEAP)
    assert (again.restored, again.offset) == (6, 0)
    assert drawn(again, 3) == ([1, 3, 4], [1.0, 3.0, 4.0])  # highest priority first
    again.update_priority(np.array([0]), np.array([9.0]))  # an id from before the restart
    assert drawn(again, 1) == ([0], [0.0])


def write(shard: Shard, start: int, n: int, handed: dict[int, float]) -> None:
    got = shard.extend(rows(start, n))
    ids = got.get("ids", np.arange(got["first"], got["first"] + got["count"]))
    handed.update(
        zip(np.asarray(ids).tolist(), np.arange(start, start + n, dtype=float).tolist(), strict=True)
    )


@pytest.mark.parametrize("options", [QUEUE, HEAP], ids=["queue", "max_heap"])
def test_ids_lost_in_a_table_restart_are_never_handed_out_again(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    """Items written after the checkpoint are lost: after the restart an id handed out
    before it is stale or names the same item, and new ids are all fresh, though the
    table reuses slots out of order (the heap keeps its first item, id 0, while the
    other slots turn over)."""
    handed: dict[int, float] = {}  # every id handed out -> the item (obs) it named
    shard = make(tmp_path, options)
    write(shard, 0, 8, handed)
    shard.update_priority(np.array([0]), np.array([10.0]))  # the heap's remover never picks it
    for start in range(8, 32, 4):  # turn the other slots over
        drawn(shard, 4)  # the queue consumes the 4 oldest (room for the next 4)
        write(shard, start, 4, handed)
    shard.checkpoint()
    drawn(shard, 4)
    write(shard, 32, 4, handed)  # lost in the crash
    again = make(tmp_path, options)
    assert again.restored == 8
    ring = again.rb._ring
    for slot in np.flatnonzero(ring.live):
        got = int(ring.ids[slot]) + again.offset
        obs = float(again.rb._storage.read(torch.tensor([int(slot)]))["obs"][0, 0])
        assert handed.get(got, obs) == obs, f"id {got} named item {handed[got]}, now item {obs}"
    new: dict[int, float] = {}
    for start in range(40, 56, 4):
        drawn(again, 4)
        write(again, start, 4, new)
    assert not new.keys() & handed.keys(), "an id handed out before the restart was handed out again"
    lost = [i for i, obs in handed.items() if obs >= 32]
    assert again.check_ids(np.array(lost))["kind"] == "stale"


def test_a_lost_write_below_the_newest_id_is_still_never_reissued(tmp_path: Path) -> None:
    """A heap table evicts its oldest item after the checkpoint: the new item takes that
    slot's next id, below the newest id, and is lost in the crash. The restarted shard
    must not hand that id out again (the issued mark counts writes, not only the newest id)."""
    handed: dict[int, float] = {}
    shard = make(tmp_path, HEAP)
    write(shard, 0, 8, handed)
    shard.update_priority(np.array([0]), np.array([10.0]))
    for start in range(8, 24, 4):
        write(shard, start, 4, handed)  # slots 1..7 turn over; item 0 (id 0) stays
    shard.checkpoint()
    shard.update_priority(np.array([0]), np.array([0.0]))
    write(shard, 24, 1, handed)  # evicts item 0: slot 0's next id, 8, far below the newest
    assert handed[8] == 24.0
    again = make(tmp_path, HEAP)
    again.update_priority(np.array([again.rb._ring.ids[0] + again.offset]), np.array([0.0]))
    new: dict[int, float] = {}
    write(again, 30, 1, new)  # evicts the restored item 0 again
    assert not new.keys() & handed.keys(), "an id handed out before the restart was handed out again"
