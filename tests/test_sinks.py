"""The collector's sinks against brute-force references built from a hand-written loop.

RolloutSink: what a ``[T, E]`` RolloutBuffer holds and the GAE it computes, per env, equal
the first ``T`` transitions of each env of the hand-written loop and a brute-force GAE
over them (bootstrapping from the true final observation at truncations and from the
next observation at the end of the rollout). ReplaySink: the n-step targets of a
``num_envs`` buffer filled by the collector equal brute-force n-step returns over each
env's episodes, in every autoreset mode (NEXT_STEP leaves the envs out of step).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
import torch

from test_collect import (
    MODES,
    SCHEDULE,
    SEED,
    assert_same,
    gae_per_env,
    make_envs,
    policy,
    reference,
    value_fn,
)
from xpbank import Collector, NStep, ReplayBuffer, RolloutBuffer, RolloutSink, Spec, SpecError

pytest.importorskip("gymnasium")


def acting(obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    return policy(obs), {"value": value_fn(obs)}


def per_env(expected: list[dict[str, Any]], num_envs: int) -> list[list[dict[str, Any]]]:
    return [[t for t in expected if int(t["obs"][0]) == e] for e in range(num_envs)]


def brute_gae(rows: list[dict[str, Any]], gamma: float, lam: float) -> list[float]:
    def v(x: np.ndarray) -> float:
        return float(value_fn(torch.from_numpy(x).unsqueeze(0))[0])

    return gae_per_env(
        [
            {
                "reward": float(t["reward"]),
                "value": v(t["obs"]),
                "next_value": v(t["next_obs"]),
                "terminated": t["terminated"],
                "truncated": t["truncated"],
            }
            for t in rows
        ],
        gamma,
        lam,
    )


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("horizon", [1, 5, 9])
def test_rollout_sink_holds_each_envs_first_transitions_and_their_gae(mode: str, horizon: int) -> None:
    num_envs, gamma, lam = 3, 0.9, 0.8
    envs = make_envs(mode)
    rollout = RolloutBuffer(num_envs, horizon)
    sink = RolloutSink(rollout)
    collector = Collector(envs, acting, sink, value_fn=value_fn)
    collector.reset(seed=SEED)
    while not sink.ready():
        collector.collect(1)
    envs.close()
    expected, _, _ = reference(mode, num_envs, collector.vector_steps)
    adv, ret = sink.compute_returns(gamma, lam)
    grid = torch.stack(list(rollout.steps()))  # [T, E]
    stored = 0
    for e, rows in enumerate(per_env(expected, num_envs)):
        mine = rows[:horizon]
        assert_same(grid[:, e], mine)
        want = brute_gae(mine, gamma, lam)
        assert adv[:, e].tolist() == pytest.approx(want, abs=1e-5)
        values = [float(value_fn(torch.from_numpy(t["obs"]).unsqueeze(0))[0]) for t in mine]
        assert ret[:, e].tolist() == pytest.approx(np.add(want, values).tolist(), abs=1e-5)
        stored += len(rows)
    # every transition of the loop is stored or counted as dropped (a full env's extra rows)
    assert sink.dropped == stored - horizon * num_envs == collector.transitions - horizon * num_envs
    if mode == "NextStep" and horizon == 9:
        assert sink.dropped > 0  # the envs really went out of step
    # the truncations of the schedule really were bootstrapped from a final observation
    assert bool(grid["truncated"].any()) == (horizon > 1)


def test_rollout_sink_second_rollout_continues_each_env() -> None:
    envs = make_envs("NextStep")
    sink = RolloutSink(RolloutBuffer(3, 4))
    collector = Collector(envs, acting, sink, value_fn=value_fn)
    collector.reset(seed=SEED)
    firsts = []
    for _ in range(2):
        while not sink.ready():
            collector.collect(1)
        sink.compute_returns(0.9, 0.8)
        firsts.append(next(sink.rollout.steps())["obs"].clone())
        sink.clear()
    envs.close()
    expected, _, _ = reference("NextStep", 3, collector.vector_steps)
    # the second rollout starts where each env was (dropped rows are skipped, not reordered)
    for e, rows in enumerate(per_env(expected, 3)):
        assert torch.equal(firsts[0][e], torch.from_numpy(rows[0]["obs"]))
        later = [torch.from_numpy(t["obs"]) for t in rows[4:]]
        assert any(torch.equal(firsts[1][e], o) for o in later)


def test_rollout_sink_without_value_fn_raises_and_stores_nothing() -> None:
    envs = make_envs("SameStep")
    rollout = RolloutBuffer(3, 4)
    collector = Collector(envs, acting, RolloutSink(rollout))
    collector.reset(seed=SEED)
    with pytest.raises(
        SpecError, match=re.escape("the step has no ('next', 'value'): build the Collector with a value_fn")
    ):
        collector.collect(1)
    envs.close()
    assert len(rollout) == 0


def brute_nstep(rows: list[dict[str, Any]], n: int, gamma: float) -> list[tuple[float, float, np.ndarray]]:
    """Per item of one env (in order): n-step return, discount and the window's next obs."""
    out = []
    for i in range(len(rows)):
        total, k = 0.0, 0
        for row in rows[i : i + n]:
            total += gamma**k * float(row["reward"])
            k += 1
            if row["terminated"] or row["truncated"]:
                break
        last = rows[i + k - 1]
        out.append((total, 0.0 if last["terminated"] else gamma**k, last["next_obs"]))
    return out


