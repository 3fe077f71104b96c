"""FrameStorage's table of frame positions (storage/frame_table.py): what it says is
checked against every transition kept in a dict, and against a rebuild from the episode
index; the per-env frame layout is a bijection that keeps each env's frames together."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from test_frames import RANDOM_RUNS, StackedEnvs, _assert_same, _check_everything, _fill, _record
from xpbank import FrameStorage, ReplayBuffer
from xpbank.storage.frame_table import FrameTable, walk_stacks


def _table_matches_reference(rb: ReplayBuffer, ref: dict) -> None:
    """Every live item's row, read straight from the frame array, is what went in."""
    storage = rb.storage
    table = storage._frame_table()
    frames = storage._frames
    ring = rb._ring
    s = storage.stack
    for i in range(ring.first_id, ring.next_id):
        row = table.src[i % ring.capacity]
        obs = ref[i]["obs"] if storage.stacked else ref[i]["obs"].unsqueeze(0)
        nxt = ref[i]["next", "obs"] if storage.stacked else ref[i]["next", "obs"].unsqueeze(0)
        kept = bool(storage._stacks.has(np.array([i % ring.capacity]))[0])
        assert (row[0] < 0) == kept  # marked exactly where the stack is kept aside
        if not kept:
            assert torch.equal(frames[torch.from_numpy(row[:s])], obs), i
        if row[s] >= 0:
            assert torch.equal(frames[int(row[s])], nxt[-1]), i
        else:  # the next frame is kept aside: an episode end or the env's newest item
            assert torch.equal(storage._last.get(np.array([i % ring.capacity]))[0], nxt[-1]), i


@settings(max_examples=30, deadline=None)
@given(**RANDOM_RUNS, pad=st.sampled_from(["repeat", "zero"]))
def test_table_kept_at_write_time_is_what_went_in_and_what_a_rebuild_gives(
    capacity: int, num_envs: int, stack: int, seed: int, env_field: bool, pad: str
) -> None:
    envs = StackedEnvs(num_envs, stack, seed=seed, pad=pad, lengths=(1, 6))
    rb = ReplayBuffer(
        capacity, storage=FrameStorage(capacity, pad=pad), num_envs=None if env_field else num_envs
    )
    ref = _fill(rb, envs, 25, env_field, seed=seed, check=False)
    table = rb.storage._frame_table()
    lockstep_layout = not env_field and num_envs > 1 and capacity % num_envs == 0
    assert table.envs == (num_envs if lockstep_layout else 1)
    _table_matches_reference(rb, ref)
    live = np.arange(rb._ring.first_id, rb._ring.next_id) % capacity
    kept_at_write = table.src[live].copy()
    table.stale = True  # what a state load does: rebuilt from the episode index
    rebuilt = rb.storage._frame_table().src[live]
    usable = kept_at_write[:, 0] >= 0  # a kept stack's other columns are never read
    assert np.array_equal(kept_at_write[:, 0] < 0, rebuilt[:, 0] < 0)
    assert np.array_equal(kept_at_write[usable], rebuilt[usable])
    assert np.array_equal(kept_at_write[:, -1], rebuilt[:, -1])


@pytest.mark.parametrize("pad", ["repeat", "zero"])
def test_per_env_layout_round_trips_over_wraps_and_a_state_load(pad: str) -> None:
    envs = StackedEnvs(3, 4, seed=7, pad=pad)
    rb = ReplayBuffer(36, storage=FrameStorage(36, pad=pad), num_envs=3, seed=0)
    ref = _fill(rb, envs, 60, False, seed=3)
    assert rb._ring.next_id > 3 * 36 and rb.storage._frame_table().envs == 3
    _check_everything(rb, ref)
    _table_matches_reference(rb, ref)
    state = rb.state_dict()
    ring = rb._ring
    for slot in range(36):  # the saved frames are in slot order, whatever the layout
        item = ring.ids_of_slots(torch.tensor([slot])).item()
        assert torch.equal(state["storage"]["frames"][slot], ref[item]["obs"][-1])
    clone = ReplayBuffer(36, storage=FrameStorage(36, pad=pad), num_envs=3, seed=0)
    clone.load_state_dict(state)
    _check_everything(clone, ref)
    more = envs.step(range(3))
    for buffer in (rb, clone):
        _record(ref, buffer.extend(more), more)
        _check_everything(buffer, ref)
        _table_matches_reference(buffer, ref)


