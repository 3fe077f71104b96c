"""Warm-start SAC on Pendulum-v1 from the replay bank of a previous run, against scratch.

Phase 1 trains SB3's SAC from scratch with xpbank's buffer (``XpbankReplayBuffer``) and
saves its replay as a bank: the "previous run". Phase 2, for each seed, trains two new
agents with the same hyperparameters and evaluates both every ``--eval-every`` steps
(deterministic policy, the same ``--eval-episodes`` start states at every point):

- ``scratch``: SAC with an empty ``XpbankReplayBuffer``;
- ``warm``: SAC with ``XpbankMixtureReplayBuffer``: every batch holds exactly half its
  items from the old bank (opened read-only, memory-mapped) and half from the new run's
  own buffer (``--anneal``: the bank's share goes linearly from 0.5 to 0 over the run).
  Only the data is reused: the networks start from scratch in both arms.

It prints, for each arm, the env steps each seed needed to reach each return threshold
(median and range over seeds), and writes ``curves.png``, ``summary.json`` and
``curves.csv`` to ``--out``. The numbers depend on the CPU (floating-point rounding
sends runs of one seed down other paths on another machine): compare ranges over seeds.

    python examples/warm_start_sac.py [--prior-steps 10000] [--steps 8000] [--seeds 0 1 2]
    python examples/warm_start_sac.py --bank runs/my_bank --arms warm --anneal  # an existing bank
    python examples/warm_start_sac.py --quick   # a smoke run of a few seconds
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import logging
import os
import platform
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import SAC
from stable_baselines3.common.callbacks import BaseCallback

from xpbank.demo.evaluate import evaluate  # mean return of the deterministic policy
from xpbank.integrations.sb3 import XpbankMixtureReplayBuffer, XpbankReplayBuffer
from xpbank.mix import Linear

log = logging.getLogger("warm_start_sac")
ENV_ID = "Pendulum-v1"
ARMS = ("scratch", "warm")
PRIOR_SEED = 1_000  # phase 1's seed: not one of phase 2's, so no scratch run repeats it
NOTE = (
    "Exact numbers depend on the CPU (rounding differences early in training send a seed's run "
    "down another path): compare the ranges over seeds, not single runs."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prior-steps", type=int, default=10_000, help="env steps of the previous run (phase 1)")
    p.add_argument("--bank", type=Path, default=None, help="warm-start from this bank (skips phase 1)")
    p.add_argument("--steps", type=int, default=8_000, help="env steps of each phase-2 run")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--offline-share", type=float, default=0.5, help="the bank's share of each batch")
    p.add_argument("--anneal", action="store_true", help="the bank's share goes linearly to 0 over the run")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="phase-2 agents to train")
    p.add_argument("--thresholds", type=float, nargs="+", default=[-300.0, -200.0])
    p.add_argument("--eval-every", type=int, default=500, help="env steps between evaluations")
    p.add_argument("--eval-episodes", type=int, default=5)
    p.add_argument("--learning-starts", type=int, default=100, help="SB3's default")
    p.add_argument("--batch-size", type=int, default=256, help="SB3's default")
    p.add_argument("--gradient-steps", type=int, default=1, help="per env step (SB3's default: 1)")
    p.add_argument("--learning-rate", type=float, default=1e-3, help="rl-zoo's for Pendulum")
    p.add_argument("--ent-coef", default="auto", help="SAC's: 'auto' (from 1.0), 'auto_0.1', or a number")
    p.add_argument("--hidden", type=int, default=64, help="units in each of the 2 hidden layers")
    p.add_argument("--out", type=Path, default=Path("warm-start-sac"))
    p.add_argument("--quick", action="store_true", help="a smoke run: tiny steps, one seed")
    args = p.parse_args(argv)
    if args.quick:
        args.prior_steps, args.steps, args.seeds = 400, 300, args.seeds[:1]
        args.eval_every, args.eval_episodes, args.batch_size, args.hidden = 100, 1, 32, 16
    return args


class EvalCurve(BaseCallback):
    """Evaluates the deterministic policy every ``every`` env steps (and before training)."""

    def __init__(self, every: int, episodes: int):
        super().__init__()
        self.every, self.episodes = every, episodes
        self.curve: list[tuple[int, float]] = []
        self.ent_coef: list[tuple[int, float]] = []  # SAC's entropy temperature at each point

    def _evaluate(self) -> None:
        ret = evaluate(
            lambda obs: self.model.predict(obs.numpy(), deterministic=True)[0], ENV_ID, self.episodes, 0
        )  # the same start states at every point, in every run and arm
        self.curve.append((int(self.num_timesteps), ret))
        log_alpha = getattr(self.model, "log_ent_coef", None)  # None: a fixed ent_coef
        if log_alpha is not None:
            self.ent_coef.append((int(self.num_timesteps), round(float(log_alpha.detach().exp()), 5)))

    def _on_training_start(self) -> None:
        self._evaluate()

    def _on_step(self) -> bool:
        if self.num_timesteps % self.every == 0:
            self._evaluate()
        return True


def make_sac(args: argparse.Namespace, seed: int, **buffer: Any) -> SAC:
    return SAC(
        "MlpPolicy", gym.make(ENV_ID), learning_rate=args.learning_rate,
        buffer_size=args.prior_steps + args.steps, learning_starts=args.learning_starts,
        batch_size=args.batch_size, gradient_steps=args.gradient_steps,
        ent_coef=_number_or_text(args.ent_coef), seed=seed, device="cpu",
        policy_kwargs={"net_arch": [args.hidden, args.hidden]}, **buffer,
    )  # fmt: skip


def _cpu_name() -> str:
    try:  # Linux: the model name; elsewhere the architecture
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def _number_or_text(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value


def train(args: argparse.Namespace, model: SAC, steps: int) -> dict[str, Any]:
    callback = EvalCurve(args.eval_every, args.eval_episodes)
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(steps, callback=callback)
    return {
        "curve": callback.curve,
        "ent_coef": callback.ent_coef,
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(time.process_time() - cpu, 1),
    }


def steps_to(curve: list[tuple[int, float]], threshold: float) -> int | None:
    """The first evaluated step whose return is at least ``threshold`` (None: never)."""
    return next((step for step, ret in curve if ret >= threshold), None)


def warm_buffer(args: argparse.Namespace, bank: Path) -> dict[str, Any]:
    share = args.offline_share
    weights: list[Any] = [1.0 - share, share]
    if args.anneal:  # over the run's gradient steps (after learning_starts)
        n = max((args.steps - args.learning_starts) * args.gradient_steps, 1)
        weights = [Linear(1.0 - share, 1.0, steps=n), Linear(share, 0.0, steps=n)]
    return {
        "replay_buffer_class": XpbankMixtureReplayBuffer,
        "replay_buffer_kwargs": {"offline": [bank], "weights": weights},
    }


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """Per arm and threshold: steps to reach it, median and range over seeds (never = inf)."""
    out: dict[str, Any] = {}
    for arm in args.arms:
        mine = [r for r in runs if r["arm"] == arm]
        out[arm] = {"final_return_median": float(np.median([r["curve"][-1][1] for r in mine]))}
        for thr in args.thresholds:
            got = [r["steps_to"][str(thr)] for r in mine]
            finite = np.array([np.inf if g is None else g for g in got], dtype=float)
            out[arm][str(thr)] = {
                "per_seed": got,
                "reached": sum(g is not None for g in got),
                "median": None if np.isinf(np.median(finite)) else float(np.median(finite)),
                "min": None if np.isinf(finite.min()) else float(finite.min()),
                "max": None if np.isinf(finite.max()) else float(finite.max()),
            }
    return out


def table(summary: dict[str, Any], args: argparse.Namespace) -> str:
    never = f">{args.steps:,}"

    def fmt(v: float | None) -> str:
        return never if v is None else f"{int(v):,}"

    lines = ["| arm | threshold | steps per seed | median | range | reached |", "|---|---|---|---|---|---|"]
    for arm in args.arms:
        for thr in args.thresholds:
            s = summary[arm][str(thr)]
            per_seed = " / ".join(fmt(v) for v in s["per_seed"])
            span = fmt(s["min"]) if s["min"] == s["max"] else f"{fmt(s['min'])} to {fmt(s['max'])}"
            reached = f"{s['reached']}/{len(args.seeds)}"
            lines.append(f"| {arm} | {thr:g} | {per_seed} | {fmt(s['median'])} | {span} | {reached} |")
    return "\n".join(lines)


def plot(runs: list[dict[str, Any]], prior: dict[str, Any], args: argparse.Namespace, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=80)
    for arm, color in (("scratch", "tab:gray"), ("warm", "tab:blue")):
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        for r in mine:
            steps, rets = zip(*r["curve"], strict=True)
            ax.plot(steps, rets, color=color, alpha=0.3, lw=1)
        steps = [s for s, _ in mine[0]["curve"]]
        median = np.median([[ret for _, ret in r["curve"]] for r in mine], axis=0)
        label = f"scratch (median of {len(mine)} seeds)"
        if arm == "warm":
            annealed = ", annealed to 0" if args.anneal else ""
            label = f"warm: {args.offline_share:g} of each batch from the bank{annealed} (median)"
        ax.plot(steps, median, color=color, lw=2.2, label=label)
    for thr in args.thresholds:
        ax.axhline(thr, color="k", ls=":", lw=0.8)
    ax.set(xlabel="env steps (phase 2)", ylabel=f"eval return ({args.eval_episodes} episodes)")
    title = f"SAC on {ENV_ID}, warm-started from {prior['bank']}"
    if prior["curve"] is not None:
        final = prior["curve"][-1][1]
        title = f"SAC on {ENV_ID}: bank of a {args.prior_steps:,}-step run (its final eval {final:.0f})"
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def previous_run(args: argparse.Namespace) -> tuple[Path, dict[str, Any]]:
    """Phase 1: SAC from scratch, its replay saved as a bank (or ``--bank``: an existing one)."""
    if args.bank is not None:
        log.info("phase 1 skipped: warm starts from %s", args.bank)
        return args.bank, {"bank": str(args.bank), "curve": None}
    bank = args.out / "prior_bank"
    log.info(
        "phase 1: SAC from scratch, %d steps (seed %d), replay saved as a bank", args.prior_steps, PRIOR_SEED
    )
    model = make_sac(args, PRIOR_SEED, replay_buffer_class=XpbankReplayBuffer)
    prior = train(args, model, args.prior_steps)
    model.replay_buffer.save_bank(bank)  # replaces the bank of an earlier run of this script
    final, seconds = prior["curve"][-1][1], prior["wall_s"]
    log.info("  eval return %.1f after %d steps (%.0f s); bank: %s", final, args.prior_steps, seconds, bank)
    return bank, {"bank": str(bank), **prior}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    bank, prior = previous_run(args)

    runs = []
    for seed in args.seeds:
        for arm in args.arms:
            buffer = warm_buffer(args, bank) if arm == "warm" else {"replay_buffer_class": XpbankReplayBuffer}
            run = {"arm": arm, "seed": seed, **train(args, make_sac(args, seed, **buffer), args.steps)}
            run["steps_to"] = {str(t): steps_to(run["curve"], t) for t in args.thresholds}
            reached = list(run["steps_to"].values())
            log.info(
                "phase 2: seed %d %-7s final eval %7.1f, steps to %s: %s (%.0f s)",
                seed, arm, run["curve"][-1][1], args.thresholds, reached, run["wall_s"],
            )  # fmt: skip
            runs.append(run)

    summary = summarize(runs, args)
    result = {
        "example": "warm_start_sac",
        "command": "python examples/warm_start_sac.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "environment": {
            "cpu": _cpu_name(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "note": NOTE,
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "prior": prior,
        "runs": runs,
        "summary": summary,
    }
    (args.out / "summary.json").write_text(json.dumps(result, indent=1))
    with open(args.out / "curves.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["arm", "seed", "env_step", "eval_return"])
        writer.writerows([r["arm"], r["seed"], s, round(ret, 2)] for r in runs for s, ret in r["curve"])
    plot(runs, prior, args, args.out / "curves.png")
    written = f"{args.out}/{{curves.png,summary.json,curves.csv}}"
    log.info("\n%s\n\n%s\nWrote %s", table(summary, args), NOTE, written)
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    main()
