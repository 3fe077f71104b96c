"""The collector against a hand-written loop over the same seeded envs, in every autoreset mode."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xpbank import Collector, EnvContractError, ReplayBuffer, Spec
from xpbank.collect.collector import Episode, Mode, autoreset_mode

gym = pytest.importorskip("gymnasium")
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv  # noqa: E402

# Episode lengths per sub-env, cycled. Sub-env 0's first episode ends on its very first
# step; sub-envs 1 and 2 always end on the same step (one terminated, one truncated).
SCHEDULE = [[1, 2, 4], [3, 2], [3, 2]]
SEED = 7


class ScheduledEnv(gym.Env):
    """obs = [env, episode, t, noise]; episodes end on a schedule, alternately terminated
    and truncated; rewards are drawn from the env's seeded generator."""

    def __init__(self, env_id: int, schedule: list[list[int]] = SCHEDULE):
        self.env_id, self.lengths = env_id, schedule[env_id]
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.episode = -1

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.episode, self.t, self.noise], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode += 1
        self.t, self.noise = 0, float(self.np_random.random())
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.noise = float(self.np_random.random())
        reward = float(self.np_random.normal()) + 10.0 * int(action)
        ended = self.t == self.lengths[self.episode % len(self.lengths)]
        truncated = ended and (self.episode + self.env_id) % 2 == 1
        return self._obs(), reward, ended and not truncated, truncated, {}


def policy_np(obs: np.ndarray) -> np.ndarray:
    """Deterministic, depends on the whole observation row."""
    return ((obs[..., 0] + obs[..., 1] + 2 * obs[..., 2]).astype(np.int64)) % 3


