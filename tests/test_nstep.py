"""N-step returns against a brute-force reference over random multi-env episode streams."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xpbank import CapacityError, NStep, PrioritizedSampler, ReplayBuffer, SpecError, nstep_return

GAMMA = 0.9


def test_pure_function_hand_worked() -> None:
    rewards = np.array([[1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [1.0, 2.0, 4.0], [5.0, 0.0, 0.0]])
    valid = np.array([[1, 1, 1], [1, 1, 0], [1, 1, 0], [1, 0, 0]], dtype=bool)
    terminated = np.array([False, True, False, True])
    ret, disc, steps = nstep_return(rewards, valid, terminated, GAMMA)
    assert ret.tolist() == pytest.approx([1 + 1.8 + 4 * 0.81, 2.8, 2.8, 5.0])
    assert disc.tolist() == pytest.approx([0.729, 0.0, 0.81, 0.0])  # truncation keeps gamma**k
    assert steps.tolist() == [3, 2, 2, 1]
    assert ret.dtype == np.float32 and disc.dtype == np.float32


class Log:
    """Every item since the last clear, and the expected n-step target of each."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, float, bool, bool]] = []  # id, env, reward, term, trunc

    def target(self, x: int, n: int) -> tuple[float, float, int, int, bool]:
        env = next(r[1] for r in self.rows if r[0] == x)
        stream = [r for r in self.rows if r[1] == env]
        p = [r[0] for r in stream].index(x)
        ret, k = 0.0, 0
        while True:
            ret += GAMMA**k * stream[p][2]
            k += 1
            if k == n or stream[p][3] or stream[p][4] or p + 1 == len(stream):
                break
            p += 1
        last = stream[p]
        return ret, 0.0 if last[3] else GAMMA**k, k, last[0], last[3]


def _batch(ids: np.ndarray, envs: np.ndarray, rng: np.random.Generator, torchrl: bool, env_field: bool):
    n = len(ids)
    reward = rng.normal(size=n).astype(np.float32)
    term = rng.random(n) < 0.12
    trunc = (rng.random(n) < 0.08) & ~term
    obs = torch.as_tensor(ids, dtype=torch.float32)[:, None]
    if torchrl:
        data = {"obs": obs, "next": {"obs": obs + 0.5, "reward": torch.as_tensor(reward)[:, None],
                                     "terminated": torch.as_tensor(term)[:, None],
                                     "truncated": torch.as_tensor(trunc)[:, None]}}  # fmt: skip
    else:
        data = {"obs": obs, "next_obs": obs + 0.5, "reward": torch.as_tensor(reward),
                "terminated": torch.as_tensor(term), "truncated": torch.as_tensor(trunc)}  # fmt: skip
    if env_field:
        data["env_id"] = torch.as_tensor(envs)
    return data, reward, term, trunc


