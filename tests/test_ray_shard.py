"""The pieces of xpbank.distributed.ray that run without actors: a shard in this process,
the global id encoding, and the global importance weights."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

pytest.importorskip("ray")

from xpbank import PrioritizedSampler, StaleIndexError, XpbankIndexError
from xpbank.distributed.ray.ids import decode, encode, id_problem, split_by_shard
from xpbank.distributed.ray.shard import Shard
from xpbank.distributed.ray.weights import global_weights
from xpbank.errors import BankError, CorruptBankError

UNIFORM = {"sampler": {"name": "uniform", "config": {}}, "seed": 0}
PRIORITIZED = {
    "sampler": {"name": "prioritized", "config": {"alpha": 1.0, "beta": 1.0, "eps": 0.0}},
    "seed": 0,
}


def rows(start: int, n: int) -> dict[str, torch.Tensor]:
    return {"obs": torch.arange(start, start + n, dtype=torch.float32).unsqueeze(1)}


def test_ids_round_trip_and_keep_each_shards_order() -> None:
    local = np.array([0, 1, 2, 5, 0, 9])
    shard = np.array([0, 0, 1, 1, 3, 3])
    g = encode(local, shard, num_shards=4)
    assert g.tolist() == [0, 4, 9, 21, 3, 39]
    s, loc = decode(g, num_shards=4)
    assert s.tolist() == shard.tolist() and loc.tolist() == local.tolist()
    assert len(set(encode(np.arange(100), np.arange(100) % 7, 7).tolist())) == 100  # never two alike


def test_split_by_shard_groups_positions_in_order() -> None:
    ids, parts = split_by_shard(torch.tensor([5, 2, 7, 0, 3, 4]), num_shards=3)
    assert [p.tolist() for p in parts] == [[3, 4], [2, 5], [0, 1]]  # positions of shard 0, 1, 2
    assert [ids[p].tolist() for p in parts] == [[0, 3], [7, 4], [5, 2]]
    with pytest.raises(XpbankIndexError, match=r"indices: item -3 was never issued"):
        split_by_shard([1, -3], 2)
    with pytest.raises(XpbankIndexError, match=r"indices: expected integers, got dtype float"):
        split_by_shard([1.5], 2)


def test_id_problems_name_global_ids() -> None:
    stale = {"kind": "stale", "id": 1, "first": 4, "next": 10}
    error = id_problem(2, stale, 3, "raise")
    assert isinstance(error, StaleIndexError)
    assert "item 5 has been overwritten" in str(error) and "live ids 14 .. 29 in steps of 3" in str(error)
    assert id_problem(2, stale, 3, "skip") is None
    never = id_problem(0, {"kind": "never", "id": 12, "first": 0, "next": 12}, 2, "skip")
    assert isinstance(never, XpbankIndexError) and "item 24 was never issued" in str(never)


def brute_force_weights(
    stored_all: np.ndarray, drawn: np.ndarray, beta: float, normalize: bool
) -> np.ndarray:
    probs = stored_all / stored_all.sum()
    w = (len(stored_all) * probs[drawn]) ** -beta
    return w / ((len(stored_all) * probs[probs > 0].min()) ** -beta) if normalize else w


@pytest.mark.parametrize("normalize", [True, False])
def test_global_weights_equal_one_buffers_weights(normalize: bool) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.uniform(0.1, 5.0, 7), rng.uniform(0.1, 5.0, 4)  # two shards' stored priorities
    shards = [
        {"size": 7, "total": a.sum(), "smallest": a.min()},
        {"size": 4, "total": b.sum(), "smallest": b.min()},
    ]
    sampler = PrioritizedSampler(beta=0.4, beta_steps=10, normalize_weights=normalize)
    drawn = np.array([0, 3, 8, 10])  # positions in a ++ b
    got = global_weights(np.concatenate([a, b])[drawn], shards, sampler, samples=5)
    expected = brute_force_weights(np.concatenate([a, b]), drawn, beta=0.4 + 0.6 * 0.5, normalize=normalize)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def make(tmp_path: Path, options: dict[str, Any] = UNIFORM, **kw: Any) -> Shard:
    return Shard(1, 2, 8, None, options, str(tmp_path), **kw)


def test_a_restarted_shard_reloads_its_checkpoint(tmp_path: Path) -> None:
    shard = make(tmp_path, PRIORITIZED)
    assert shard.extend(rows(0, 6)) == {"first": 0, "count": 6}
    shard.update_priority(np.array([1, 4]), np.array([3.0, 0.5]))
    assert shard.checkpoint()["items"] == 6
    again = make(tmp_path, PRIORITIZED)  # what Ray does: run the constructor again
    assert (again.incarnation, again.restored, again.offset) == (2, 6, 0)
    np.testing.assert_array_equal(again.rb.sample_all()["obs"], rows(0, 6)["obs"])
    np.testing.assert_allclose(again.rb.sampler.priority(np.arange(6)), [1, 3, 1, 1, 0.5, 1])  # type: ignore[attr-defined]
    assert again.check_ids(np.arange(6)) is None  # nothing was lost: the ids stay valid


def test_items_after_the_checkpoint_are_lost_and_their_ids_never_reused(tmp_path: Path) -> None:
    shard = make(tmp_path)
    shard.extend(rows(0, 5))
    shard.checkpoint()
    assert shard.extend(rows(5, 4)) == {"first": 5, "count": 4}  # ids 5..8 handed out, then a crash
    again = make(tmp_path)
    # the 5 restored items get ids 9..13: every id handed out before is stale, none is reused
    assert (again.restored, again.offset, again.stats()["next"]) == (5, 9, 14)
    assert again.check_ids(np.array([3])) == {"kind": "stale", "id": 3, "first": 9, "next": 14}
    assert again.check_ids(np.array([7])) == {"kind": "stale", "id": 7, "first": 9, "next": 14}
    assert again.check_ids(np.array([14])) == {"kind": "never", "id": 14, "first": 9, "next": 14}
    assert again.extend(rows(9, 2)) == {"first": 14, "count": 2}
    out = again.sample(64, None, False)
    by_id = dict(zip(out["ids"].tolist(), out["data"]["obs"][:, 0].tolist(), strict=True))
    expected = {9: 0.0, 10: 1.0, 11: 2.0, 12: 3.0, 13: 4.0, 14: 9.0, 15: 10.0}
    assert by_id.items() <= expected.items()


def test_a_restart_without_a_checkpoint_starts_empty_above_every_issued_id(tmp_path: Path) -> None:
    shard = make(tmp_path)
    shard.extend(rows(0, 3))
    again = make(tmp_path)
    assert (len(again.rb), again.offset) == (0, 3)
    assert again.extend(rows(3, 1))["first"] == 3


def test_the_checkpoint_schedule_counts_inserted_items(tmp_path: Path) -> None:
    shard = make(tmp_path, every_items=4)
    shard.extend(rows(0, 3))
    assert shard.checkpointed == 0
    shard.extend(rows(3, 2))
    assert shard.checkpointed == 5
    assert (tmp_path / "shard-1" / "manifest.json").exists()
    timed = Shard(0, 2, 8, None, UNIFORM, str(tmp_path), every_seconds=0.0)
    timed.extend(rows(0, 1))
    assert timed.checkpointed == 1


def test_a_checkpoint_of_another_shard_is_refused(tmp_path: Path) -> None:
    make(tmp_path).checkpoint()
    with pytest.raises(
        CorruptBankError, match=r"expected the checkpoint of shard 1 of 3, got \{'shard': 1, 'num_shards': 2"
    ):
        Shard(1, 3, 8, None, UNIFORM, str(tmp_path))


def test_update_priority_drops_ids_that_are_not_live_and_raises_the_start_priority(tmp_path: Path) -> None:
    shard = make(tmp_path, PRIORITIZED)
    shard.extend(rows(0, 10))  # capacity 8: ids 0, 1 overwritten
    assert shard.update_priority(np.array([0, 5, 9]), np.array([7.0, 2.0, 3.0])) == 2
    np.testing.assert_allclose(shard.rb.sampler.priority(np.array([5, 1, 0])), [2.0, 3.0, 1.0])  # type: ignore[attr-defined]
    shard.set_max_priority(6.0)
    shard.extend(rows(10, 1))  # id 10 -> slot 2
    assert float(shard.rb.sampler.priority(np.array([2]))[0]) == 6.0  # type: ignore[attr-defined]
    stats = shard.stats()
    assert stats["total"] == pytest.approx(2 + 3 + 6 + 5 * 1.0) and stats["smallest"] == 1.0


def test_a_checkpoint_dir_of_an_earlier_buffer_needs_resume(tmp_path: Path) -> None:
    from xpbank.distributed.ray.spawn import check_checkpoint_dir

    check_checkpoint_dir(tmp_path / "new", resume=False)  # missing or empty: fine
    make(tmp_path).checkpoint()
    with pytest.raises(
        BankError, match=r"holds shard checkpoints of an earlier buffer \(\['shard-1'\]\); pass resume"
    ):
        check_checkpoint_dir(tmp_path, resume=False)
    check_checkpoint_dir(tmp_path, resume=True)


class ShardRestartMachine(RuleBasedStateMachine):
    """Writes, checkpoints and crashes of one shard against a list model of its live items.

    The model: live ``(id, uid)`` pairs oldest first, the pairs of the last checkpoint,
    and the next id ever handed out. A crash keeps the checkpoint's items; if ids were
    handed out after it, the restored items are renumbered from that mark on.
    """

    @initialize()
    def start(self) -> None:
        self.dir = tempfile.mkdtemp()
        self.shard = Shard(0, 1, 6, None, UNIFORM, self.dir)
        self.live: list[tuple[int, int]] = []
        self.saved: list[tuple[int, int]] = []
        self.next_id = self.uid = 0

    @rule(n=st.integers(1, 9))
    def extend(self, n: int) -> None:
        first = self.shard.extend(rows(self.uid, n))["first"]
        assert first == self.next_id  # never an id handed out before
        self.live = (self.live + [(first + i, self.uid + i) for i in range(n)])[-6:]
        self.next_id, self.uid = first + n, self.uid + n

    @rule()
    def checkpoint(self) -> None:
        self.shard.checkpoint()
        self.saved = list(self.live)

    @rule()
    def crash(self) -> None:
        self.shard = Shard(0, 1, 6, None, UNIFORM, self.dir)
        saved_next = self.saved[-1][0] + 1 if self.saved else 0
        if self.next_id > saved_next or not self.saved:  # lost items: renumber from the mark
            self.live = [(self.next_id + i, uid) for i, (_, uid) in enumerate(self.saved)]
            self.next_id += len(self.saved)
        else:
            self.live = list(self.saved)
        self.saved = list(self.live) if self.saved else []  # the bank on disk holds the same items

    @invariant()
    def items_and_ids_match_the_model(self) -> None:
        rb = self.shard.rb
        if len(rb):
            stored = rb.sample_all()
            ids = (stored["index"] + self.shard.offset).tolist()
            got = list(zip(ids, stored["obs"][:, 0].long().tolist(), strict=True))
        else:
            got = []
        assert got == self.live
        assert self.shard.stats()["next"] == self.next_id
        live_ids = {i for i, _ in self.live}
        for old in range(max(0, self.next_id - 12), self.next_id):
            problem = self.shard.check_ids(np.array([old]))
            assert (problem is None) == (old in live_ids)

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


TestShardRestartMachine = ShardRestartMachine.TestCase
TestShardRestartMachine.settings = settings(max_examples=30, stateful_step_count=20, deadline=None)
