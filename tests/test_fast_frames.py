"""The FrameStorage write fast path (replay/fast_frames.py) stores what the general path
does: the same stream of NumPy steps goes into two buffers, one with the fast path off
(``rb._fast_write = False``), and after every write both hold the same bytes for every
live item, the same frame table and side stores, the same episode index; stacked and
whole observations (the SB3 adapter's layout), ring wraps and episode ends. A bad step
gets the general path's error with nothing written."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from test_frames import StackedEnvs, _assert_same, _record
from test_frames_step import _assert_same_bytes
from xpbank import FrameStorage, ReplayBuffer
from xpbank.replay import fast_frames
from xpbank.storage import frame_step

pytestmark = pytest.mark.skipif(not frame_step.compiled_write(), reason="numba is not installed")


def _np_step(envs: StackedEnvs, n: int, stacked: bool, tensors: bool = False) -> dict:
    step = envs.step(range(n))
    out = {k: v.numpy() for k, v in step.items()}
    if not stacked:
        for key in ("obs", ("next", "obs")):
            out[key] = np.ascontiguousarray(out[key][:, -1])
    return {k: torch.from_numpy(v) for k, v in out.items()} if tensors else out


def _index(rb: ReplayBuffer) -> tuple:
    ids = list(range(rb._ring.next_id - len(rb), rb._ring.next_id))
    eps = rb.episodes
    return (eps.episode_start(ids).tolist(), eps.predecessors(ids).tolist(), eps.successors(ids).tolist())


@pytest.mark.parametrize(
    "capacity,num_envs,stack,pad,stacked,tensors",
    [
        (80, 8, 4, "repeat", True, False),  # lockstep layout, wraps every 10 steps
        (84, 8, 4, "zero", True, False),  # capacity not a multiple of the envs: wraps split (general path)
        (48, 8, 1, "repeat", False, False),  # whole observations (the SB3 adapter's layout)
        (20, 1, 4, "repeat", True, False),  # one env
        (80, 8, 4, "repeat", True, True),  # CPU tensors, read as NumPy views
        (48, 8, 1, "zero", False, True),
    ],
)
def test_fast_path_stores_what_the_general_path_does(
    capacity, num_envs, stack, pad, stacked, tensors, monkeypatch
):
    taken: list[bool] = []
    write = fast_frames.FrameSignature.write

    def counted(self, rb, batch):
        first = write(self, rb, batch)
        taken.append(first is not None)
        return first

    monkeypatch.setattr(fast_frames.FrameSignature, "write", counted)
    fast = ReplayBuffer(capacity, storage=FrameStorage(capacity, pad=pad, stacked=stacked), num_envs=num_envs)
    slow = ReplayBuffer(capacity, storage=FrameStorage(capacity, pad=pad, stacked=stacked), num_envs=num_envs)
    slow._fast_write = False
    envs = StackedEnvs(num_envs, stack, seed=capacity + stack, pad=pad, lengths=(1, 9))
    ref: dict = {}
    for _ in range(90):
        batch = _np_step(envs, num_envs, stacked, tensors)
        ids = fast.extend(batch)
        assert slow.extend(batch) == ids
        _record(ref, ids, {k: torch.as_tensor(v) for k, v in batch.items()})
        _assert_same_bytes(fast, slow)
        assert _index(fast) == _index(slow)
        if stacked:
            _assert_same(ref, fast.sample_by_index(list(range(len(fast)))))
    assert fast._ring.next_id > 4 * capacity  # wrapped several times
    assert sum(taken) > 60  # the fast path wrote most steps
    assert "_signature" not in slow.__dict__


@pytest.mark.parametrize("stacked", [True, False])
def test_a_bad_step_gets_the_general_error_with_nothing_written(stacked) -> None:
    envs = StackedEnvs(4, 4, seed=3, lengths=(20, 30))
    rb = ReplayBuffer(40, storage=FrameStorage(40, stacked=stacked), num_envs=4, seed=0)
    for _ in range(15):  # past the first wrap, through the fast path
        rb.extend(_np_step(envs, 4, stacked))
    assert type(rb.__dict__["_signature"]) is fast_frames.FrameSignature
    st = rb.storage
    before = (rb.sample_all(), st._frames.clone(), st._frame_table().src.copy(), rb._ring.next_id, _index(rb))
    good = _np_step(envs, 4, stacked)
    bad = {k: v.copy() for k, v in good.items()}
    bad["obs"][3] ^= 1  # env 3's observation is not its previous next observation
    with pytest.raises(ValueError, match="item 3 of the batch"):
        rb.extend(bad)
    wrong = dict(good, reward=good["reward"].astype(np.float64)[:3])  # a bad shape: the spec's error
    with pytest.raises(ValueError, match="reward"):
        rb.extend(wrong)
    grad = torch.from_numpy(good["reward"][:3]).requires_grad_(True)  # no NumPy view: the full path's
    with pytest.raises(ValueError, match="reward"):
        rb.extend(dict(good, reward=grad))
    after = (rb.sample_all(), st._frames, st._frame_table().src, rb._ring.next_id, _index(rb))
    assert (after[0] == before[0]).all() and torch.equal(after[1], before[1])
    assert np.array_equal(after[2], before[2]) and after[3:] == before[3:]
    rb.extend(good)


@pytest.mark.parametrize("frames", [False, True])
def test_a_pickled_lockstep_buffer_keeps_its_episode_index(frames) -> None:
    """The compiled index upkeep (ring/episode_step.py) writes the index's ``rows``; a
    pickled index has its per-slot views made again from them, so readers see it."""
    envs = StackedEnvs(4, 4, seed=5, lengths=(2, 6))
    make = (lambda: FrameStorage(40)) if frames else (lambda: "memory")
    a, ref = ReplayBuffer(40, storage=make(), num_envs=4), ReplayBuffer(40, storage=make(), num_envs=4)
    ref._fast_write = False
    for _ in range(12):
        step = _np_step(envs, 4, True)
        assert a.extend(step) == ref.extend(step)
    b = pickle.loads(pickle.dumps(a))
    for _ in range(12):
        step = _np_step(envs, 4, True)
        assert a.extend(step) == b.extend(step) == ref.extend(step)
        assert _index(a) == _index(b) == _index(ref)
