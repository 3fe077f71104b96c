"""XpbankReplayBuffer's SB3 arrays (observations ... timeouts) and ``_get_samples``,
against SB3's own ``ReplayBuffer`` fed the same stream."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("stable_baselines3")
gym = pytest.importorskip("gymnasium")

from stable_baselines3.common.buffers import ReplayBuffer as SB3ReplayBuffer  # noqa: E402

from sb3_stream import chained  # noqa: E402
from xpbank import SpecError  # noqa: E402
from xpbank.integrations.sb3 import XpbankReplayBuffer  # noqa: E402

OBS = gym.spaces.Box(-10, 10, (3,), np.float32)
BOX_ACT = gym.spaces.Box(-1, 1, (2,), np.float32)
DISCRETE = gym.spaces.Discrete(4)
ATTRS = ("observations", "next_observations", "actions", "rewards", "dones", "timeouts")


def pair(size, n_envs, action_space, steps, handle_timeout=True, optimize=False, seed=0):
    ref = SB3ReplayBuffer(
        size, OBS, action_space, "cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout
    )
    buf = XpbankReplayBuffer(
        size, OBS, action_space, "cpu", n_envs=n_envs, handle_timeout_termination=handle_timeout,
        optimize_memory_usage=optimize, seed=0,
    )  # fmt: skip
    for args in chained(seed, n_envs, steps, action_space, p_done=0.25):
        ref.add(*args)
        buf.add(*args)
    return ref, buf


@pytest.mark.parametrize("handle_timeout", [True, False])
@pytest.mark.parametrize(
    ("n_envs", "action_space", "steps"), [(1, DISCRETE, 30), (3, BOX_ACT, 23), (4, DISCRETE, 40)]
)
def test_arrays_have_sb3s_shapes_dtypes_and_values(n_envs, action_space, steps, handle_timeout):
    ref, buf = pair(40, n_envs, action_space, steps, handle_timeout)  # 40 // n_envs rows: some wrap
    assert (buf.pos, buf.full) == (ref.pos, ref.full)
    rows = slice(None) if ref.full else slice(0, ref.pos)
    for name in ATTRS:
        theirs, ours = getattr(ref, name), getattr(buf, name)
        assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, name
        np.testing.assert_array_equal(np.asarray(ours)[rows], theirs[rows], err_msg=name)
    assert bool(np.asarray(buf.dones)[rows].any()) and (not handle_timeout or buf.timeouts[rows].any())
    if not ref.full:  # flags of rows not written yet read as SB3's zeros
        assert not np.asarray(buf.dones)[ref.pos :].any() and not buf.timeouts[ref.pos :].any()


def test_arrays_are_views_of_the_stored_fields():
    _, buf = pair(20, 2, BOX_ACT, 7)
    for name, key in (("observations", "obs"), ("rewards", "reward"), ("actions", "action")):
        assert np.shares_memory(getattr(buf, name), buf.xp.storage.host_view(key)), name
    buf.rewards[3, 1] = 42.0  # a user's relabeling writes the buffer
    buf.observations[3, 1, 0] = -7.0
    item = buf.xp.sample_by_index([3 * 2 + 1])  # row 3, env 1 (no wrap yet: position = slot)
    assert item["reward"].tolist() == [42.0] and item["obs"][0, 0].item() == -7.0


def test_dones_reads_like_an_array_and_slices():
    ref, buf = pair(100, 1, DISCRETE, 80)
    np.testing.assert_array_equal(buf.dones[:50], ref.dones[:50])
    np.testing.assert_array_equal(buf.dones[10], ref.dones[10])
    assert buf.dones.sum() == ref.dones.sum() > 0 and len(buf.dones) == 100
    assert buf.dones.shape == (100, 1) and np.asarray(buf.dones).dtype == np.float32


def test_memory_optimized_buffer_gives_copies_with_the_true_next_observations():
    ref, buf = pair(30, 3, DISCRETE, 25, optimize=True)  # SB3's non-optimized buffer: the truth
    for name in ATTRS:
        np.testing.assert_array_equal(np.asarray(getattr(buf, name)), getattr(ref, name), err_msg=name)
    obs = buf.observations
    obs[:] = 0.0  # a copy: nothing stored changes
    np.testing.assert_array_equal(buf.observations, ref.observations)
    assert type(buf.xp.storage).__name__ == "FrameStorage"  # no host view: every array is a copy


@pytest.mark.parametrize("handle_timeout", [True, False])
def test_get_samples_matches_sb3(handle_timeout):
    ref, buf = pair(40, 4, BOX_ACT, 13, handle_timeout)
    inds = np.array([0, 3, 9, 9, 7, 1, 2])  # 10 rows, 13 steps written: wrapped
    np.random.seed(5)
    theirs = ref._get_samples(inds)
    np.random.seed(5)  # SB3 draws the envs from NumPy's global generator; so does the adapter
    ours = buf._get_samples(inds)
    for name in ("observations", "actions", "next_observations", "dones", "rewards"):
        torch.testing.assert_close(getattr(ours, name), getattr(theirs, name), rtol=0, atol=0, msg=name)
    assert ours.discounts is None and theirs.discounts is None
    _, partial = pair(40, 4, BOX_ACT, 6, handle_timeout)
    with pytest.raises(SpecError, match=r"batch_inds: rows must hold transitions \(6 rows stored\)"):
        partial._get_samples(np.array([2, 6]))
