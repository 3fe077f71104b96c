"""A FrameStorage step through one compiled call (replay/frame_kernel.py) stores what the
general path does: one random stream into two buffers, one with the write fast path off
(``rb._fast_write = False``); after every write both hold the same bytes for every live
item, the same frame table, side stores and episode index, and sample the same batches.
Streams with terminations and truncations (one env's among many), ring wraps, stacks
reaching overwritten frames, both paddings, whole observations, two-byte frames, an
episode cut from outside (``truncate_newest``), side stores grown mid-stream. Bad steps
(each frame rule broken by one bit) get the general path's error with nothing written;
a step the kernel cannot read (unaligned) takes the two-kernel path."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from test_fast_frames import _index, _np_step
from test_frames import StackedEnvs, _assert_same, _record
from test_frames_step import _assert_same_bytes
from xpbank import FrameStorage, PrioritizedSampler, ReplayBuffer, SpecError
from xpbank.replay import fast_frames, frame_kernel

pytestmark = pytest.mark.skipif(frame_kernel._kernel is None, reason="numba is not installed")


def _counted(monkeypatch) -> list:
    """The answers of the fused step (True: written, False: a check failed, None: declined)."""
    answers: list = []
    fused = fast_frames.FrameSignature._fused

    def counted(self, rb, *args):
        done = fused(self, rb, *args)
        answers.append(done)
        return done

    monkeypatch.setattr(fast_frames.FrameSignature, "_fused", counted)
    return answers


def _pair(capacity: int, num_envs: int, sampler=None, **kw) -> tuple[ReplayBuffer, ReplayBuffer]:
    fast, slow = (
        ReplayBuffer(
            capacity, storage=FrameStorage(capacity, **kw), num_envs=num_envs, seed=7,
            sampler=None if sampler is None else sampler(),
        )
        for _ in range(2)
    )  # fmt: skip
    slow._fast_write = False
    return fast, slow


def _widen(batch: dict, dtype: type) -> dict:
    if dtype is np.uint8:
        return batch
    return {k: v.astype(dtype) * 257 if k in ("obs", ("next", "obs")) else v for k, v in batch.items()}


@pytest.mark.parametrize(
    "capacity,num_envs,stack,pad,stacked,dtype,frame,sampler",
    [
        (80, 8, 4, "repeat", True, np.uint8, (4, 8), None),  # lockstep layout, wraps every 10 steps
        (40, 4, 4, "repeat", True, np.uint8, (4, 8), PrioritizedSampler),  # the sampler's on_write
        (84, 8, 4, "zero", True, np.uint8, (4, 8), None),  # capacity not a multiple of the envs
        (48, 8, 3, "repeat", True, np.int16, (2, 4), None),  # two-byte frames
        (24, 8, 1, "zero", False, np.uint8, (4, 8), None),  # whole observations
        (24, 1, 4, "repeat", False, np.uint8, (4, 6, 8), None),  # the SB3 adapter's one env (stack in obs)
        (20, 1, 4, "zero", True, np.uint8, (8, 8), None),  # one env, stacked
    ],
)
def test_one_call_step_stores_and_samples_what_the_general_path_does(
    capacity, num_envs, stack, pad, stacked, dtype, frame, sampler, monkeypatch
):
    answers = _counted(monkeypatch)
    fast, slow = _pair(capacity, num_envs, sampler, pad=pad, stacked=stacked)
    envs = StackedEnvs(num_envs, stack, seed=capacity + stack, pad=pad, lengths=(1, 9), frame=frame)
    ref: dict = {}
    for t in range(120):
        batch = _widen(_np_step(envs, num_envs, stacked), dtype)
        ids = fast.extend(batch)
        assert slow.extend(batch) == ids
        _record(ref, ids, {k: torch.as_tensor(v) for k, v in batch.items()})
        _assert_same_bytes(fast, slow)
        assert _index(fast) == _index(slow)
        if stacked:
            _assert_same(ref, fast.sample_by_index(list(range(len(fast)))))
        if t == 60:  # an episode cut from outside (SB3's dones[pos - 1] between learn() calls)
            assert fast.episodes.truncate_newest().tolist() == slow.episodes.truncate_newest().tolist()
            envs.state = [envs._reset() for _ in range(num_envs)]
    a, b = fast.sample(16), slow.sample(16)
    for key in a.keys(True, True):
        assert a[key].numpy().tobytes() == b[key].numpy().tobytes(), key
    assert fast._ring.next_id > 4 * capacity  # wrapped several times
    assert answers.count(True) > 80 and False not in answers  # the one call wrote most steps
    for name in ("_last", "_stacks"):  # grown by the same rule
        assert getattr(fast.storage, name).data.shape == getattr(slow.storage, name).data.shape


@pytest.mark.parametrize("stacked", [True, False])
@pytest.mark.parametrize("pad", ["repeat", "zero"])
def test_a_step_breaking_a_frame_rule_gets_the_general_error_with_nothing_written(stacked, pad, monkeypatch):
    answers = _counted(monkeypatch)
    envs = StackedEnvs(4, 4, seed=3, pad=pad, lengths=(2, 5), frame=(4, 8))
    fast, slow = _pair(40, 4, pad=pad, stacked=stacked)
    rng = np.random.default_rng(0)
    refused = 0
    for _ in range(3):
        good = _np_step(envs, 4, stacked)
        assert fast.extend(good) == slow.extend(good)
    for _ in range(80):
        good = _np_step(envs, 4, stacked)
        # one bit flipped in the observation of an env that goes on (every frame of it is
        # checked), or in a next observation's older frames (they must be its obs shifted)
        bad = {k: v.copy() for k, v in good.items()}
        going_on = np.flatnonzero(~slow.episodes._fresh)
        on_obs = going_on.size > 0 and (not stacked or rng.random() < 0.5)
        if not on_obs and not stacked:
            assert fast.extend(good) == slow.extend(good)
            continue
        key = "obs" if on_obs else ("next", "obs")
        part = bad[key][int(rng.choice(going_on) if on_obs else rng.integers(4))]
        flat = (part if key == "obs" else part[:-1]).reshape(-1)
        flat[rng.integers(flat.size)] ^= np.uint8(1 << int(rng.integers(8)))
        st = fast.storage
        before = (fast.sample_all(), st._frames.clone(), st._frame_table().src.copy(), _index(fast))
        seen = len(answers)
        with pytest.raises(SpecError) as slow_error:
            slow.extend(bad)
        try:
            fast.extend(bad)
        except SpecError as e:
            assert str(e) == str(slow_error.value) and "Nothing was written" in str(e)
            refused += 1
        after = (fast.sample_all(), st._frames, st._frame_table().src, _index(fast))
        assert (after[0] == before[0]).all() and torch.equal(after[1], before[1])
        assert np.array_equal(after[2], before[2]) and after[3] == before[3]
        assert answers[seen:] in ([], [False])  # refused by the one call, or not tried
        assert fast.extend(good) == slow.extend(good)
        _assert_same_bytes(fast, slow)
    assert refused > 60 and answers.count(False) > 50 and answers.count(True) > 50


def test_unaligned_steps_and_unverified_writes_store_the_same(monkeypatch):
    answers = _counted(monkeypatch)
    envs = StackedEnvs(4, 4, seed=9, lengths=(1, 7), frame=(4, 8))
    fast, slow = _pair(40, 4)
    trusting = ReplayBuffer(40, storage=FrameStorage(40, verify=False), num_envs=4, seed=7)
    for t in range(60):
        batch = _np_step(envs, 4, True)
        if t % 3 == 0:  # at an odd address: the kernel declines, the two-kernel path writes it
            odd = np.empty(batch["obs"].nbytes + 1, np.uint8)[1:].reshape(batch["obs"].shape)
            odd[...] = batch["obs"]
            batch["obs"] = odd
        ids = fast.extend(batch)
        assert slow.extend(batch) == ids == trusting.extend(batch)
        _assert_same_bytes(fast, slow)
        _assert_same_bytes(trusting, slow)
    assert None in answers and answers.count(True) > 30
    copy = pickle.loads(pickle.dumps(fast))  # a pickled buffer: new views, then a new context
    for _ in range(20):
        batch = _np_step(envs, 4, True)
        assert fast.extend(batch) == copy.extend(batch) == slow.extend(batch)
        _assert_same_bytes(copy, slow)
        _assert_same_bytes(fast, slow)
    assert answers.count(True) > 60


def _assert_same_live(a: ReplayBuffer, b: ReplayBuffer) -> None:
    """:func:`_assert_same_bytes` without its check that dead slots hold nothing aside
    (a cleared buffer's side stores keep the entries of slots it no longer holds until
    they are written again, on either path)."""
    x, y = a.sample_by_index(list(range(len(a)))), b.sample_by_index(list(range(len(b))))
    for key in x.keys(True, True):
        assert x[key].numpy().tobytes() == y[key].numpy().tobytes(), key
    slots = np.sort(np.arange(a._ring.first_id, a._ring.next_id) % a.capacity)
    np.testing.assert_array_equal(a.storage._frame_table().src[slots], b.storage._frame_table().src[slots])
    for name in ("_last", "_stacks"):
        pa, pb = getattr(a.storage, name), getattr(b.storage, name)
        has = slots[pa.has(slots)]
        np.testing.assert_array_equal(has, slots[pb.has(slots)])
        assert pa.get(has).numpy().tobytes() == pb.get(has).numpy().tobytes(), name


def test_a_cleared_or_loaded_buffer_goes_on_through_new_contexts(monkeypatch):
    """clear() gives the side stores new free lists and a state load marks the frame table
    stale: the one call then reads the storage through a context made anew."""
    answers = _counted(monkeypatch)
    envs = StackedEnvs(4, 4, seed=11, lengths=(2, 9), frame=(4, 8))
    fast, slow = _pair(40, 4)
    for t in range(75):
        if t == 25:  # every env starts over after a clear
            fast.clear()
            slow.clear()
            envs.state = [envs._reset() for _ in range(4)]
        if t == 50:  # the same state into the buffer that wrote it
            fast.load_state_dict(slow.state_dict())
        batch = _np_step(envs, 4, True)
        assert fast.extend(batch) == slow.extend(batch)
        _assert_same_live(fast, slow)
        assert _index(fast) == _index(slow)
    assert answers.count(True) > 55
