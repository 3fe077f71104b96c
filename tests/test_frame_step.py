"""FrameStorage's compiled lockstep-step write (storage/frame_step.py) leaves what the
NumPy write (``frame_write.FrameWrite``) leaves: the same stream goes into two buffers,
one with the compiled write switched off, and after every write both return the same
bytes for every live item, hold the same frame table and side stores (grown to the same
sizes), and match the transitions as written; on frames of several dtypes and word
widths (an unaligned step: one-byte words), both paddings, ring wraps and episode ends."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from test_frames import StackedEnvs, _assert_same, _record
from test_frames_step import _assert_same_bytes
from xpbank import FrameStorage, ReplayBuffer
from xpbank.storage import frame_step, frame_write, frames
from xpbank.storage.frame_pool import SlotPool

pytestmark = pytest.mark.skipif(not frame_step.compiled_write(), reason="numba is not installed")


def _unaligned(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes at an odd address (C-contiguous, same values)."""
    raw = torch.empty(t.numel() * t.element_size() + 1, dtype=torch.uint8)
    out = raw[1:].view(t.dtype).view(t.shape) if t.element_size() == 1 else None
    if out is None:  # a wider dtype cannot be viewed at an odd address: copied as it is
        return t.clone()
    out.copy_(t)
    return out


@pytest.mark.parametrize(
    "capacity,num_envs,stack,pad,stacked,dtype,unaligned",
    [
        (80, 8, 4, "repeat", True, torch.uint8, False),  # lockstep layout, wraps every 10 steps
        (84, 8, 4, "zero", True, torch.uint8, False),  # capacity not a multiple of the envs
        (48, 8, 3, "repeat", True, torch.int16, False),  # two-byte frames, 2 steps beyond a stack
        (40, 4, 4, "repeat", True, torch.uint8, True),  # the step at an odd address: byte words
        (36, 4, 2, "zero", True, torch.float32, False),  # float frames: NumPy's check, compiled write
        (24, 8, 1, "repeat", False, torch.uint8, False),  # whole observations (the SB3 adapter's)
        (20, 1, 4, "repeat", True, torch.uint8, False),  # one env
    ],
)
def test_compiled_write_stores_what_the_numpy_write_does(
    capacity, num_envs, stack, pad, stacked, dtype, unaligned, monkeypatch
):
    applied: list[bool] = []
    apply = frame_step.apply_step

    def counted(st, todo):
        done = apply(st, todo)
        applied.append(done)
        return done

    monkeypatch.setattr(frames, "apply_step", counted)
    fast = ReplayBuffer(capacity, storage=FrameStorage(capacity, pad=pad, stacked=stacked), num_envs=num_envs)
    slow = ReplayBuffer(capacity, storage=FrameStorage(capacity, pad=pad, stacked=stacked), num_envs=num_envs)
    envs = StackedEnvs(num_envs, stack, seed=capacity + stack, pad=pad, lengths=(1, 9))
    ref: dict = {}
    rng = np.random.default_rng(1)
    for t in range(90):
        k = 1 if t % 7 else int(rng.integers(2, 4))  # mostly single steps, some multi-step writes
        parts = [envs.step(range(num_envs)) for _ in range(k)]
        batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
        for key in ("obs", ("next", "obs")):
            value = batch[key] if stacked else batch[key][:, -1].contiguous()
            value = value.to(dtype) * 257 if dtype == torch.int16 else value.to(dtype)
            batch[key] = _unaligned(value) if unaligned else value
        monkeypatch.setattr(frame_write, "compiled_write", lambda: True)
        ids = fast.extend(batch)
        monkeypatch.setattr(frame_write, "compiled_write", lambda: False)
        assert slow.extend(batch) == ids
        _record(ref, ids, batch)
        _assert_same_bytes(fast, slow)
        _assert_same(ref, fast.sample_by_index(list(range(len(fast)))))
        for name in ("_last", "_stacks"):  # grown by the same rule
            a, b = getattr(fast.storage, name), getattr(slow.storage, name)
            assert a.data.shape == b.data.shape and len(a) == len(b), name
    assert fast._ring.next_id > 4 * capacity  # wrapped several times
    assert sum(applied) > 50 and all(applied)  # the compiled write wrote most steps
    if stack > 1 and num_envs > 1:
        assert len(fast.storage._stacks) > 0  # stacks were kept aside as the ring wrapped


def test_a_refused_step_changes_nothing_the_compiled_write_keeps() -> None:
    envs = StackedEnvs(4, 4, seed=7, lengths=(20, 30))
    rb = ReplayBuffer(40, storage=FrameStorage(40), num_envs=4, seed=0)
    for _ in range(15):  # past the first wrap: stacks kept aside, compiled writes
        rb.extend(envs.step(range(4)))
    st = rb.storage
    before = (
        rb.sample_all(),
        st._frames.clone(),
        st._frame_table().src.copy(),
        len(st._last),
        len(st._stacks),
    )
    good = envs.step(range(4))
    bad = {k: v.clone() for k, v in good.items()}
    bad["obs"][3, 0] += 1  # env 3's oldest frame is not its previous next observation's
    bad[("next", "obs")][3, 0] -= 1
    with pytest.raises(ValueError, match="item 3 of the batch"):
        rb.extend(bad)
    assert (rb.sample_all() == before[0]).all()
    assert torch.equal(st._frames, before[1]) and np.array_equal(st._frame_table().src, before[2])
    assert (len(st._last), len(st._stacks)) == before[3:]
    rb.extend(good)


def test_slot_pool_free_list_hands_out_each_entry_once() -> None:
    pool = SlotPool(50, (2,), torch.int32)
    rng = np.random.default_rng(0)
    held: dict[int, int] = {}
    for step in range(200):
        slots = rng.choice(50, int(rng.integers(1, 6)), replace=False)
        if rng.random() < 0.5:
            pool.put(slots, torch.full((slots.size, 2), step, dtype=torch.int32))
            held.update(dict.fromkeys(slots.tolist(), step))
        else:
            pool.drop(slots)
            for s in slots.tolist():
                held.pop(s, None)
        live = pool.index[pool.index >= 0]
        assert len(pool) == len(held) == live.size == np.unique(live).size  # no entry given twice
        assert not np.isin(pool.free[: pool.nfree], live).any()  # and none both free and held
        keys = np.array(sorted(held), dtype=np.int64)
        assert pool.get(keys)[:, 0].tolist() == [held[k] for k in keys.tolist()]


@pytest.mark.parametrize("num_envs,capacity", [(4, 40), (4, 42), (1, 12)])  # lockstep layout, slots, one env
def test_a_pickled_buffer_goes_on_storing_and_returning_the_same(num_envs, capacity) -> None:
    """A pickle (SB3's ``save_replay_buffer``) carries no NumPy view of the frames or the
    side stores: the copy's writes land where its reads look."""
    envs = StackedEnvs(num_envs, 4, seed=num_envs + capacity, lengths=(3, 9))
    rb = ReplayBuffer(capacity, storage=FrameStorage(capacity), num_envs=num_envs, seed=0)
    ref: dict = {}
    for _ in range(30):  # past a wrap: stacks and next frames kept aside
        step = envs.step(range(num_envs))
        _record(ref, rb.extend(step), step)
    copy = pickle.loads(pickle.dumps(rb))
    for _ in range(30):
        step = envs.step(range(num_envs))
        ids = rb.extend(step)
        assert copy.extend(step) == ids
        _record(ref, ids, step)
    _assert_same_bytes(rb, copy)
    _assert_same(ref, copy.sample_all())
