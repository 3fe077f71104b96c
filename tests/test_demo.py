"""The ``xpbank demo`` command line and the SAC example, briefly (smoke runs, few hundred steps)."""

from __future__ import annotations

import importlib.util
import json
import re
import runpy
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

pytest.importorskip("gymnasium")
typer_testing = pytest.importorskip("typer.testing")
pytest.importorskip("rich")
pytest.importorskip("tqdm")
pytest.importorskip("matplotlib")

import xpbank  # noqa: E402
from xpbank.demo import dqn  # noqa: E402
from xpbank.tools import cli  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_demo_command_trains_saves_reloads_and_reports(tmp_path: Path) -> None:
    runner = typer_testing.CliRunner()
    args = ["demo", "--steps", "1100", "--seed", "3", "--out", str(tmp_path / "out"), "--no-progress"]
    result = runner.invoke(cli.build_app(), args)
    assert result.exit_code == 0, result.output
    bank = xpbank.load(tmp_path / "out" / "dqn_replay_bank")
    assert bank.spec is not None and ("next", "obs") in bank.spec
    items = bank.sample_all()
    ends = int((items["terminated"] | items["truncated"]).sum())
    # each episode end costs its env one NEXT_STEP reset row (not stored), unless it
    # happened on the last of the 275 vector steps of the 4 envs
    assert 1_100 <= len(bank) + ends <= 1_100 + 4 and ends > 10
    assert bank.episodes is not None and bank.episodes.num_envs == 4 and "nstep_return" in bank.sample(2)
    png = (tmp_path / "out" / "learning_curves.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    summary = (tmp_path / "out" / "summary.md").read_text()  # the printed table, kept beside the PNG
    assert "| DQN | CartPole-v1 | 1,100 |" in summary and "| PPO | CartPole-v1 |" in summary
    assert "One seed (3)." in summary and "CPU" in summary
    assert "greedy eval" in result.output and "DQN" in result.output and "1,100" in result.output
    assert "PPO" in result.output  # both agents by default


def test_save_and_reload_keeps_the_buffers_options(tmp_path: Path) -> None:
    config = dqn.DQNConfig(num_envs=2, n_step=3)
    spec = xpbank.Spec(
        {"obs": xpbank.Field(4), "action": xpbank.Field((), torch.int64), "reward": xpbank.Field(())}
    )
    rb = dqn.make_buffer(spec, config)
    env = torch.tensor([0, 1, 0, 1, 1, 1])
    rb.extend({"obs": torch.randn(6, 4), "action": env, "reward": torch.ones(6), "env_id": env})
    rb.update_priority(torch.arange(6), torch.arange(6.0))
    assert cli.save_and_reload(rb, tmp_path / "bank") > 6 * 4 * 4
    loaded = xpbank.load(tmp_path / "bank")
    loaded.sample(64)  # save_and_reload drew one sample from the saved buffer to check it
    a, b = rb.sample(32), loaded.sample(32)
    assert torch.equal(a["index"], b["index"]) and 0 not in a["index"].tolist()  # priority 0
    assert torch.equal(a["nstep_return"], b["nstep_return"]) and a["nstep_steps"].max() == 3
    assert loaded.episodes is not None and loaded.episodes.num_envs == 2


def test_demo_rejects_unknown_agents(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("agents: expected some of ['dqn', 'ppo'], got ['sac']")):
        cli.run_demo(agents=("sac",), out=tmp_path)
    result = typer_testing.CliRunner().invoke(cli.build_app(), ["demo", "--agents", "ppo,a2c"])
    assert (
        result.exit_code == 2
        and "agents: expected some of ['dqn', 'ppo'], got ['ppo', 'a2c']" in result.output
    )


def test_python_dash_m_xpbank_shows_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["xpbank", "demo", "--help"])
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("xpbank", run_name="__main__")
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for option in ("--env-id", "--steps", "--seed", "--out", "--agents", "--no-progress"):
        assert option in out


def test_missing_extra_names_the_pip_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from xpbank import errors

    def missing(module: str, extra: str) -> None:
        errors.require("xpbank_not_installed", extra)

    monkeypatch.setattr(cli, "require", missing)
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo"])
    assert exc.value.code == 2
    assert "pip install -e '.[demo]' in a clone of xpbank" in capsys.readouterr().err


def _load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sac_pendulum_example_runs_a_few_hundred_steps() -> None:
    sac = _load_example("sac_pendulum")
    args = sac.parse_args(["--steps", "300", "--learning-starts", "220", "--hidden", "32"])
    args.batch_size, args.eval_episodes = 32, 1
    result = sac.train(args)
    assert result["buffer_items"] == 300
    assert result["episodes"] == 1 and result["truncated_episodes"] == 1  # 200-step time limit
    assert -2_000.0 < result["eval_return"] <= 0.0  # Pendulum's rewards are in [-16.3, 0]