def policy(obs: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(policy_np(obs.numpy()))


def value_fn(obs: torch.Tensor) -> torch.Tensor:
    return obs[:, 2] * 0.5 + obs[:, 3]


def make_envs(mode: str, num_envs: int = 3, kind: str = "sync", schedule: list[list[int]] = SCHEDULE) -> Any:
    fns = [lambda e=e: ScheduledEnv(e, schedule) for e in range(num_envs)]
    if kind == "sync":
        return SyncVectorEnv(fns, autoreset_mode=AutoresetMode(mode))
    return AsyncVectorEnv(fns, autoreset_mode=AutoresetMode(mode), context="fork")


def reference(
    mode: str, num_envs: int, steps: int, schedule: list[list[int]] = SCHEDULE
) -> tuple[list[dict[str, Any]], list[Episode], list[bool]]:
    """A plain loop over single envs, stepped in the vector env's order.

    Returns the transitions (vector step major, env minor), the finished episodes and,
    per (step, env), whether that row was a transition.
    """
    envs = [ScheduledEnv(e, schedule) for e in range(num_envs)]
    obs = [env.reset(seed=SEED + e)[0] for e, env in enumerate(envs)]
    pending = [False] * num_envs
    ret, length = [0.0] * num_envs, [0] * num_envs
    out, episodes, valid = [], [], []
    for _ in range(steps):
        for e, env in enumerate(envs):
            if pending[e]:  # NEXT_STEP: this step only resets the sub-env
                obs[e], pending[e] = env.reset()[0], False
                valid.append(False)
                continue
            action = int(policy_np(obs[e]))
            nxt, r, term, trunc, _ = env.step(action)
            out.append(
                {
                    "obs": obs[e],
                    "action": action,
                    "reward": np.float32(r),
                    "terminated": term,
                    "truncated": trunc,
                    "next_obs": nxt,
                }
            )
            valid.append(True)
            ret[e] += float(np.float32(r))
            length[e] += 1
            obs[e] = nxt
            if term or trunc:
                episodes.append(Episode(e, ret[e], length[e], trunc))
                ret[e], length[e] = 0.0, 0
                if mode == "NextStep":
                    pending[e] = True
                else:
                    obs[e] = env.reset()[0]
    return out, episodes, valid


def assert_same(stored: Any, expected: list[dict[str, Any]]) -> None:
    assert stored["obs"].shape[0] == len(expected)
    for key, name in [("obs", "obs"), (("next", "obs"), "next_obs"), ("action", "action")]:
        want = torch.as_tensor(np.stack([np.asarray(t[name]) for t in expected]))
        assert torch.equal(stored[key], want), key
    assert torch.equal(stored["reward"], torch.tensor([t["reward"] for t in expected]))
    for key in ("terminated", "truncated"):
        assert stored[key].tolist() == [t[key] for t in expected], key


MODES = ["NextStep", "SameStep", "Disabled"]


@pytest.mark.parametrize("mode", MODES)
def test_replay_buffer_holds_exactly_the_reference_transitions(mode: str) -> None:
    steps = 12
    expected, episodes, _ = reference(mode, 3, steps)
    envs = make_envs(mode)
    spec = Spec.from_gymnasium(envs.single_observation_space, envs.single_action_space)
    rb = ReplayBuffer(1000, spec)
    collector = Collector(envs, policy, rb)
    assert collector.mode is Mode(mode) and collector.declared
    collector.reset(seed=SEED)
    collector.collect(steps)
    envs.close()
    assert_same(rb.sample_all(), expected)
    assert collector.episodes == episodes
    assert collector.transitions == len(expected) and collector.vector_steps == steps
    # the cases this test exists for really happened
    assert Episode(0, episodes[0].ret, 1, False) == episodes[0]  # ended on its very first step
    # sub-envs 1 and 2 share a schedule, so they end on the same steps, as they did here
    assert [(e.env, e.truncated) for e in episodes if e.env > 0][:2] == [(1, True), (2, False)]
    assert any(t["truncated"] for t in expected) and any(t["terminated"] for t in expected)
    # the stored next obs at an episode end is the final observation, not a reset one
    ends = [t for t in expected if t["terminated"] or t["truncated"]]
    assert all(t["next_obs"][2] > 0 for t in ends)


@pytest.mark.parametrize("mode", MODES)
def test_async_vector_env_gives_the_same_transitions(mode: str) -> None:
    steps = 8
    expected, episodes, _ = reference(mode, 3, steps)
    envs = make_envs(mode, kind="async")
    rb = ReplayBuffer(100)
    collector = Collector(envs, policy, rb)
    collector.reset(seed=SEED)
    collector.collect(steps)
    envs.close()
    assert_same(rb.sample_all(), expected)
    assert collector.episodes == episodes


class ListSink:
    """Keeps every step as handed over: the reference for an on-policy [T, E] buffer."""

    def __init__(self) -> None:
        self.steps: list[dict[Any, torch.Tensor]] = []
        self.valid: list[torch.Tensor] = []

    def write(self, step: dict[Any, torch.Tensor], valid: torch.Tensor) -> None:
        self.steps.append({k: v.clone() for k, v in step.items()})
        self.valid.append(valid.clone())


def gae_per_env(rows: list[dict[str, Any]], gamma: float, lam: float) -> list[float]:
    """Brute-force GAE over one env's transitions in order (each a dict with reward,
    value, next_value, terminated, truncated): a truncation bootstraps from
    next_value and cuts the trace; a termination does not bootstrap."""
    adv = [0.0] * len(rows)
    for i in range(len(rows)):
        total, discount = 0.0, 1.0
        for row in rows[i:]:
            bootstrap = 0.0 if row["terminated"] else gamma * row["next_value"]
            total += discount * (row["reward"] + bootstrap - row["value"])
            if row["terminated"] or row["truncated"]:
                break
            discount *= gamma * lam
        adv[i] = total
    return adv


@pytest.mark.parametrize("mode", MODES)
def test_on_policy_steps_carry_next_values_from_the_true_final_obs(mode: str) -> None:
    steps, num_envs = 14, 3
    expected, _, valid = reference(mode, num_envs, steps)
    envs = make_envs(mode)
    sink = ListSink()

    def acting(obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return policy(obs), {"value": value_fn(obs)}

    collector = Collector(envs, acting, sink, value_fn=value_fn)
    collector.reset(seed=SEED)
    collector.collect(steps)
    envs.close()
    assert len(sink.steps) == steps
    assert all(s["obs"].shape == (num_envs, 4) for s in sink.steps)
    assert all(s["next", "value"].shape == (num_envs,) for s in sink.steps)
    assert torch.stack(sink.valid).flatten().tolist() == valid
    rows = [
        {k: s[k][e] for k in s}
        for s, v in zip(sink.steps, sink.valid, strict=True)
        for e in range(num_envs)
        if v[e]
    ]
    assert_same({k: torch.stack([r[k] for r in rows]) for k in rows[0]}, expected)
    for row, want in zip(rows, expected, strict=True):
        true_next = torch.from_numpy(want["next_obs"]).unsqueeze(0)
        assert torch.equal(row["next", "value"], value_fn(true_next)[0])
        assert torch.equal(row["value"], value_fn(torch.from_numpy(want["obs"]).unsqueeze(0))[0])
    # GAE from what the sink holds equals GAE from the hand-written loop, per env
    for e in range(num_envs):
        mine = [r for r in rows if int(r["obs"][0]) == e]
        theirs = [t for t in expected if int(t["obs"][0]) == e]
        got = gae_per_env(
            [
                {
                    "reward": float(r["reward"]),
                    "value": float(r["value"]),
                    "next_value": float(r["next", "value"]),
                    "terminated": bool(r["terminated"]),
                    "truncated": bool(r["truncated"]),
                }
                for r in mine
            ],
            0.9,
            0.8,
        )
        want = gae_per_env(
            [
                {
                    "reward": float(t["reward"]),
                    "value": float(value_fn(torch.from_numpy(t["obs"]).unsqueeze(0))[0]),
                    "next_value": float(value_fn(torch.from_numpy(t["next_obs"]).unsqueeze(0))[0]),
                    "terminated": t["terminated"],
                    "truncated": t["truncated"],
                }
                for t in theirs
            ],
            0.9,
            0.8,
        )
        assert got == pytest.approx(want, abs=1e-5)
    # at a truncation the bootstrap value is of the final obs (t > 0), not of a reset one
    truncated = [r for r in rows if r["truncated"]]
    assert truncated and all(float(r["next", "obs"][2]) > 0 for r in truncated)


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(MODES),
    schedule=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1, max_size=4),
    steps=st.integers(1, 16),
)
def test_any_schedule_any_mode_matches_the_reference(
    mode: str, schedule: list[list[int]], steps: int
) -> None:
    expected, episodes, valid = reference(mode, len(schedule), steps, schedule)
    envs = make_envs(mode, len(schedule), schedule=schedule)
    sink = ListSink()
    collector = Collector(envs, policy, sink)
    collector.reset(seed=SEED)
    collector.collect(steps)
    assert torch.stack(sink.valid).flatten().tolist() == valid
    stored = {
        k: torch.cat([s[k][v] for s, v in zip(sink.steps, sink.valid, strict=True)]) for k in sink.steps[0]
    }
    assert_same(stored, expected)
    assert collector.episodes == episodes and collector.transitions == len(expected)