def run_stream(seed: int, sampler, torchrl: bool, env_field: bool, n: int = 3, capacity: int = 31) -> None:
    rng = np.random.default_rng(seed)
    num_envs = 3
    rb = ReplayBuffer(
        capacity, num_envs=None if env_field else num_envs, nstep=NStep(n, GAMMA), sampler=sampler, seed=seed
    )
    log, next_id = Log(), 0
    next_key = ("next", "obs") if torchrl else "next_obs"
    term_key = ("next", "terminated") if torchrl else "terminated"
    for step in range(40):
        if env_field:
            envs = rng.integers(0, num_envs, int(rng.integers(1, 7)))
        else:
            envs = np.tile(np.arange(num_envs), int(rng.integers(1, 3)))
        ids = np.arange(next_id, next_id + len(envs))
        data, reward, term, trunc = _batch(ids, envs, rng, torchrl, env_field)
        rb.extend(data)
        log.rows += [(int(i), int(e), float(r), bool(a), bool(b)) for i, e, r, a, b in
                     zip(ids, envs, reward, term, trunc, strict=True)]  # fmt: skip
        next_id += len(envs)
        if step == 25:
            rb.clear()
            next_id = -(-next_id // capacity) * capacity
            log.rows = []
            continue
        batch = rb.sample(48)
        for row, x in enumerate(batch["index"].tolist()):
            ret, disc, k, last, last_term = log.target(x, n)
            assert batch["nstep_return"][row].item() == pytest.approx(ret, rel=1e-5, abs=1e-5)
            assert batch["nstep_discount"][row].item() == pytest.approx(disc, rel=1e-6)
            assert batch["nstep_steps"][row].item() == k
            assert bool(batch["nstep_terminated"][row]) == last_term
            assert batch[next_key][row].item() == last + 0.5  # next obs of item t+k-1
            assert bool(batch[term_key][row].reshape(-1)[0]) == last_term
            assert batch["obs"][row].item() == x  # the item itself is unchanged


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("env_field", [False, True])
def test_uniform_matches_reference_across_envs_ends_and_wraps(seed: int, env_field: bool) -> None:
    run_stream(seed, None, torchrl=False, env_field=env_field)


@pytest.mark.parametrize("seed", range(2))
def test_prioritized_and_torchrl_keys_match_reference(seed: int) -> None:
    run_stream(seed, PrioritizedSampler(), torchrl=True, env_field=seed == 1, n=4)


def test_one_step_and_priorities_stay_per_item() -> None:
    run_stream(5, None, torchrl=False, env_field=False, n=1)
    rb = ReplayBuffer(10, num_envs=1, nstep=NStep(3, GAMMA), sampler=PrioritizedSampler(alpha=1.0, eps=0.0))
    rb.extend({"obs": torch.zeros(4), "reward": torch.ones(4)})
    rb.update_priority([0, 1, 2, 3], [0.0, 0.0, 0.0, 1.0])
    batch = rb.sample(16)
    assert set(batch["index"].tolist()) == {3}
    assert batch["nstep_steps"].tolist() == [1] * 16  # newest item: shorter window


def test_newest_items_get_shorter_windows_and_never_read_ahead() -> None:
    rb = ReplayBuffer(6, num_envs=2, nstep=NStep(3, GAMMA), seed=0)
    for t in range(4):  # 8 items in a ring of 6: wrapped
        rb.extend(
            {
                "obs": torch.full((2,), float(t)),
                "next_obs": torch.full((2,), t + 1.0),
                "reward": torch.ones(2),
            }
        )
    batch = rb.sample(200)
    by_id = {i: (k, nxt) for i, k, nxt in zip(batch["index"].tolist(), batch["nstep_steps"].tolist(),
                                                batch["next_obs"].tolist(), strict=True)}  # fmt: skip
    assert by_id == {2: (3, 4.0), 3: (3, 4.0), 4: (2, 4.0), 5: (2, 4.0), 6: (1, 4.0), 7: (1, 4.0)}


def test_fields_selection_and_bad_options() -> None:
    rb = ReplayBuffer(10, num_envs=1, nstep=NStep(2, GAMMA), seed=0)
    rb.extend({"obs": torch.zeros(3), "next_obs": torch.ones(3), "reward": torch.ones(3)})
    assert set(rb.sample(4, fields=["obs"]).keys()) == {
        "obs", "index", "nstep_return", "nstep_discount", "nstep_steps", "nstep_terminated"}  # fmt: skip
    with pytest.raises(SpecError, match=r"gamma: expected a number in \[0, 1\], got 1.5"):
        NStep(3, 1.5)
    with pytest.raises(CapacityError, match=r"n: expected a positive int, got 0"):
        NStep(0, 0.9)
    with pytest.raises(SpecError, match=r"nstep: expected an NStep or None, got int"):
        ReplayBuffer(10, nstep=3)  # type: ignore[arg-type]
    no_reward = ReplayBuffer(10, nstep=NStep(2, GAMMA))
    no_reward.extend({"obs": torch.zeros(3)})
    with pytest.raises(SpecError, match=r"nstep: no reward field \('next.reward' or 'reward'\) in the spec"):
        no_reward.sample(2)
    wide = ReplayBuffer(10, nstep=NStep(2, GAMMA))
    wide.extend({"reward": torch.zeros(3, 2)})
    with pytest.raises(SpecError, match=r"field 'reward' \(reward\): expected one number per item"):
        wide.sample(2)


def test_state_round_trips_through_torch_save_weights_only(tmp_path) -> None:
    """Episode index, priorities and n-step option together: a saved and reloaded buffer
    (``weights_only=True``) samples exactly what the original does."""
    kwargs = {"num_envs": 2, "nstep": NStep(3, GAMMA)}
    rb = ReplayBuffer(9, sampler=PrioritizedSampler(beta_steps=5), seed=4, **kwargs)
    rng = np.random.default_rng(0)
    for _ in range(7):  # 14 items in a ring of 9
        rb.extend({"obs": torch.randn(2, 3), "reward": torch.randn(2),
                   "terminated": torch.as_tensor(rng.random(2) < 0.3)})  # fmt: skip
    rb.update_priority(rb.sample(4)["index"], torch.rand(4), stale="skip")
    torch.save(rb.state_dict(), tmp_path / "state.pt")
    other = ReplayBuffer(9, sampler=PrioritizedSampler(beta_steps=5), **kwargs)
    other.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    a, b = rb.sample(16), other.sample(16)
    for key in ("index", "weight", "nstep_return", "nstep_discount", "nstep_steps", "obs"):
        assert torch.equal(a[key], b[key]), key


def test_readme_example_runs() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "prioritized-nstep.md").read_text()
    header = "# Prioritized replay and n-step"
    match = re.search(header + r"\n\n```python\n(.*?)```", text, re.S)
    assert match is not None
    scope: dict[str, object] = {}
    exec(compile(match.group(1), "docs/guides/prioritized-nstep.md", "exec"), scope)
    batch = scope["batch"]
    assert set(batch.keys()) >= {"weight", "nstep_return", "nstep_discount", "index"}
    assert len(scope["rb"]) == 200  # type: ignore[arg-type]


def test_config_is_json_able() -> None:
    import json

    option = NStep(3, 0.99, reward_key=("next", "reward"), next_keys=[("next", "obs")])
    assert json.loads(json.dumps(option.config())) == {
        "n": 3, "gamma": 0.99, "reward_key": ["next", "reward"], "next_keys": [["next", "obs"]]}  # fmt: skip
    assert NStep(**json.loads(json.dumps(option.config()))) == option
    with pytest.raises(SpecError, match=r"gamma: expected a number in \[0, 1\], got nan"):
        NStep(3, float("nan"))
