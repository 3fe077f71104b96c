"""SB3 training steps/s with SB3's own ReplayBuffer and with xpbank's drop-in, in one run.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_sb3.py --threads 1            # a few minutes
    PYTHONPATH=src .venv/bin/python benchmarks/bench_sb3.py --threads 1 --quick    # a minute or two

Part 1, training: SB3's real ``learn()`` (one gradient step per env step, batch 256,
``learning_starts=100``, SB3's default networks) on SAC / Pendulum-v1 and DQN /
CartPole-v1, with ``replay_buffer_class`` = SB3's ``ReplayBuffer``, xpbank's
``XpbankReplayBuffer``, and (DQN) xpbank's ``PrioritizedDQN`` and both buffers with
``optimize_memory_usage=True`` ("dedup": next observations stored once). Every buffer first
runs one short ``learn`` (150 steps, not reported) so that no row pays first calls
(torch's, numba's compiled kernels loaded, env registration); then ``--rounds`` rounds
run every buffer in turn, the order reversed every other round, so a load spike hits all
of them. Reported: env steps/s of the whole ``learn`` call (env, policy, buffer, gradient
step), the median round, and the ratio to SB3's buffer as the median (range) of per-round
ratios. ``--clock thread`` times this thread's CPU time (a loaded machine's preemption
left out).

Part 2, the buffer calls alone: ``add`` (one vector step of ``n_envs`` envs, obs
float32[17], action float32[6]) and ``sample(256)`` on a buffer filled to ``--size``
transitions, SB3's against xpbank's (per call, the fastest of ``--rounds`` blocks).
No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

import xpbank
from _common import (
    best_of,
    clock,
    environment,
    fmt_ratio,
    fmt_us,
    freeze_heap,
    log,
    markdown_table,
    median,
    run_main,
    set_clock,
)

BATCH = 256


def learn_rate(algo: str, buffer: str, steps: int) -> float:
    """Env steps per second of one ``learn(steps)`` (after building the model)."""
    from stable_baselines3 import DQN, SAC

    from xpbank.integrations.sb3 import PrioritizedDQN, XpbankReplayBuffer

    common: dict[str, Any] = {"learning_starts": 100, "batch_size": BATCH, "seed": 0, "device": "cpu"}
    if buffer.startswith("xpbank") and buffer != "xpbank PER":
        common["replay_buffer_class"] = XpbankReplayBuffer
    if buffer.endswith("dedup"):  # optimize_memory_usage: SB3's own needs timeouts off
        common["optimize_memory_usage"] = True
        if buffer == "sb3 dedup":
            common["replay_buffer_kwargs"] = {"handle_timeout_termination": False}
    if algo == "SAC":
        model = SAC("MlpPolicy", "Pendulum-v1", train_freq=1, gradient_steps=1, **common)
    else:
        cls = PrioritizedDQN if buffer == "xpbank PER" else DQN
        model = cls("MlpPolicy", "CartPole-v1", train_freq=1, gradient_steps=1, **common)
    start = clock()
    model.learn(steps)
    return steps / (clock() - start)


def bench_training(steps: int, rounds: int) -> dict[str, dict[str, list[float]]]:
    """Steps/s of each buffer's ``learn``, one per round: ``{run: {buffer: [rate, ...]}}``."""
    runs = {
        "SAC / Pendulum-v1": ("SAC", ["sb3", "xpbank"]),
        "DQN / CartPole-v1": ("DQN", ["sb3", "xpbank", "xpbank PER", "sb3 dedup", "xpbank dedup"]),
    }
    out: dict[str, dict[str, list[float]]] = {}
    for name, (algo, buffers) in runs.items():
        rates: dict[str, list[float]] = {b: [] for b in buffers}
        for b in buffers:  # every buffer's first calls, not reported
            learn_rate(algo, b, 150)
        for r in range(rounds):
            for b in buffers if r % 2 == 0 else buffers[::-1]:  # in turn, the order reversed
                rates[b].append(learn_rate(algo, b, steps))
                log(f"  {name} round {r} {b}: {rates[b][-1]:.0f} steps/s")
        out[name] = rates
    return out


def fill_sb3(buf: Any, rng: np.random.Generator) -> None:
    """Fill SB3's arrays directly (not timed): every row written, ``full`` set."""
    for arr in (buf.observations, buf.next_observations, buf.actions, buf.rewards):
        arr[:] = rng.normal(size=arr.shape).astype(arr.dtype)
    buf.dones[:] = rng.random(buf.dones.shape) < 0.01
    buf.full = True


