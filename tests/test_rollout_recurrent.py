"""Recurrent minibatches: trajectories split at episode ends, padded, masked, unpadded."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from xpbank import CapacityError, RolloutBuffer, SpecError, split_trajectories, unpad
from xpbank.rollout import pad_trajectories


def _dones(seed: int, t: int, e: int, p: float = 0.25) -> torch.Tensor:
    return torch.rand(t, e, generator=torch.Generator().manual_seed(seed)) < p


def _ref_trajectories(dones: torch.Tensor) -> list[tuple[int, int, int]]:
    """(env, start, length) for every piece of episode, env by env, in time order."""
    out = []
    t_len, n = dones.shape
    for e in range(n):
        start = 0
        for t in range(t_len):
            if dones[t, e] or t == t_len - 1:
                out.append((e, start, t - start + 1))
                start = t + 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_split_trajectories_matches_brute_force(seed: int) -> None:
    d = _dones(seed, 9, 4)
    d[-1, 0] = True  # a done on the last step opens no empty trajectory
    traj = split_trajectories(d)
    got = list(zip(traj.row.tolist(), traj.start.tolist(), traj.length.tolist(), strict=True))
    assert got == _ref_trajectories(d)


@pytest.mark.parametrize("seed", range(3))
def test_pad_and_unpad_agree_with_rsl_rl(seed: int) -> None:
    from rsl_rl.utils.utils import split_and_pad_trajectories, unpad_trajectories

    t_len, n = 8, 5
    d = _dones(seed, t_len, n)
    x = torch.randn(t_len, n, 3, generator=torch.Generator().manual_seed(seed))
    rsl_padded, rsl_mask = split_and_pad_trajectories(x, d[..., None])
    grid = torch.arange(t_len * n).view(t_len, n)
    slots, mask = pad_trajectories(grid, split_trajectories(d), pad_to=t_len)
    ours = x.reshape(t_len * n, 3)[slots]
    assert torch.equal(mask, rsl_mask)
    assert torch.equal(ours[mask], rsl_padded[rsl_mask])
    # unpad: our trajectory-major rows, reshaped env-major, are rsl_rl's [T, E] back
    back = unpad(ours, mask).view(n, t_len, 3).transpose(0, 1)
    assert torch.equal(back, x)
    assert torch.equal(unpad_trajectories(rsl_padded, rsl_mask), x)


def test_padding_is_to_the_longest_chosen_and_repeats_a_real_step() -> None:
    d = torch.tensor([[0, 0], [1, 0], [0, 0]], dtype=torch.bool)
    grid = torch.arange(6).view(3, 2)
    traj = split_trajectories(d)
    slots, mask = pad_trajectories(grid, traj, pick=torch.tensor([0, 1]))  # lengths 2 and 1
    assert slots.shape == (2, 2) and mask.tolist() == [[True, True], [True, False]]
    assert slots[:, 1].tolist() == [4, 4]


def _rsl_storage(obs: torch.Tensor, hidden: torch.Tensor, dones: torch.Tensor):
    from rsl_rl.storage.rollout_storage import RolloutStorage

    t_len, n = dones.shape
    st = RolloutStorage("rl", n, t_len, TensorDict({"policy": obs[0]}, batch_size=[n]), [1])
    for t in range(t_len):
        tr = RolloutStorage.Transition()
        tr.observations = TensorDict({"policy": obs[t]}, batch_size=[n])
        tr.actions = torch.zeros(n, 1)
        tr.rewards = torch.zeros(n)
        tr.dones = dones[t]
        tr.values = torch.zeros(n, 1)
        tr.actions_log_prob = torch.zeros(n)
        tr.distribution_params = (torch.zeros(n, 1),)
        tr.hidden_states = (hidden[t].transpose(0, 1), None)  # rsl_rl: [layers, envs, dim]
        st.add_transition(tr)
    return st


def _filled(seed: int, t_len: int = 6, n: int = 4, p: float = 0.3) -> tuple[RolloutBuffer, dict]:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(t_len, n, 3, generator=g),
        "hidden": torch.randn(t_len, n, 2, 5, generator=g),  # [layers=2, dim=5] per env
        "terminated": torch.rand(t_len, n, generator=g) < p,
    }
    rb = RolloutBuffer(n, t_len, seed=seed)
    for t in range(t_len):
        rb.add({k: v[t] for k, v in data.items()})
    return rb, data


@pytest.mark.parametrize("seed", range(3))
def test_by_env_in_order_is_rsl_rls_recurrent_generator(seed: int) -> None:
    rb, data = _filled(seed)
    st = _rsl_storage(data["obs"], data["hidden"], data["terminated"])
    theirs = list(st.recurrent_mini_batch_generator(num_mini_batches=2, num_epochs=1))
    ours = list(rb.recurrent_minibatches(2, by="env", shuffle=False, hidden_keys=["hidden"], pad_to=6))
    assert len(ours) == len(theirs) == 2
    for mine, ref in zip(ours, theirs, strict=True):
        assert torch.equal(mine.data["mask"], ref.masks)
        m = ref.masks
        assert torch.equal(mine.data["obs"][m], ref.observations["policy"][m])
        assert torch.equal(mine.hidden["hidden"].transpose(0, 1), ref.hidden_states[0])


def test_by_env_shuffled_covers_each_env_once_per_epoch_with_correct_data() -> None:
    rb, data = _filled(4, t_len=5, n=6)
    batches = list(rb.recurrent_minibatches(3, epochs=2, by="env", hidden_keys=["hidden"]))
    assert len(batches) == 6
    for epoch in (batches[:3], batches[3:]):
        seen = torch.cat([b.data["index"][b.data["mask"]] for b in epoch])
        assert sorted(seen.tolist()) == list(range(30))  # every step exactly once
    for b in batches:
        mask, idx = b.data["mask"], b.data["index"]
        assert (idx[~mask] == -1).all()
        t, e = idx[mask] // 6, idx[mask] % 6
        assert torch.equal(b.data["obs"][mask], data["obs"][t, e])
        envs = set((b.data["index"][0] % 6).tolist())
        assert len(envs) == 2  # 6 envs / 3 minibatches
        assert torch.equal(b.hidden["hidden"], b.data["hidden"][0])
        # each trajectory starts after an episode end or at t = 0, in its env's column
        t0, e0 = idx[0] // 6, idx[0] % 6
        prev_done = torch.where(
            t0 > 0, data["terminated"][(t0 - 1).clamp(min=0), e0], torch.ones_like(t0, dtype=torch.bool)
        )
        assert prev_done.all()


def test_by_trajectory_shuffles_all_trajectories_each_epoch() -> None:
    rb, data = _filled(5, t_len=8, n=3)
    n_traj = len(split_trajectories(data["terminated"]))
    batches = list(rb.recurrent_minibatches(2, epochs=2, by="trajectory"))
    firsts = []
    for epoch in (batches[:2], batches[2:]):
        starts = torch.cat([b.data["index"][0] for b in epoch])
        assert len(starts) == n_traj and len(set(starts.tolist())) == n_traj
        firsts.append(starts)
        seen = torch.cat([b.data["index"][b.data["mask"]] for b in epoch])
        assert sorted(seen.tolist()) == list(range(24))
    assert not torch.equal(firsts[0], firsts[1])


def test_recurrent_errors() -> None:
    rb, _ = _filled(6)
    with pytest.raises(SpecError, match=r"hidden_keys: unknown field\(s\) \['h'\]"):
        rb.recurrent_minibatches(2, hidden_keys=["h"])
    with pytest.raises(CapacityError, match="by: expected 'env' or 'trajectory', got 'time'"):
        rb.recurrent_minibatches(2, by="time")
    with pytest.raises(CapacityError, match="num_minibatches 5 is more than the 4 envs to split"):
        rb.recurrent_minibatches(5)
    no_dones = RolloutBuffer(1, 1)
    no_dones.add({"obs": torch.zeros(1)})
    with pytest.raises(SpecError, match="field 'terminated' is needed here"):
        no_dones.recurrent_minibatches(1)


def test_update_through_a_recurrent_minibatch_skips_padding() -> None:
    rb, _ = _filled(7)
    b = next(rb.recurrent_minibatches(1, by="env", shuffle=False))
    rb.update(b.data["index"], {"obs": torch.full_like(b.data["obs"], 9.0)})
    assert (next(rb.minibatches(1))["obs"] == 9.0).all()


def test_by_env_leaves_no_env_out_when_groups_do_not_divide() -> None:
    rb, _ = _filled(8, t_len=3, n=5)
    batches = list(rb.recurrent_minibatches(2, by="env"))
    envs = [set((b.data["index"][0] % 5).tolist()) for b in batches]
    assert sorted(len(e) for e in envs) == [2, 3] and envs[0] | envs[1] == set(range(5))
