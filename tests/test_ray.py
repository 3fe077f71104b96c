"""RayReplayBuffer on a local Ray (the session's ``ray_session``): routing, n-step,
global importance weights, priority routing and staleness, the rate limiter, a writer in
a Ray task, and a killed shard that comes back with its checkpoint.

Starting an actor costs seconds here (its process imports xpbank), so two buffers are
made per module and cleared between tests.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("ray")

from test_uniform_stats import P_MIN, chi2_pvalue
from xpbank import (
    CapacityError,
    NStep,
    PrioritizedSampler,
    PriorityError,
    RateLimiter,
    RateLimitTimeout,
    ReplayBuffer,
    SpecError,
    StaleIndexError,
    XpbankIndexError,
)
from xpbank.distributed.ray import RayReplayBuffer

pytestmark = pytest.mark.slow  # actors take 10-30 s to start on the shared 2-core machine

ALPHA, BETA, EPS = 0.7, 0.5, 0.01


@pytest.fixture(scope="module")
def prio_rb(ray_session: Any) -> Iterator[RayReplayBuffer]:
    rb = RayReplayBuffer(
        2,
        64,
        sampler=PrioritizedSampler(alpha=ALPHA, beta=BETA, eps=EPS),
        seed=0,
        timeout=60.0,
        probe_timeout=2.0,
    )
    yield rb
    rb.close()


@pytest.fixture
def prio(prio_rb: RayReplayBuffer) -> RayReplayBuffer:
    prio_rb.clear()
    return prio_rb


@pytest.fixture(scope="module")
def nstep_rb(ray_session: Any) -> Iterator[RayReplayBuffer]:
    limiter = RateLimiter(min_size_to_sample=10)
    rb = RayReplayBuffer(2, 400, nstep=NStep(3, 0.9), seed=1, rate_limiter=limiter, timeout=3.0)
    yield rb
    rb.close()


def items(uids: np.ndarray, envs: int) -> dict[str, torch.Tensor]:
    uid = torch.as_tensor(uids, dtype=torch.int64)
    return {"uid": uid, "obs": uid.float().unsqueeze(1).repeat(1, 2), "env_id": uid % envs}


def ids_by_uid(rb: RayReplayBuffer, n: int) -> dict[int, int]:
    """Every item's global id, found by sampling (each of n items is drawn w.p. ~1)."""
    batch = rb.sample(60 * n)
    found = dict(zip(batch["uid"].tolist(), batch["index"].tolist(), strict=True))
    assert len(found) == n
    return found


def shard_totals(rb: RayReplayBuffer) -> list[float]:
    import ray

    return [ray.get(s.stats.remote())["total"] for s in rb.shards]


def test_items_of_an_env_stay_on_its_shard(prio: RayReplayBuffer) -> None:
    prio.extend(items(np.arange(40), envs=4))
    assert len(prio) == 40
    batch = prio.sample(400)
    assert torch.equal(batch["index"] % 2, batch["env_id"] % 2)
    sizes = [status.size for status in prio.shard_status()]
    assert sizes == [20, 20]


def test_prioritized_weights_equal_a_single_buffers(prio: RayReplayBuffer) -> None:
    uids = np.arange(40)
    prio.extend(items(uids, envs=4))
    local = ReplayBuffer(64, sampler=PrioritizedSampler(alpha=ALPHA, beta=BETA, eps=EPS), seed=0)
    local.extend(items(uids, envs=4))  # local id == uid
    gid = ids_by_uid(prio, 40)
    priority = 0.1 + (uids * 7 % 13).astype(np.float64)
    prio.update_priority([gid[u] for u in uids], priority)
    local.update_priority(uids, priority)

    stored = (priority + EPS) ** ALPHA  # brute force: w_i = (N P_i)^-beta / max_j (N P_j)^-beta
    reference = (stored / stored.min()) ** -BETA
    batch = prio.sample(256)
    drawn = batch["uid"].numpy()
    np.testing.assert_allclose(batch["weight"].numpy(), reference[drawn], rtol=1e-6)
    local_batch = local.sample(256)
    np.testing.assert_allclose(
        local_batch["weight"].numpy(), reference[local_batch["uid"].numpy()], rtol=1e-6
    )


def test_prioritized_frequencies_follow_global_priorities(prio: RayReplayBuffer) -> None:
    uids = np.arange(40)
    prio.extend(items(uids, envs=4))
    gid = ids_by_uid(prio, 40)
    priority = np.where(uids % 4 == 0, 4.0, 1.0)  # envs 0 (shard 0) weigh 4x: shard masses differ
    prio.update_priority([gid[u] for u in uids], priority)
    counts = np.zeros(40)
    for _ in range(20):
        np.add.at(counts, prio.sample(500)["uid"].numpy(), 1)
    p = (priority + EPS) ** ALPHA
    p_value = chi2_pvalue(counts, counts.sum() * p / p.sum())
    assert p_value > P_MIN, f"chi-square p = {p_value:.2e} <= {P_MIN} (seeded; counts {counts.tolist()})"