def fill_xpbank(buf: Any, rng: np.random.Generator) -> None:
    """Fill the xpbank buffer with large extends (not timed)."""
    n, chunk = buf.xp.capacity, 65_536
    for start in range(0, n, chunk):
        k = min(chunk, n - start)
        buf.xp.extend(
            {
                "obs": rng.normal(size=(k, 17)).astype(np.float32),
                "action": rng.normal(size=(k, 6)).astype(np.float32),
                "reward": rng.normal(size=k).astype(np.float32),
                "terminated": rng.random(k) < 0.01,
                "truncated": np.zeros(k, bool),
                ("next", "obs"): rng.normal(size=(k, 17)).astype(np.float32),
            }
        )


def bench_calls(size: int, n_envs: int, calls: int, rounds: int) -> dict[str, dict[str, float]]:
    from stable_baselines3.common.buffers import ReplayBuffer

    from xpbank.integrations.sb3 import XpbankReplayBuffer

    obs_space = spaces.Box(-np.inf, np.inf, (17,), np.float32)
    act_space = spaces.Box(-1, 1, (6,), np.float32)
    rng = np.random.default_rng(0)
    steps = [
        (
            rng.normal(size=(n_envs, 17)).astype(np.float32),
            rng.normal(size=(n_envs, 17)).astype(np.float32),
            rng.normal(size=(n_envs, 6)).astype(np.float32),
            rng.normal(size=n_envs).astype(np.float32),
            rng.random(n_envs) < 0.01,
            [{"TimeLimit.truncated": False}] * n_envs,
        )
        for _ in range(64)
    ]
    out: dict[str, dict[str, float]] = {}
    for name, cls, fill in (("sb3", ReplayBuffer, fill_sb3), ("xpbank", XpbankReplayBuffer, fill_xpbank)):
        buf = cls(size, obs_space, act_space, "cpu", n_envs=n_envs)
        fill(buf, rng)
        out[name] = {
            "add": best_of(lambda i, b=buf: b.add(*steps[i % 64]), calls, rounds),
            "sample": best_of(lambda i, b=buf: b.sample(BATCH), calls, rounds),
        }
        del buf
    return out


def report(
    training: dict[str, dict[str, list[float]]],
    calls: dict[str, dict[str, dict[str, float]]],
    size: int,
    clock_name: str,
) -> str:
    rows = []
    for name, rates in training.items():
        for b, runs in rates.items():
            ratios = [sb3 / rate for rate, sb3 in zip(runs, rates["sb3"], strict=True)]  # time ratios
            spread = f"{fmt_ratio(median(ratios))} ({fmt_ratio(min(ratios))}-{fmt_ratio(max(ratios))})"
            rows.append([name, b, f"{median(runs):,.0f}", spread])
    out = "## SB3 learn(): env steps/s (1 gradient step of batch 256 per env step)\n\n"
    out += markdown_table(["algorithm / env", "buffer", "steps/s", "time vs SB3's buffer"], rows)
    out += (
        f"\n\n{len(next(iter(training.values()))['sb3'])} interleaved rounds, {clock_name} clock: steps/s of "
        "the median round; time vs SB3's buffer: learn()'s time / SB3's buffer's, median (range) "
        "of the rounds' ratios (below 1.0x: faster)"
    )
    rows = []
    for n_envs, res in calls.items():
        for op in ("add", "sample"):
            sb3, ours = res["sb3"][op], res["xpbank"][op]
            rows.append(
                [
                    str(n_envs),
                    op if op == "add" else f"sample({BATCH})",
                    fmt_us(sb3),
                    fmt_us(ours),
                    fmt_ratio(sb3 / ours),
                ]
            )
    out += f"\n\n## Buffer calls alone ({size:,} transitions, obs float32[17], action float32[6])\n\n"
    out += markdown_table(["n_envs", "call", "SB3 ReplayBuffer", "XpbankReplayBuffer", "speed-up"], rows)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="short runs and 100k transitions: a smoke test")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--steps", type=int, default=None, help="env steps per learn() (default 3000; quick 300)")
    p.add_argument("--size", type=int, default=None, help="transitions in part 2 (default 1M; quick 100k)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per measurement (default 3; quick 2)")
    p.add_argument("--clock", choices=["wall", "thread"], default="wall", help="what times learn()")
    p.add_argument("--json", default=None, help="also write the results here")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    set_clock(args.clock)
    warnings.filterwarnings("ignore")
    logging.getLogger("stable_baselines3").setLevel(logging.ERROR)
    steps = args.steps or (300 if args.quick else 3000)
    size = args.size or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or (2 if args.quick else 3)
    freeze_heap()
    import stable_baselines3

    env = environment({"xpbank": xpbank.__version__, "stable_baselines3": stable_baselines3.__version__})
    print("# xpbank SB3 drop-in benchmark\n\n" + " · ".join(f"{k} {v}" for k, v in env.items()))
    training = bench_training(steps, rounds)
    calls = {n: bench_calls(size, n, 500 if args.quick else 2000, rounds) for n in (1, 8)}
    print("\n" + report(training, calls, size, args.clock), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"environment": env, "args": vars(args), "training": training, "calls": calls}, f, indent=2
            )
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
