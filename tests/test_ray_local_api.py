"""The local buffer's API on a RayReplayBuffer of two shards, against a reference of two
local ReplayBuffers fed the same writes (positions, epochs, update, stale ids after the
ring's wrap, state_dict). The one-shard case is the shared suite (``buffer_factory``).

The buffers reuse the session's pooled shard actors (``ray_pool``), so a test costs
round trips, not actor start-ups.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from xpbank import (
    BufferChangedError,
    CapacityError,
    ReplayBuffer,
    SpecError,
    StaleIndexError,
    XpbankIndexError,
)
from xpbank.distributed.ray import RayReplayBuffer
from xpbank.distributed.ray.local_api import TRIES, locate

pytestmark = pytest.mark.slow  # the first test starts the pool's actors (seconds each here)

S, CAP = 2, 10  # two shards of 5 items


def batch(start: int, n: int) -> dict[str, torch.Tensor]:
    uid = torch.arange(start, start + n)
    return {"uid": uid, "obs": uid.float().unsqueeze(1).repeat(1, 3), "reward": uid.float()}


class Reference:
    """Two local buffers; extend ``k`` goes to shard ``k % 2`` (the writer's round robin)."""

    def __init__(self) -> None:
        self.shards = [ReplayBuffer(CAP // S) for _ in range(S)]
        self.turn = 0

    def extend(self, b: dict[str, torch.Tensor]) -> range:
        s = self.turn % S
        self.turn += 1
        ids = self.shards[s].extend(b)
        return range(ids.start * S + s, ids.stop * S + s, S)

    def all(self) -> tuple[list[int], list[int]]:
        """(global ids, uids) in the buffer's order: shard 0's oldest first, then shard 1's."""
        ids: list[int] = []
        uids: list[int] = []
        for s, rb in enumerate(self.shards):
            if len(rb):
                td = rb.sample_all()
                ids += (td["index"] * S + s).tolist()
                uids += td["uid"].tolist()
        return ids, uids


@pytest.fixture
def make(ray_pool: Any, tmp_path: Path) -> Callable[..., RayReplayBuffer]:
    made: list[RayReplayBuffer] = []

    def build(seed: int = 0) -> RayReplayBuffer:
        shards = ray_pool.take(S, first=S * len(made))
        rb = RayReplayBuffer(
            S, CAP, flush_bytes=0, shards=shards, seed=seed, checkpoint_dir=tmp_path / f"rb{len(made)}"
        )
        made.append(rb)
        return rb

    return build


def written(make: Callable[..., RayReplayBuffer], sizes: list[int], seed: int = 0) -> tuple[Any, Reference]:
    rb, ref = make(seed), Reference()
    start = 0
    for n in sizes:
        assert rb.extend(batch(start, n)) == ref.extend(batch(start, n))
        start += n
    return rb, ref


def test_locate_is_a_brute_force_walk() -> None:
    sizes = [3, 0, 4, 1]
    walk = [(s, i) for s, n in enumerate(sizes) for i in range(n)]
    shard, local = locate(np.arange(8), sizes)
    assert list(zip(shard.tolist(), local.tolist(), strict=True)) == walk


@pytest.mark.parametrize("sizes", [[3], [3, 4, 2], [7, 1, 6, 2, 9]], ids=["one", "unwrapped", "wrapped"])
def test_sample_all_and_positions_follow_the_reference(make: Any, sizes: list[int]) -> None:
    rb, ref = written(make, sizes)
    ids, uids = ref.all()
    everything = rb.sample_all()
    assert everything["index"].tolist() == ids and everything["uid"].tolist() == uids
    assert len(rb) == len(ids) and rb.is_full == (len(ids) == CAP)
    positions = [0, -1, len(ids) // 2, -len(ids)]
    got = rb.sample_by_index(positions)
    assert got["index"].tolist() == [ids[p] for p in positions]
    assert got["uid"].tolist() == [uids[p] for p in positions]
    msg = f"indices: position {len(ids)} is out of range for a buffer holding {len(ids)} items"
    with pytest.raises(XpbankIndexError, match=re.escape(msg)):
        rb.sample_by_index([0, len(ids)])


def test_update_routes_by_id_and_sample_all_shows_it(make: Any) -> None:
    rb, ref = written(make, [4, 4, 3])  # shard 0: uids 0-3, 8-10 (wrapped); shard 1: 4-7
    ids, uids = ref.all()
    pick = [ids[0], ids[-1], ids[5], ids[0]]  # both shards, a repeated id keeps its last row
    rb.update(pick, {"reward": torch.tensor([-1.0, -2.0, -3.0, -4.0])})
    for s, rows in enumerate(ref.shards):  # the same update on the reference, per shard
        mine = [(i // S, v) for i, v in zip(pick, [-1.0, -2.0, -3.0, -4.0], strict=True) if i % S == s]
        if mine:
            rows.update([i for i, _ in mine], {"reward": torch.tensor([v for _, v in mine])})
    want = torch.cat([r.sample_all()["reward"] for r in ref.shards])
    assert torch.equal(rb.sample_all()["reward"], want)
    assert rb.sample_all()["uid"].tolist() == uids  # other fields untouched


def test_stale_and_unwritten_ids_raise_and_write_nothing(make: Any) -> None:
    rb, ref = written(make, [5, 5, 2])  # shard 0 got 5 then 2: its ids 0, 1 are overwritten
    before = rb.sample_all().to_dict()
    stale = 0 * S + 0  # shard 0's first item
    with pytest.raises(StaleIndexError, match=re.escape("indices: item 0 has been overwritten")):
        rb.update([ref.all()[0][-1], stale], {"reward": torch.zeros(2)})
    with pytest.raises(XpbankIndexError, match=re.escape("indices: item 21 was never issued")):
        rb.update([1, 21], {"reward": torch.zeros(2)})  # shard 1's local id 10: not written yet
    with pytest.raises(SpecError, match=re.escape("update: got 2 indices but 3 rows of values")):
        rb.update([1, 4], {"reward": torch.zeros(3)})
    with pytest.raises(SpecError, match=re.escape("field 'obs': expected (*, 3) float32")):
        rb.update([1, 4], {"obs": torch.zeros(2, 4)})
    after = rb.sample_all().to_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_epochs_visit_every_item_of_every_shard_once(make: Any) -> None:
    rb, ref = written(make, [3, 4, 3, 2])
    ids, _ = ref.all()
    for shuffle in (True, False):
        batches = list(rb.epochs(3, n_epochs=2, shuffle=shuffle))
        seen = [i for b in batches for i in b["index"].tolist()]
        assert sorted(seen[: len(ids)]) == sorted(ids) == sorted(seen[len(ids) :])
        if not shuffle:
            assert seen[: len(ids)] == ids
    it = rb.epochs(2)
    next(it)
    rb.extend(batch(100, 1))
    with pytest.raises(BufferChangedError, match="extended or cleared during iteration"):
        next(it)


def test_env_rows_get_ids_in_row_order(make: Any) -> None:
    rb = make()
    b = {**batch(0, 6), "env_id": torch.tensor([0, 1, 1, 0, 3, 2])}
    ids = rb.extend(b)
    assert isinstance(ids, torch.Tensor)
    assert (ids % S).tolist() == (b["env_id"] % S).tolist()
    got = rb.sample_by_index(list(range(6)))
    by_id = dict(zip(got["index"].tolist(), got["uid"].tolist(), strict=True))
    assert [by_id[i] for i in ids.tolist()] == list(range(6))


def test_state_dict_round_trips_between_two_shard_buffers(make: Any, tmp_path: Path) -> None:
    rb, _ = written(make, [4, 3, 5])
    rb.sample(5)
    rb.update([1], {"reward": torch.tensor([-9.0])})
    torch.save(rb.state_dict(), tmp_path / "s.pt")
    other, _ = written(make, [2], seed=7)
    other.load_state_dict(torch.load(tmp_path / "s.pt", weights_only=True))
    assert rb.sample_all().to_dict().keys() == other.sample_all().to_dict().keys()
    assert torch.equal(rb.sample_all()["reward"], other.sample_all()["reward"])
    assert torch.equal(rb.sample(16)["index"], other.sample(16)["index"])
    assert rb.extend(batch(50, 2)) == other.extend(batch(50, 2))


def test_a_refused_state_leaves_every_shard_as_it_was(make: Any) -> None:
    rb, _ = written(make, [4, 3])
    other, _ = written(make, [2, 2])
    before = other.sample_all().to_dict()
    state = rb.state_dict()
    state["shards"][1]["ring"]["capacity"] = 99  # shard 0 loads, shard 1 refuses
    with pytest.raises(CapacityError, match=re.escape("state is of a buffer of capacity 99, this one has 5")):
        other.load_state_dict(state)
    after = other.sample_all().to_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    one = ReplayBuffer(CAP)
    one.extend(batch(0, 2))
    with pytest.raises(CapacityError, match=re.escape("state is of a buffer of 1 shard(s), this one has 2")):
        other.load_state_dict(one.state_dict())


def test_two_shards_follow_the_reference_under_random_writes_updates_and_clears(
    ray_pool: Any, tmp_path: Path
) -> None:
    """A hypothesis state machine: extends (round robin over the shards), updates of live,
    overwritten and unwritten ids, clears; after each step the whole content and the ids
    equal the reference's."""
    from hypothesis import settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

    from xpbank import XpbankError

    built = iter(range(10**6))

    class Machine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            shards = ray_pool.take(S, first=0)
            self.rb = RayReplayBuffer(
                S, CAP, flush_bytes=0, shards=shards, seed=0, checkpoint_dir=tmp_path / f"m{next(built)}"
            )
            self.ref = Reference()
            self.uid = 0
            self.issued: list[int] = []
            self.extended = False  # an extend, even of 0 rows, sets the spec: then ids are checked

        @rule(n=st.integers(0, 7))
        def extend(self, n: int) -> None:
            b = batch(self.uid, n)
            self.extended = True
            got = self.rb.extend(b)
            want = self.ref.extend(b) if n else range(0)
            assert list(got) == list(want)
            self.issued += list(want)
            self.uid += n

        @rule(data=st.data(), value=st.floats(-100, 100, width=32))
        def update(self, data: st.DataObject, value: float) -> None:
            pool = [*self.issued, max(self.issued, default=0) + S]  # one never issued
            pick = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=4))
            live = set(self.ref.all()[0])
            if all(i in live for i in pick):
                self.rb.update(pick, {"reward": torch.full((len(pick),), value)})
                for i in pick:
                    self.ref.shards[i % S].update([i // S], {"reward": torch.tensor([value])})
            else:
                why = "indices: item" if self.extended else "the buffer is empty"
                with pytest.raises(XpbankError, match=why):
                    self.rb.update(pick, {"reward": torch.full((len(pick),), value)})

        @rule()
        def clear(self) -> None:
            self.rb.clear()
            for r in self.ref.shards:
                r.clear()

        @invariant()
        def same_content(self) -> None:
            ids, uids = self.ref.all()
            assert len(self.rb) == len(ids)
            if ids:
                everything = self.rb.sample_all()
                assert everything["index"].tolist() == ids
                assert everything["uid"].tolist() == uids
                want = torch.cat([r.sample_all()["reward"] for r in self.ref.shards if len(r)])
                assert torch.equal(everything["reward"], want)

    run_state_machine_as_test(
        Machine, settings=settings(max_examples=12, stateful_step_count=10, deadline=None, database=None)
    )


def _between_round_trips(rb: Any, action: Callable[[], Any], times: int = 1) -> list[int]:
    """Run ``action`` right after the next ``times`` size polls (between the sizes and
    the reads); returns a list that counts the polls."""
    polls: list[int] = []
    stats = rb._stats

    def hooked() -> dict[int, dict[str, Any]]:
        answer = stats()
        polls.append(1)
        if len(polls) <= times:
            action()
        return answer

    rb._stats = hooked
    return polls


@pytest.mark.parametrize("method", ["sample_all", "sample_by_index"])
@pytest.mark.parametrize("change", ["extend", "clear"])
def test_sample_all_and_by_index_never_mix_a_write_or_clear_between_the_round_trips(
    make: Any, change: str, method: str
) -> None:
    """A write or clear between the size poll and the read: the read is of one state,
    taken again (before: shard rows of two states, or an XpbankIndexError after a clear)."""
    rb, _ = written(make, [3, 2])

    def act() -> None:
        if change == "clear":
            rb.clear()
            rb.extend(batch(100, 4))  # one shard now holds 4 fresh items, the other none
        else:
            rb.extend(batch(100, 1))

    polls = _between_round_trips(rb, act)
    got = rb.sample_all() if method == "sample_all" else rb.sample_by_index([0, 1, 2, -1])
    assert len(polls) == 2  # taken again once
    uids = rb.sample_all()["uid"].tolist()
    assert got["uid"].tolist() == (uids if method == "sample_all" else [uids[p] for p in (0, 1, 2, -1)])
    assert torch.equal(got["obs"][:, 0], got["uid"].float())


def test_a_shard_changing_every_time_raises_a_stale_error_naming_it(make: Any) -> None:
    rb, _ = written(make, [3, 2])
    _between_round_trips(rb, lambda: rb.extend(batch(50, 2)), times=TRIES)
    with pytest.raises(StaleIndexError, match=r"sample_all: shard [01] was written or cleared between"):
        rb.sample_all()
    assert len(rb) == CAP  # the writes themselves all landed


def test_an_epoch_minibatch_raises_on_a_write_between_its_size_check_and_read(make: Any) -> None:
    rb, _ = written(make, [3, 2])
    it = rb.epochs(5, shuffle=False)
    _between_round_trips(rb, lambda: rb.extend(batch(100, 1)))
    with pytest.raises(BufferChangedError, match="extended or cleared during iteration"):
        next(it)


def test_an_item_overwritten_between_the_check_and_the_write_is_dropped_not_half_written(
    make: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A multi-shard update takes effect at its check round: a writer overwriting one
    shard's items before the write round leaves no shard half-updated and raises nothing
    (the old write round raised StaleIndexError after the other shard had written)."""
    rb, _ = written(make, [5, 5])  # shard 0: uids 0..4, shard 1: uids 5..9 (full)
    ids, uids = rb.sample_all()["index"].tolist(), rb.sample_all()["uid"].tolist()
    pick = [ids[uids.index(2)], ids[uids.index(7)]]  # one item on each shard
    call_each = rb._link.call_each

    def racing(calls: dict[int, Any]) -> dict[int, Any]:
        answers = call_each(calls)
        if any(m in ("check_update", "check_ids") for m, _ in calls.values()):  # then a writer's turn
            call_each({1: ("extend", (batch(100, 5),))})  # overwrites every item of shard 1
        return answers

    monkeypatch.setattr(rb._link, "call_each", racing)
    rb.update(pick, {"reward": torch.tensor([-1.0, -2.0])})
    monkeypatch.undo()
    got = rb.sample_all()
    reward = dict(zip(got["uid"].tolist(), got["reward"].tolist(), strict=True))
    assert reward[2] == -1.0  # shard 0's item: updated
    assert [reward[u] for u in range(100, 105)] == [float(u) for u in range(100, 105)]  # as written
    assert sorted(reward) == [0, 1, 2, 3, 4, 100, 101, 102, 103, 104]


def test_an_episode_end_refused_on_one_shard_writes_nothing_on_any(make: Any) -> None:
    """Shards keep an episode index (items carry ``env_id``): an update changing one
    item's ``terminated`` is refused by its shard in the check round, before the other
    shard writes its rows (the old code wrote shard 0's rows, then raised)."""
    rb = make()
    env = torch.tensor([0, 1, 0, 1, 0, 1])
    rb.extend({"env_id": env, "terminated": torch.zeros(6, dtype=torch.bool), "reward": torch.arange(6.0)})
    before = rb.sample_all()
    index, envs = before["index"].tolist(), before["env_id"].tolist()
    pick = [index[envs.index(0)], index[envs.index(1)]]
    assert {i % S for i in pick} == {0, 1}, "the two items are on two shards"
    with pytest.raises(
        SpecError, match=r"shard \d: update: field 'terminated' of item .* nothing was updated"
    ):
        rb.update(pick, {"reward": torch.tensor([-1.0, -2.0]), "terminated": torch.tensor([False, True])})
    assert torch.equal(rb.sample_all()["reward"], before["reward"])
    rb.update(pick, {"reward": torch.tensor([-1.0, -2.0]), "terminated": torch.tensor([False, False])})
    assert sorted(rb.sample_all()["reward"].tolist())[:2] == [-2.0, -1.0]  # flags repeated: accepted