def test_dqn_prioritized_nstep_example_runs_a_few_hundred_steps() -> None:
    example = _load_example("dqn_prioritized_nstep")
    args = ["--steps", "400", "--learning-starts", "200", "--train-freq", "100", "--gradient-steps", "4"]
    out = example.main([*args, "--eval-episodes", "1", "--buffer-size", "1000"])
    assert out["env_steps"] == 400 and 300 < out["buffer_items"] <= 400  # less the reset rows
    assert 8.0 <= out["eval_return"] <= 500.0


def test_ppo_example_runs_a_few_hundred_steps() -> None:
    example = _load_example("ppo_cartpole")
    out = example.main(["--steps", "512", "--epochs", "2", "--eval-episodes", "1"])
    assert out["env_steps"] >= 512 and out["episodes"] > 0 and 8.0 <= out["eval_return"] <= 500.0


def test_recurrent_ppo_example_runs_a_few_hundred_steps() -> None:
    example = _load_example("recurrent_ppo_masked_cartpole")
    args = example.parse_args(["--steps", "512", "--horizon", "32", "--epochs", "2", "--eval-episodes", "1"])
    out = example.train(args)
    assert out["env_steps"] >= 512 and out["episodes"] > 0 and 8.0 <= out["eval_return"] <= 500.0
    envs = example.gym.make_vec("CartPole-v1", 2, vectorization_mode="sync", wrappers=[example.MaskVelocity])
    obs = envs.reset(seed=0)[0]
    assert obs.shape == (2, 2)  # only position and angle are observed, scaled by the thresholds
    full = example.gym.make_vec("CartPole-v1", 2, vectorization_mode="sync").reset(seed=0)[0]
    np.testing.assert_allclose(obs, full[:, [0, 2]] / [2.4, 12 * 2 * np.pi / 360], rtol=1e-6)


def test_warm_start_sac_example_quick_writes_both_curves_and_the_summary(tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3")
    example = _load_example("warm_start_sac")
    out = example.main(["--quick", "--out", str(tmp_path / "ws"), "--thresholds", "-3300", "0.1"])
    bank = xpbank.open_bank(tmp_path / "ws" / "prior_bank")
    assert len(bank) == 400 and bank.spec is not None and ("next", "obs") in bank.spec  # phase 1's replay
    assert [(r["arm"], r["seed"]) for r in out["runs"]] == [("scratch", 0), ("warm", 0)]
    for run in out["runs"]:
        assert [step for step, _ in run["curve"]] == [0, 100, 200, 300]  # before training, then every 100
        assert all(-3_300.0 < ret <= 0.0 for _, ret in run["curve"])  # 200 steps of rewards in [-16.3, 0]
        assert run["steps_to"] == {"-3300.0": 0, "0.1": None}  # every return is above one, below the other
    assert out["summary"]["warm"]["-3300.0"] == {
        "per_seed": [0],
        "reached": 1,
        "median": 0.0,
        "min": 0.0,
        "max": 0.0,
    }
    assert out["summary"]["scratch"]["0.1"] == {
        "per_seed": [None],
        "reached": 0,
        "median": None,
        "min": None,
        "max": None,
    }
    saved = json.loads((tmp_path / "ws" / "summary.json").read_text())
    assert saved["summary"] == out["summary"] and "CPU" in saved["note"]
    assert saved["command"].endswith("--quick --out " + str(tmp_path / "ws") + " --thresholds -3300 0.1")
    rows = (tmp_path / "ws" / "curves.csv").read_text().splitlines()
    assert rows[0] == "arm,seed,env_step,eval_return" and len(rows) == 1 + 2 * 4
    assert (tmp_path / "ws" / "curves.png").read_bytes().startswith(b"\x89PNG")
    bank_path = str(tmp_path / "ws" / "prior_bank")
    args = ["--quick", "--out", str(tmp_path / "ws2"), "--bank", bank_path, "--arms", "warm", "--anneal"]
    again = example.main(args)
    assert again["prior"] == {"bank": bank_path, "curve": None}  # no phase 1
    assert [r["arm"] for r in again["runs"]] == ["warm"] and list(again["summary"]) == ["warm"]


@pytest.mark.parametrize(
    "name", ["dqn_prioritized_nstep", "ppo_cartpole", "recurrent_ppo_masked_cartpole", "warm_start_sac"]
)
def test_examples_have_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    if name == "warm_start_sac":
        pytest.importorskip("stable_baselines3")
    example = _load_example(name)
    with pytest.raises(SystemExit) as exc:
        (example.main if hasattr(example, "main") else example.parse_args)(["--help"])
    assert exc.value.code == 0 and "--steps" in capsys.readouterr().out
