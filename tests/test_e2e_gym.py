"""End to end with real gymnasium environments: collect, store, read back, train briefly."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from xpbank import ReplayBuffer, Spec

gym = pytest.importorskip("gymnasium")


def _collect(env_id: str, steps: int, seed: int) -> tuple[Spec, list[dict[str, object]]]:
    env = gym.make(env_id)
    env.action_space.seed(seed)
    spec = Spec.from_gymnasium(env.observation_space, env.action_space)
    obs, _ = env.reset(seed=seed)
    out = []
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        out.append(
            {
                "obs": obs,
                "action": np.asarray(action, dtype=np.float32 if env_id == "Pendulum-v1" else np.int64),
                "reward": np.float32(reward),
                "terminated": bool(terminated),
                "truncated": bool(truncated),
                ("next", "obs"): next_obs,
            }
        )
        obs = env.reset()[0] if terminated or truncated else next_obs
    env.close()
    return spec, out


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_collected_transitions_read_back_exactly(env_id: str, storage: str) -> None:
    spec, transitions = _collect(env_id, 700, seed=3)
    rb = ReplayBuffer(500, spec, storage=storage, seed=0)
    for t in transitions[:300]:
        rb.add(t)
    rest = transitions[300:]
    rb.extend({key: np.stack([np.asarray(t[key]) for t in rest]) for key in spec})
    assert len(rb) == 500 and rb.is_full

    stored = rb.sample_all()
    kept = transitions[-500:]
    for key in spec:
        expected = torch.as_tensor(np.stack([np.asarray(t[key]) for t in kept]))
        assert torch.equal(stored[key], expected), key
    # consecutive items chain: next obs of t is obs of t+1 unless the episode ended at t
    done = stored["terminated"] | stored["truncated"]
    chained = torch.all(stored["next", "obs"][:-1] == stored["obs"][1:], dim=-1)
    assert torch.equal(chained[~done[:-1]], torch.ones(int((~done[:-1]).sum()), dtype=torch.bool))
    if env_id == "Pendulum-v1":  # time limit only: truncations, never terminations
        assert stored["truncated"].sum() >= 2 and not stored["terminated"].any()
    else:
        assert stored["terminated"].sum() >= 5


def _load_demo() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "examples" / "dqn_cartpole.py"
    spec = importlib.util.spec_from_file_location("dqn_cartpole", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_demo_trains_and_resumes_identically() -> None:
    demo = _load_demo()
    result = demo.train(steps=1_600, seed=1)
    assert result["steps"] == 1_600 and result["buffer_items"] == 1_600
    assert result["episodes"] >= 10
    assert result["resume_samples_identical"] is True
    assert 8.0 <= result["greedy_eval_return"] <= 500.0
