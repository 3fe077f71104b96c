"""RolloutBuffer.view / index_of and the rsl_rl orders of the minibatch plans."""

from __future__ import annotations

import pytest
import torch

from xpbank import RolloutBuffer
from xpbank.errors import SpecError, XpbankIndexError
from xpbank.rollout.minibatch import flat_plan, split_trajectories, trajectory_plan


def _filled(num_envs: int = 3, horizon: int = 2) -> RolloutBuffer:
    rb = RolloutBuffer(num_envs=num_envs, horizon=horizon, seed=0)
    for t in range(horizon):
        obs = torch.arange(num_envs * 2.0).view(num_envs, 2) + 10 * t
        rb.add({"obs": obs, "reward": torch.ones(num_envs)})
    return rb


def test_view_is_the_stored_data_in_the_buffer_shape():
    rb = _filled()
    obs = rb.view("obs")
    assert obs.shape == (2, 3, 2)
    assert obs[1, 2].tolist() == [14.0, 15.0]
    obs[1, 2] = torch.tensor([-1.0, -2.0])  # a write through the view reaches the storage
    td = next(rb.minibatches(1, shuffle=False))
    assert td["obs"][5].tolist() == [-1.0, -2.0]


def test_view_of_segmented_buffer_is_segments_by_horizon():
    rb = RolloutBuffer.segmented(total_agents=2, batch_size=8, bptt_horizon=2, minibatch_size=4)
    for t in range(4):
        room = torch.nonzero(rb.room()).squeeze(1)
        rb.store({"x": torch.full((room.numel(),), float(t))}, room)
    assert rb.view("x").shape == (4, 2)
    assert rb.view("x").tolist() == [[0.0, 1.0], [0.0, 1.0], [2.0, 3.0], [2.0, 3.0]]


def test_derived_views_feed_minibatches_until_clear():
    rb = _filled()
    assert "return" not in next(rb.minibatches(1, shuffle=False))
    rb.view("return")[:] = torch.arange(6.0).view(2, 3)
    assert next(rb.minibatches(1, shuffle=False))["return"].tolist() == list(map(float, range(6)))
    rb.clear()
    for _ in range(2):
        rb.add({"obs": torch.zeros(3, 2), "reward": torch.ones(3)})
    assert "return" not in next(rb.minibatches(1, shuffle=False))


def test_view_of_unknown_field_names_it():
    with pytest.raises(SpecError, match="view: no field 'nope'"):
        _filled().view("nope")


def test_index_of_matches_minibatch_index_and_refuses_out_of_range():
    rb = _filled()
    rb.clear()
    for _ in range(2):
        rb.add({"obs": torch.zeros(3, 2), "reward": torch.ones(3)})
    td = next(rb.minibatches(1, shuffle=False))
    assert rb.index_of(torch.arange(6)).tolist() == td["index"].tolist()
    with pytest.raises(XpbankIndexError, match=r"slot 6 is out of range \[0, 6\)"):
        rb.index_of([6])


def test_reuse_order_is_one_permutation_of_the_divisible_part():
    gen = torch.Generator().manual_seed(3)
    batches = [b.tolist() for b in flat_plan(10, 3, 2, True, True, gen, reuse_order=True)]
    want = torch.randperm(9, generator=torch.Generator().manual_seed(3)).tolist()
    assert batches == [want[0:3], want[3:6], want[6:9]] * 2


def test_recurrent_drop_last_groups_like_rsl_rl():
    traj = split_trajectories(torch.zeros(2, 5, dtype=torch.bool))  # one trajectory per env
    plan = trajectory_plan(traj, 5, 2, 1, "env", False, torch.Generator(), drop_last=True)
    assert [p.tolist() for p in plan] == [[0, 1], [2, 3]]
    plan = trajectory_plan(traj, 5, 2, 1, "env", False, torch.Generator())
    assert [p.tolist() for p in plan] == [[0, 1], [2, 3, 4]]
