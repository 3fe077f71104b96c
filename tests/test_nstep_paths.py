"""The fused n-step read (items and their windows' last rows in one gather) on its edges:
in-place updates, field selections, window lengths 1 and 2, bfloat16 rewards, memmap
storage, and the reduction against a loop written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_nstep import GAMMA, Log, run_stream
from xpbank import NStep, ReplayBuffer
from xpbank.nstep.returns import nstep_reduce


def _stream(rb: ReplayBuffer, steps: int, seed: int, dtype: torch.dtype = torch.float32) -> Log:
    """``steps`` lockstep steps of 2 envs (ids as obs, random rewards and ends) into ``rb``."""
    rng, log = np.random.default_rng(seed), Log()
    for t in range(steps):
        ids = np.arange(2 * t, 2 * t + 2)
        reward = rng.normal(size=2).astype(np.float32)
        term = rng.random(2) < 0.2
        trunc = (rng.random(2) < 0.1) & ~term
        rb.extend({"obs": torch.as_tensor(ids, dtype=torch.float32), "next_obs": torch.as_tensor(ids + 0.5),
                   "reward": torch.as_tensor(reward).to(dtype), "terminated": torch.as_tensor(term),
                   "truncated": torch.as_tensor(trunc)})  # fmt: skip
        stored = torch.as_tensor(reward).to(dtype).float().numpy()  # what the buffer holds
        log.rows += [(int(i), int(i % 2), float(r), bool(a), bool(b))
                     for i, r, a, b in zip(ids, stored, term, trunc, strict=True)]  # fmt: skip
    return log


def _check(batch, log: Log, n: int, rel: float = 1e-5) -> None:
    for row, x in enumerate(batch["index"].tolist()):
        ret, disc, k, last, _ = log.target(x, n)
        assert batch["nstep_return"][row].item() == pytest.approx(ret, rel=rel, abs=rel)
        assert batch["nstep_discount"][row].item() == pytest.approx(disc, rel=1e-6)
        assert batch["nstep_steps"][row].item() == k
        if "next_obs" in set(batch.keys()):
            assert batch["next_obs"][row].item() == last + 0.5


def test_update_of_rewards_and_next_obs_is_reflected() -> None:
    """Nothing is precomputed at write time: a reward or next obs changed by ``update``
    after the write is what the next sample's targets use."""
    rb = ReplayBuffer(64, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    log = _stream(rb, 20, seed=1)
    ids = torch.arange(10, 30)
    new = torch.arange(20, dtype=torch.float32) * 10
    rb.update(ids, {"reward": new, "next_obs": new + 0.25})
    log.rows = [(i, e, float(new[i - 10]) if 10 <= i < 30 else r, a, b) for i, e, r, a, b in log.rows]
    batch = rb.sample(200)
    for row, x in enumerate(batch["index"].tolist()):
        ret, _, _, last, _ = log.target(x, 3)
        assert batch["nstep_return"][row].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)
        expected = float(new[last - 10]) + 0.25 if 10 <= last < 30 else last + 0.5
        assert batch["next_obs"][row].item() == expected


@pytest.mark.parametrize("fields", [["next_obs"], ["obs", "terminated"], ["reward", "next_obs"]])
def test_field_selections_with_and_without_the_reward(fields: list[str]) -> None:
    rb = ReplayBuffer(40, num_envs=2, nstep=NStep(3, GAMMA), seed=2)
    log = _stream(rb, 30, seed=3)  # wraps
    batch = rb.sample(100, fields=fields)
    assert set(batch.keys()) == {*fields, "index", "nstep_return", "nstep_discount", "nstep_steps",
                                 "nstep_terminated"}  # fmt: skip
    _check(batch, log, 3)
    for row, x in enumerate(batch["index"].tolist()):
        last_term = log.target(x, 3)[4]
        if "obs" in fields:
            assert batch["obs"][row].item() == x  # the item's own field
        if "terminated" in fields:
            assert bool(batch["terminated"][row]) == last_term  # the window's last item's
        if "reward" in fields:
            assert batch["reward"][row].item() == next(r[2] for r in log.rows if r[0] == x)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_window_lengths_one_two_and_five_match_reference(n: int) -> None:
    run_stream(11, None, torchrl=False, env_field=False, n=n)
    run_stream(12, None, torchrl=True, env_field=True, n=n)


def test_bfloat16_rewards() -> None:
    rb = ReplayBuffer(50, num_envs=2, nstep=NStep(3, GAMMA), seed=4)
    log = _stream(rb, 20, seed=5, dtype=torch.bfloat16)
    _check(rb.sample(64), log, 3, rel=1e-2)


def test_memmap_storage_gives_the_same_batches() -> None:
    """The fused read goes through the Storage protocol: any backend gives the same batch."""
    memory = ReplayBuffer(30, num_envs=2, nstep=NStep(3, GAMMA), seed=6)
    memmap = ReplayBuffer(30, num_envs=2, nstep=NStep(3, GAMMA), seed=6, storage="memmap")
    log = _stream(memory, 25, seed=7)
    _stream(memmap, 25, seed=7)
    a, b = memory.sample(64), memmap.sample(64)
    assert set(a.keys()) == set(b.keys())
    for key in sorted(a.keys()):
        assert torch.equal(a[key], b[key]), key
    _check(b, log, 3)


def test_reduce_against_a_loop() -> None:
    rng = np.random.default_rng(8)
    b, n, gamma = 300, 4, 0.97
    rewards = rng.normal(size=(b, n))
    steps = rng.integers(1, n + 1, b)
    rewards[np.arange(n) >= steps[:, None]] = np.inf  # past the window: never read as numbers
    terminated = rng.random(b) < 0.3
    ret, disc = nstep_reduce(rewards, steps, terminated, gamma ** np.arange(n + 1.0))
    for i in range(b):
        expected = sum(gamma**j * rewards[i, j] for j in range(steps[i]))
        assert ret[i] == pytest.approx(expected, rel=1e-6)
        assert disc[i] == pytest.approx(0.0 if terminated[i] else gamma ** steps[i], rel=1e-7)
    assert ret.dtype == np.float32 and disc.dtype == np.float32
