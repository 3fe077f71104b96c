"""End to end with real gymnasium environments: collect, store, read back, train briefly."""

from __future__ import annotations

from pathlib import Path

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


def test_demo_dqn_trains_through_the_collector_and_resumes_identically(tmp_path: Path) -> None:
    from xpbank.demo.dqn import DQNConfig, train
    from xpbank.tools.cli import save_and_reload

    config = DQNConfig(steps=1_600, seed=1, learning_starts=500, train_freq=100, gradient_steps=8, hidden=64)
    result = train(config)
    stored = result.buffer.sample_all()
    done = stored["terminated"] | stored["truncated"]
    # 4 envs, NEXT_STEP: each episode end costs its env one reset row (not stored), except
    # on the very last vector step
    assert result.env_steps == 1_600 and 1_600 <= len(result.buffer) + int(done.sum()) <= 1_604
    assert len(result.curve) >= 10 and [s for s, _ in result.curve] == sorted(s for s, _ in result.curve)
    assert sum(r for _, r in result.curve) <= 1_600  # CartPole pays 1 per step
    bursts = len(range(500, 1_601, 100))  # a sample and a priority update per minibatch
    assert 380 <= result.buffer_ops - 2 * 8 * bursts <= 400  # at most one extend per vector step
    assert 8.0 <= result.eval_return <= 500.0
    assert save_and_reload(result.buffer, tmp_path / "replay_bank") > 1_400 * 4 * 8
    for env in range(4):  # within one env, next obs of t is obs of t+1 unless t ended
        mine = stored["env_id"] == env
        obs, nxt, ended = stored["obs"][mine], stored["next", "obs"][mine], done[mine]
        chained = torch.all(nxt[:-1] == obs[1:], dim=-1)
        assert bool(chained[~ended[:-1]].all()) and not bool(chained[ended[:-1]].any())