def test_update_priority_routes_by_id_and_refuses_stale_ids(prio: RayReplayBuffer) -> None:
    prio.extend(items(np.arange(20), envs=4))
    old = ids_by_uid(prio, 20)
    prio.extend(items(np.arange(20, 80), envs=4))  # 40 per shard, 32 kept: uids 0..15 overwritten
    prio.flush()
    totals = shard_totals(prio)
    with pytest.raises(StaleIndexError, match=rf"item {old[3]} has been overwritten, cleared or lost"):
        prio.update_priority([old[19], old[3]], [50.0, 50.0])
    with pytest.raises(XpbankIndexError, match=r"item 2000001 was never issued \(shard 1, live ids"):
        prio.update_priority([2_000_001], [1.0])
    with pytest.raises(PriorityError, match=r"replace=False: prioritized sampling draws with replacement"):
        prio.sample(4, replace=False)
    with pytest.raises(PriorityError, match=r"expected finite values >= 0, got nan at position 1"):
        prio.update_priority([old[19], old[18]], [1.0, float("nan")])
    assert shard_totals(prio) == totals  # nothing written by any refused call
    prio.update_priority([old[19], old[3]], [50.0, 50.0], stale="skip")  # uid 19 (shard 1) written
    assert shard_totals(prio)[0] == totals[0] and shard_totals(prio)[1] > totals[1]
    p19 = (50 + EPS) ** ALPHA / sum(shard_totals(prio))  # its share of the global priority mass
    hits = int((prio.sample(4000)["uid"] == 19).sum())
    assert abs(hits - 4000 * p19) < 5 * math.sqrt(4000 * p19 * (1 - p19))  # 5 sigma, seeded


def test_a_bad_batch_raises_before_anything_is_queued(prio: RayReplayBuffer) -> None:
    prio.extend(items(np.arange(4), envs=2))
    with pytest.raises(SpecError, match=r"field 'obs'"):
        prio.extend(
            {"uid": torch.zeros(2, dtype=torch.int64), "obs": torch.zeros(2, 3), "env_id": torch.zeros(2)}
        )
    assert len(prio) == 4


def test_a_writer_sends_rows_from_a_ray_task(prio: RayReplayBuffer, ray_session: Any) -> None:
    @ray_session.remote
    def collect(writer: Any, start: int) -> int:  # runs in a worker: nothing from this module
        for step in range(5):
            uid = torch.arange(start + 4 * step, start + 4 * step + 4)
            writer.extend({"uid": uid, "obs": uid.float().unsqueeze(1).repeat(1, 2), "env_id": uid % 4})
        return int(writer.flush())

    stored = ray_session.get(
        [collect.remote(prio.writer(), 0), collect.remote(prio.writer(), 100)], timeout=120
    )
    assert stored == [20, 20] and len(prio) == 40
    assert sorted(set(prio.sample(800)["uid"].tolist())) == [*range(20), *range(100, 120)]


def reference_nstep(stream: list[dict[str, Any]], t: int, n: int, gamma: float) -> tuple[float, float, float]:
    """(return, discount, next obs) of step t of one env's stream, by walking it."""
    ret, k = 0.0, 0
    while True:
        step = stream[t + k]
        ret += gamma**k * step["reward"]
        k += 1
        if step["terminated"] or step["truncated"] or k == n or t + k == len(stream):
            discount = 0.0 if step["terminated"] else gamma**k
            return ret, discount, step["next_obs"]