def test_episodes_by_env_match_the_schedule() -> None:
    envs = make_envs("SameStep")
    collector = Collector(envs, policy, ReplayBuffer(100))
    collector.reset(seed=SEED)
    collector.collect(10)
    by_env = collector.episodes_by_env()
    assert by_env == [[ep for ep in collector.episodes if ep.env == e] for e in range(3)]
    # 10 steps of schedules [1, 2, 4], [3, 2], [3, 2], cycled
    assert [[ep.length for ep in eps] for eps in by_env] == [[1, 2, 4, 1, 2], [3, 2, 3, 2], [3, 2, 3, 2]]
    assert [[ep.truncated for ep in eps] for eps in by_env][1] == [True, False, True, False]


def _undeclared(envs: Any) -> Any:
    envs.metadata = {k: v for k, v in envs.metadata.items() if k != "autoreset_mode"}
    return envs


def test_env_without_metadata_is_taken_as_next_step_and_works_if_it_is() -> None:
    expected, episodes, _ = reference("NextStep", 3, 10)
    envs = _undeclared(make_envs("NextStep"))
    assert autoreset_mode(envs) == (Mode.NEXT_STEP, False)
    rb = ReplayBuffer(100)
    collector = Collector(envs, policy, rb)
    collector.reset(seed=SEED)
    collector.collect(10)
    assert_same(rb.sample_all(), expected)
    assert collector.episodes == episodes