def test_sampled_obs_and_next_obs_are_separate_fresh_memory() -> None:
    """Normalizing a sampled ``obs`` in place changes neither its ``next obs`` (the same
    frames, shifted) nor what is stored."""
    envs = StackedEnvs(2, 4, seed=1, lengths=(20, 30))
    rb = ReplayBuffer(40, storage=FrameStorage(40), num_envs=2, seed=0)
    ref = _fill(rb, envs, 30, False, seed=0, check=False)
    batch = rb.sample(16)
    before = batch["next", "obs"].clone()
    batch["obs"].zero_()
    assert torch.equal(batch["next", "obs"], before)
    _assert_same(ref, rb.sample_by_index(list(range(len(rb)))))


def test_positions_are_a_bijection_that_keeps_each_env_together() -> None:
    table = FrameTable(capacity=12, stack=2, envs=3, zero_pad=False)
    pos = table.positions(np.arange(12))
    assert sorted(pos.tolist()) == list(range(12))
    for e in range(3):  # env e's slots e, e + 3, ... sit side by side, in time order
        assert pos[e::3].tolist() == list(range(4 * e, 4 * e + 4))
    assert table.run(3, 9) == (1, 2) and table.run(4, 9) is None
    assert FrameTable(capacity=10, stack=2, envs=3, zero_pad=False).envs == 1  # 3 does not divide 10


def test_walk_stacks_against_a_step_by_step_walk() -> None:
    rng = np.random.default_rng(0)
    n, stack = 60, 4
    start = np.zeros(n, dtype=np.int64)
    for i in range(1, n):  # one stream, episodes starting at random items
        start[i] = i if rng.random() < 0.2 else start[i - 1]
    ids = np.arange(n)
    got, pad = walk_stacks(ids, stack, lambda x: x - 1, lambda x: start[x], floor=10)
    for i in range(n):
        want, cur, padded = [], i, False
        for _ in range(stack):
            want.append(cur)
            padded = padded or start[cur] == cur
            if not padded and cur >= 10:
                cur -= 1
        assert got[i].tolist() == want[::-1], i
        pads = [start[w] == w for w in want[:-1]]
        assert pad[i, :-1].tolist()[::-1] == list(np.logical_or.accumulate(pads)), i


def test_clear_then_refill_with_the_per_env_layout() -> None:
    """After ``clear`` the ring restarts at slot 0: stale side-store entries and table
    marks of the old items must never show through."""
    rb = ReplayBuffer(36, storage=FrameStorage(36), num_envs=3, seed=0)
    _fill(rb, StackedEnvs(3, 4, seed=2), 40, False, seed=1, check=False)
    assert len(rb.storage._stacks) and len(rb.storage._last)
    rb.clear()
    envs = StackedEnvs(3, 4, seed=3)
    ref = _fill(rb, envs, 9, False, seed=4, check=False)  # partly refilled ...
    _table_matches_reference(rb, ref)
    ref.update(_fill(rb, envs, 40, False, seed=6, check=False))  # ... and wrapped again
    _check_everything(rb, ref)
    _table_matches_reference(rb, ref)
    rb.clear()
    ref = _fill(rb, StackedEnvs(3, 4, seed=7), 30, False, seed=8)
    _check_everything(rb, ref)
    _table_matches_reference(rb, ref)


def test_observations_without_a_next_field() -> None:
    envs = StackedEnvs(3, 4, seed=9)
    rb = ReplayBuffer(36, storage=FrameStorage(36, next_obs=None), num_envs=3, seed=0)
    ref: dict = {}
    for _ in range(40):
        batch = envs.step(range(3))
        del batch["next", "obs"]
        _record(ref, rb.extend(batch), batch)
    got = rb.sample_all()
    want = torch.stack([ref[i]["obs"] for i in got["index"].tolist()])
    assert torch.equal(got["obs"], want) and ("next", "obs") not in got.keys(include_nested=True)