@pytest.mark.parametrize("mode", MODES)
def test_replay_sink_nstep_targets_match_brute_force_per_env(mode: str) -> None:
    steps, num_envs, n, gamma = 14, 3, 3, 0.9
    envs = make_envs(mode)
    spec = Spec.from_gymnasium(envs.single_observation_space, envs.single_action_space)
    spec = Spec({**dict(spec.items()), "env_id": spec["action"]})
    rb = ReplayBuffer(1000, spec, num_envs=num_envs, nstep=NStep(n, gamma), seed=0)
    collector = Collector(envs, policy, rb)
    collector.reset(seed=SEED)
    collector.collect(steps)
    envs.close()
    expected, _, _ = reference(mode, num_envs, steps)
    batch = rb.sample(len(rb), replace=False)
    order = torch.argsort(batch["index"])
    assert batch["index"][order].tolist() == list(range(len(expected)))
    want: dict[int, tuple[float, float, np.ndarray]] = {}
    for e, rows in enumerate(per_env(expected, num_envs)):
        ids = [i for i, t in enumerate(expected) if int(t["obs"][0]) == e]
        want.update(zip(ids, brute_nstep(rows, n, gamma), strict=True))
    for i in order.tolist():
        item = int(batch["index"][i])
        ret, disc, nxt = want[item]
        assert float(batch["nstep_return"][i]) == pytest.approx(ret, abs=1e-5), item
        assert float(batch["nstep_discount"][i]) == pytest.approx(disc, abs=1e-6), item
        assert torch.equal(batch["next", "obs"][i], torch.from_numpy(nxt)), item
        assert int(batch["env_id"][i]) == int(expected[item]["obs"][0])


def test_lockstep_buffer_without_env_field_refuses_a_partial_step() -> None:
    envs = make_envs("NextStep")
    spec = Spec.from_gymnasium(envs.single_observation_space, envs.single_action_space)
    rb = ReplayBuffer(100, spec, num_envs=3)
    collector = Collector(envs, policy, rb)
    collector.reset(seed=SEED)
    collector.collect(1)  # sub-env 0 ends on its first step; the next step resets it
    before = rb.sample_all()
    msg = "sub-env(s) [0] are resetting (not transitions), so this step is not a whole step of the "
    with pytest.raises(
        SpecError, match=re.escape(msg + "buffer's num_envs=3 envs; give its spec a 'env_id' field")
    ):
        collector.collect(1)
    envs.close()
    assert len(rb) == 3 and torch.equal(rb.sample_all()["obs"], before["obs"])
    assert SCHEDULE[0][0] == 1
