"""FrameStorage's vector-step write (``frame_write.plan_step``) stores exactly what the
general plan (``plan_frames``) does: the same stream goes into two buffers, one with the
step path switched off, and after every write both return the same bytes for every live
item, hold the same frame table and the same side stores, and match the transitions as
they were written (episode ends of one env among many, ring wraps, both paddings)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_frames import StackedEnvs, _assert_same, _record
from xpbank import FrameStorage, ReplayBuffer, SpecError
from xpbank.storage import frame_write, frames


def _pair(
    capacity: int, num_envs: int, pad: str, stacked: bool, monkeypatch
) -> tuple[ReplayBuffer, ReplayBuffer, list]:
    """Two buffers, the second without the step path; ``calls`` counts step plans made."""
    calls: list = []
    step = frame_write.plan_step

    def counted(st, *args):
        todo = step(st, *args) if st.use_step else None
        calls.append(todo is not None)
        return todo

    monkeypatch.setattr(frames, "plan_step", counted)
    pair = []
    for use_step in (True, False):
        storage = FrameStorage(capacity, pad=pad, stacked=stacked)
        storage.use_step = use_step  # type: ignore[attr-defined]
        pair.append(ReplayBuffer(capacity, storage=storage, num_envs=num_envs, seed=0))
    return pair[0], pair[1], calls


def _held(rb: ReplayBuffer) -> dict:
    """What the storage holds for live slots: table rows and side-store tensors by slot."""
    st = rb.storage
    slots = np.sort(np.arange(rb._ring.first_id, rb._ring.next_id) % rb.capacity)
    out = {"src": st._frame_table().src[slots]}
    for name in ("_last", "_stacks"):
        pool = getattr(st, name)
        has = slots[pool.has(slots)]
        out[name] = (has, pool.get(has).numpy())
        assert not pool.has(np.setdiff1d(np.arange(rb.capacity), slots)).any()  # dead slots dropped
    return out


def _assert_same_bytes(a: ReplayBuffer, b: ReplayBuffer) -> None:
    x, y = a.sample_by_index(list(range(len(a)))), b.sample_by_index(list(range(len(b))))
    for key in ("index", "obs", ("next", "obs"), "action", "reward", "terminated", "truncated"):
        assert x[key].numpy().tobytes() == y[key].numpy().tobytes(), key
    hx, hy = _held(a), _held(b)
    np.testing.assert_array_equal(hx["src"], hy["src"])
    for name in ("_last", "_stacks"):
        np.testing.assert_array_equal(hx[name][0], hy[name][0])
        assert hx[name][1].tobytes() == hy[name][1].tobytes(), name


@pytest.mark.parametrize(
    "capacity,num_envs,stack,pad,stacked",
    [
        (80, 8, 4, "repeat", True),  # lockstep layout, wraps every 10 steps
        (84, 8, 4, "zero", True),  # capacity not a multiple of the envs: positions are slots
        (48, 8, 3, "repeat", True),  # the ring holds exactly 2 steps beyond a stack
        (24, 8, 1, "repeat", False),  # whole observations (the SB3 adapter's dedup)
        (20, 1, 4, "repeat", True),  # one env
    ],
)
def test_step_path_stores_what_the_general_plan_does(capacity, num_envs, stack, pad, stacked, monkeypatch):
    fast, slow, calls = _pair(capacity, num_envs, pad, stacked, monkeypatch)
    envs = StackedEnvs(num_envs, stack, seed=capacity, pad=pad, lengths=(1, 9))
    ref: dict = {}
    rng = np.random.default_rng(0)
    for t in range(90):
        k = 1 if t % 5 else int(rng.integers(2, 4))  # mostly single steps, some multi-step writes
        parts = [envs.step(range(num_envs)) for _ in range(k)]
        batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
        if not stacked:
            batch = {key: v[:, -1] if key in ("obs", ("next", "obs")) else v for key, v in batch.items()}
        ids = fast.extend(batch)
        assert slow.extend(batch) == ids
        _record(ref, ids, batch)
        _assert_same_bytes(fast, slow)
        _assert_same(ref, fast.sample_by_index(list(range(len(fast)))))
    assert fast._ring.next_id > 4 * capacity  # wrapped several times
    ends = slow.episodes.is_end(np.arange(slow._ring.first_id, slow._ring.next_id))
    assert 0 < ends.sum() < ends.size  # episodes ended among live items (one env's among many)
    assert sum(calls) > 60  # the step path planned most writes ...
    assert not all(calls)  # ... and the general plan the rest


def test_a_bad_step_is_refused_as_the_general_plan_refuses_it() -> None:
    envs = StackedEnvs(4, 4, seed=3, lengths=(20, 30))
    rb = ReplayBuffer(40, storage=FrameStorage(40), num_envs=4, seed=0)
    for _ in range(12):  # past the first wrap: the step path plans these writes
        rb.extend(envs.step(range(4)))
    before = rb.sample_all()
    good = envs.step(range(4))
    cases = []
    stale = {k: v.clone() for k, v in good.items()}
    stale["obs"][2, 1] += 1  # env 2's older frames are not the previous next observation's
    stale[("next", "obs")][2, 0] += 1
    cases.append((stale, r"item 2 of the batch \(env 2\) is not the next observation"))
    newest = {k: v.clone() for k, v in good.items()}
    newest["obs"][3, 3] += 1  # and its newest frame (kept aside)
    newest[("next", "obs")][3, 2] += 1
    cases.append((newest, r"item 3 of the batch \(env 3\) is not the next observation"))
    shifted = {k: v.clone() for k, v in good.items()}
    shifted[("next", "obs")][1, 0] += 1
    cases.append((shifted, r"field 'next.obs' .*item 1 .*not its observation shifted by one frame"))
    for bad, match in cases:
        with pytest.raises(SpecError, match=match):
            rb.extend(bad)
        assert (rb.sample_all() == before).all()
    rb.extend(good)  # the stream goes on as if nothing had been tried
    assert len(rb) == 40


def test_a_bad_first_stack_is_refused() -> None:
    envs = StackedEnvs(2, 3, seed=5, lengths=(2, 4))
    rb = ReplayBuffer(30, storage=FrameStorage(30), num_envs=2, seed=0)
    refused = 0
    for _ in range(40):
        step = envs.step(range(2))
        fresh = np.flatnonzero(rb.episodes._fresh)  # the envs whose next item starts an episode
        if len(rb) >= 6 and fresh.size:  # the step path plans this write
            e = int(fresh[0])
            bad = {k: v.clone() for k, v in step.items()}
            bad["obs"][e, 0] += 1  # its padding is not its first frame
            with pytest.raises(SpecError, match=rf"item {e} .*starts an episode but is not 'repeat'-padded"):
                rb.extend(bad)
            refused += 1
        rb.extend(step)
    assert refused > 5


def test_verify_false_skips_the_checks_and_stores_the_same() -> None:
    """``verify=False``: a good stream is stored exactly as with the checks; a bad batch
    is taken (what it breaks comes back as the frames stored, not as passed)."""
    envs = StackedEnvs(4, 4, seed=9, lengths=(3, 12))
    checked = ReplayBuffer(40, storage=FrameStorage(40), num_envs=4, seed=0)
    trusting = ReplayBuffer(40, storage=FrameStorage(40, verify=False), num_envs=4, seed=0)
    ref: dict = {}
    for t in range(40):
        parts = [envs.step(range(4)) for _ in range(1 if t % 6 else 2)]  # some two-step writes
        batch = {key: torch.cat([p[key] for p in parts]) for key in parts[0]}
        ids = checked.extend(batch)
        assert trusting.extend(batch) == ids
        _record(ref, ids, batch)
        _assert_same_bytes(checked, trusting)
    _assert_same(ref, trusting.sample_all())
    bad = envs.step(range(4))
    bad["obs"] = bad["obs"].clone()
    bad["obs"][1, 0] += 1
    with pytest.raises(SpecError):
        checked.extend(bad)
    trusting.extend(bad)  # no error: not checked
    got = trusting.sample_by_index([-3])["obs"][0]  # env 1's newest item
    assert not torch.equal(got, bad["obs"][1])  # its stack is rebuilt from the frames stored