def env_steps(t: int, envs: int, rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """Step ``t`` of ``envs`` envs (one row each): random rewards and episode ends."""
    end = rng.random(envs)
    return {
        "uid": torch.arange(t * envs, (t + 1) * envs),
        "env_id": torch.arange(envs),
        "obs": torch.full((envs,), float(t)),
        "next_obs": torch.full((envs,), t + 0.5),
        "reward": torch.as_tensor(rng.normal(size=envs), dtype=torch.float32),
        "terminated": torch.as_tensor(end < 0.1),
        "truncated": torch.as_tensor((end >= 0.1) & (end < 0.15)),
    }


def test_sampling_waits_for_min_size_to_sample_then_times_out(nstep_rb: RayReplayBuffer) -> None:
    state = nstep_rb.rate_limiter_state()
    assert state is not None and state["inserts"] == 0, "runs first on this module's nstep buffer"
    rng = np.random.default_rng(0)
    nstep_rb.extend(env_steps(0, 5, rng))
    nstep_rb.flush()
    with pytest.raises(
        RateLimitTimeout, match=r"sample of 4 items still blocked after 3 s \(5 of min_size_to_sample=10"
    ):
        nstep_rb.sample(4)
    nstep_rb.extend(env_steps(1, 5, rng))
    assert nstep_rb.sample(4).batch_size == torch.Size([4])  # flushed: 10 inserted
    assert nstep_rb.rate_limiter_state() == {
        "inserts": 10, "samples": 4, "diff": 0.0, "min_diff": -math.inf,
        "max_diff": math.inf,
    }  # fmt: skip


def test_nstep_targets_match_a_reference_per_env(nstep_rb: RayReplayBuffer) -> None:
    nstep_rb.clear()
    rng = np.random.default_rng(3)
    envs, steps = 3, 40  # envs 0, 2 on shard 0 and env 1 on shard 1: shards of unequal size
    streams: list[list[dict[str, Any]]] = [[] for _ in range(envs)]
    for t in range(steps):
        rows = env_steps(t, envs, rng)
        nstep_rb.extend(rows)
        for e in range(envs):
            streams[e].append({k: v[e].item() for k, v in rows.items()})
    batch = nstep_rb.sample(300)
    assert torch.equal(batch["index"] % 2, batch["env_id"] % 2)
    for i in range(300):
        uid = int(batch["uid"][i])
        ret, discount, next_obs = reference_nstep(streams[uid % envs], uid // envs, 3, 0.9)
        assert float(batch["nstep_return"][i]) == pytest.approx(ret, abs=1e-5)
        assert float(batch["nstep_discount"][i]) == pytest.approx(discount, abs=1e-6)
        assert float(batch["next_obs"][i]) == next_obs


def test_uniform_draws_are_uniform_over_unequal_shards(nstep_rb: RayReplayBuffer) -> None:
    nstep_rb.clear()
    uid = torch.arange(120)
    nstep_rb.extend({"uid": uid, "env_id": uid % 3, "obs": uid.float(), "next_obs": uid.float(),
                     "reward": torch.zeros(120), "terminated": torch.zeros(120, dtype=torch.bool),
                     "truncated": torch.zeros(120, dtype=torch.bool)})  # fmt: skip
    assert [s.size for s in nstep_rb.shard_status()] == [80, 40]
    counts = np.zeros(120)
    for _ in range(12):
        np.add.at(counts, nstep_rb.sample(500)["uid"].numpy(), 1)
    p_value = chi2_pvalue(counts, counts.sum() / 120)
    assert p_value > P_MIN, f"chi-square p = {p_value:.2e} <= {P_MIN} (seeded)"
    assert sorted(nstep_rb.sample(120, replace=False)["uid"].tolist()) == list(range(120))
    distinct = nstep_rb.sample(60, replace=False)["uid"]
    assert distinct.unique().numel() == 60
    with pytest.raises(CapacityError, match=r"121 distinct items asked for \(replace=False\), but only 120"):
        nstep_rb.sample(121, replace=False)


def test_a_killed_shard_comes_back_with_its_checkpoint(
    prio: RayReplayBuffer, ray_session: Any, caplog: pytest.LogCaptureFixture
) -> None:
    prio.extend(items(np.arange(40), envs=4))  # 20 a shard
    prio.checkpoint()
    prio.extend(items(np.arange(40, 48), envs=2))  # 4 more a shard, after the checkpoint
    before = ids_by_uid(prio, 48)
    caplog.set_level(logging.WARNING, logger="xpbank.distributed.ray")
    ray_session.kill(prio.shards[0], no_restart=False)
    seen_down = False
    deadline = time.monotonic() + 120
    status = prio.shard_status()[0]
    while time.monotonic() < deadline:
        was = status.state
        batch = prio.sample(16)  # goes on while shard 0 is down
        status = prio.shard_status()[0]
        if was == status.state == "down":  # down for the whole sample
            seen_down = True
            assert (batch["index"] % 2 == 1).all()  # only shard 1 answers
        elif seen_down and status.state == "up":
            break
        time.sleep(0.2)
    assert seen_down and status.state == "up", f"shard 0 did not come back: {status}"
    # down: "shard 0 is down (...)" or "shard 0 did not answer within 2 s", as the kill lands
    assert re.search(r"shard 0 (is down|did not answer).*sampling goes on with the other shards", caplog.text)
    assert "shard 0 is back (restored 20 items" in caplog.text
    assert (status.restarts, status.restored, status.size) == (1, 20, 20)
    assert len(prio) == 44  # shard 0: its 20 checkpointed items; shard 1: all 24
    uids = set(prio.sample(2000)["uid"].tolist())
    assert uids == set(range(40)) | {41, 43, 45, 47}  # envs 0 and 2 lost 40, 42, 44, 46
    with pytest.raises(StaleIndexError, match=r"lost in a shard restart \(shard 0"):
        prio.update_priority([before[0]], [1.0])  # ids from before the crash are stale
    prio.update_priority([before[1]], [1.0])  # shard 1 was not restarted: its ids stand