def test_env_without_metadata_that_is_same_step_raises_and_writes_nothing() -> None:
    envs = _undeclared(make_envs("SameStep"))
    rb = ReplayBuffer(100)
    collector = Collector(envs, policy, rb)
    collector.reset(seed=SEED)
    msg = (
        "step 0: infos has 'final_obs', which only a SAME_STEP env returns, but the mode is "
        "NEXT_STEP (the env declares no autoreset_mode, so gymnasium's default NEXT_STEP was assumed"
    )
    with pytest.raises(EnvContractError, match=re.escape(msg)):
        collector.collect(5)  # sub-env 0 ends on step 0
    assert len(rb) == 0


class NeverResets:
    """A hand-rolled vector env that keeps reporting the end (a DISABLED env, undeclared)."""

    num_envs = 2
    metadata: dict[str, Any] = {}  # noqa: RUF012

    def reset(self, seed: int | None = None, options: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        return np.zeros((2, 1), np.float32), {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        return np.ones((2, 1), np.float32), np.ones(2), np.array([True, False]), np.zeros(2, bool), {}


def test_a_reset_step_that_is_not_a_reset_raises() -> None:
    rb = ReplayBuffer(100)
    collector = Collector(NeverResets(), lambda obs: torch.zeros(2, dtype=torch.int64), rb)
    msg = (
        "step 1, sub-env 0: expected a NEXT_STEP reset step (reward 0, not terminated or truncated) "
        "after its episode ended, got reward 1.0, terminated True, truncated False (the env declares"
    )
    with pytest.raises(EnvContractError, match=re.escape(msg)):
        collector.collect(3)
    assert len(rb) == 2  # step 0 was fine and stored; step 1 wrote nothing


def test_unknown_autoreset_mode_in_metadata_raises() -> None:
    envs = NeverResets()
    envs.metadata = {"autoreset_mode": "Sometimes"}
    with pytest.raises(EnvContractError, match=re.escape("envs.metadata['autoreset_mode']: expected one of")):
        Collector(envs, policy, ReplayBuffer(10))


def test_steps_must_be_positive() -> None:
    collector = Collector(make_envs("SameStep"), policy, ReplayBuffer(10))
    with pytest.raises(ValueError, match=re.escape("steps: expected a positive int, got 0")):
        collector.collect(0)


def test_readme_collecting_example_runs_and_stores_what_it_says() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "collecting.md").read_text()
    match = re.search(r"## Into a replay buffer\n\n```python\n(.*?)```", text, re.S)
    assert match is not None, "the collecting guide has no replay-buffer code block"
    scope: dict[str, Any] = {}
    exec(compile(match.group(1), "docs/guides/collecting.md", "exec"), scope)
    rb, collector = scope["rb"], scope["collector"]
    assert collector.vector_steps == 200 and len(rb) == collector.transitions
    # NEXT_STEP (the default): each finished episode costs one reset step that is not
    # stored, except for episodes that ended on the last step (at most one per sub-env)
    skipped = 200 * 8 - collector.transitions
    assert len(collector.episodes) - 8 <= skipped <= len(collector.episodes)
    assert len(collector.episodes) >= 8
