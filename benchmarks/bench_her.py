"""Hindsight relabelling: a HER sample against a uniform sample and against SB3's HerReplayBuffer.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_her.py --threads 1           # about a minute
    PYTHONPATH=src .venv/bin/python benchmarks/bench_her.py --threads 1 --quick   # seconds

One data set of ``--size`` goal-conditioned transitions (8 envs in lockstep, episodes of
up to 50 steps ending by termination or time limit; observation float32[10], goals
float32[3], action float32[4]) is written into:

- an xpbank buffer with the default uniform sampler (the raw cost of a sample),
- the same with ``HerSampler(n_sampled_goal=4, strategy="future")`` (and with
  ``nstep=NStep(3, 0.98)``, each window relabelled: no peer has that),
- SB3's ``HerReplayBuffer`` (same ``n_sampled_goal`` and strategy; its env's
  ``compute_reward`` is the same vectorized function).

Each timed block is ``--calls`` calls of ``sample(256)``; the kinds take turns block by
block (``--rounds`` rounds, the order rotated each round: no kind always follows the same
other), so they see the same machine load; each cell is the median
over rounds with the range (fastest .. slowest). No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

import xpbank
from _common import (
    environment,
    fastest_block,
    fmt_us,
    freeze_heap,
    log,
    markdown_table,
    report,
    set_clock,
    time_calls,
)
from xpbank import NStep, ReplayBuffer
from xpbank.her import HerSampler

E, OBS, GOAL, ACT, BATCH, HORIZON = 8, 10, 3, 4, 256, 50


def compute_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    """Sparse: 0 within 0.05 of the goal, else -1 (gymnasium-robotics' Fetch reward)."""
    return -(np.linalg.norm(achieved - desired, axis=-1) > 0.05).astype(np.float32)


def make_data(size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``size // E`` steps of ``E`` envs, time-major ``[steps, E, ...]``."""
    rng = np.random.default_rng(seed)
    steps = size // E
    age = np.zeros(E, dtype=np.int64)
    term = np.zeros((steps, E), dtype=bool)
    trunc = np.zeros((steps, E), dtype=bool)
    for t in range(steps):  # data generation, not timed
        age += 1
        term[t] = rng.random(E) < 0.02
        trunc[t] = (age >= HORIZON) & ~term[t]
        age[term[t] | trunc[t]] = 0
    goal = rng.random((steps, E, GOAL), dtype=np.float32)
    return {
        "observation": rng.random((steps, E, OBS), dtype=np.float32),
        "achieved_goal": goal,
        "desired_goal": rng.random((steps, E, GOAL), dtype=np.float32),
        "next_observation": rng.random((steps, E, OBS), dtype=np.float32),
        "next_achieved_goal": np.roll(goal, -1, axis=0),
        "action": rng.random((steps, E, ACT), dtype=np.float32),
        "reward": -np.ones((steps, E), dtype=np.float32),
        "terminated": term,
        "truncated": trunc,
    }


def xpbank_buffer(data: dict[str, np.ndarray], sampler: Any, nstep: NStep | None = None) -> ReplayBuffer:
    steps = data["action"].shape[0]
    rb = ReplayBuffer(steps * E, num_envs=E, sampler=sampler, nstep=nstep, seed=0)
    chunk = 4096
    for lo in range(0, steps, chunk):
        part = {k: torch.from_numpy(v[lo : lo + chunk].reshape(-1, *v.shape[2:])) for k, v in data.items()}
        n = part["action"].shape[0]
        rb.extend(
            {
                ("obs", "observation"): part["observation"],
                ("obs", "achieved_goal"): part["achieved_goal"],
                ("obs", "desired_goal"): part["desired_goal"],
                ("next", "obs", "observation"): part["next_observation"],
                ("next", "obs", "achieved_goal"): part["next_achieved_goal"],
                ("next", "obs", "desired_goal"): part["desired_goal"],
                "action": part["action"],
                ("next", "reward"): part["reward"],
                ("next", "terminated"): part["terminated"],
                ("next", "truncated"): part["truncated"],
            }
        )
        assert len(rb) == lo * E + n
    return rb


def sb3_buffer(data: dict[str, np.ndarray]) -> Any:
    import gymnasium as gym
    from gymnasium import spaces
    from stable_baselines3 import HerReplayBuffer
    from stable_baselines3.common.vec_env import DummyVecEnv

    class GoalEnv(gym.Env):  # only its spaces and compute_reward are used
        observation_space = spaces.Dict(
            {
                "observation": spaces.Box(0, 1, (OBS,), np.float32),
                "achieved_goal": spaces.Box(0, 1, (GOAL,), np.float32),
                "desired_goal": spaces.Box(0, 1, (GOAL,), np.float32),
            }
        )
        action_space = spaces.Box(0, 1, (ACT,), np.float32)

        def compute_reward(self, achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
            return compute_reward(achieved, desired, info)

        def reset(self, *, seed: Any = None, options: Any = None) -> Any:
            return self.observation_space.sample(), {}

        def step(self, action: Any) -> Any:
            return self.observation_space.sample(), 0.0, False, False, {}

    venv = DummyVecEnv([GoalEnv for _ in range(E)])
    steps = data["action"].shape[0]
    buf = HerReplayBuffer(
        steps * E, GoalEnv.observation_space, GoalEnv.action_space, venv, device="cpu", n_envs=E,
        n_sampled_goal=4, goal_selection_strategy="future",
    )  # fmt: skip
    for t in range(steps):
        obs = {k: data[k][t] for k in ("observation", "achieved_goal", "desired_goal")}
        nxt = {
            "observation": data["next_observation"][t],
            "achieved_goal": data["next_achieved_goal"][t],
            "desired_goal": data["desired_goal"][t],
        }
        done = data["terminated"][t] | data["truncated"][t]
        infos = [{"TimeLimit.truncated": bool(x)} for x in data["truncated"][t]]
        buf.add(obs, nxt, data["action"][t], data["reward"][t], done, infos)
    return buf


def run(size: int, calls: int, rounds: int) -> tuple[list[list[str]], dict[str, list[float]]]:
    log(f"making {size:,} transitions ...")
    data = make_data(size)
    kinds: dict[str, Callable[[], object]] = {}
    uniform = xpbank_buffer(data, None)
    kinds["xpbank uniform"] = lambda: uniform.sample(BATCH)
    her = xpbank_buffer(data, HerSampler(n_sampled_goal=4, strategy="future", compute_reward=compute_reward))
    kinds["xpbank HER (future, k=4)"] = lambda: her.sample(BATCH)
    her_n = xpbank_buffer(
        data, HerSampler(n_sampled_goal=4, strategy="future", compute_reward=compute_reward), NStep(3, 0.98)
    )
    kinds["xpbank HER + n-step 3"] = lambda: her_n.sample(BATCH)
    log("filling SB3's HerReplayBuffer ...")
    sb3 = sb3_buffer(data)
    kinds["SB3 HerReplayBuffer (future, k=4)"] = lambda: sb3.sample(BATCH)
    for fn in kinds.values():  # warm up: first calls load compiled kernels (numba's cache)
        for _ in range(3):
            fn()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    names = list(kinds)
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:  # rotated: no fixed position
            times[name].append(fastest_block(kinds[name], calls, 1))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{k} {fmt_us(v[-1])}" for k, v in times.items()))
    base, her_t, sb3_t = (
        np.array(times["xpbank uniform"]),
        np.array(times["xpbank HER (future, k=4)"]),
        np.array(times["SB3 HerReplayBuffer (future, k=4)"]),
    )
    rows = []
    for name, t in times.items():
        arr = np.array(t)
        vs_uniform = arr / base
        vs_her = sb3_t / arr
        rows.append(
            [
                name,
                f"{fmt_us(float(np.median(arr)))} ({fmt_us(float(arr.min()))} .. {fmt_us(float(arr.max()))})",
                f"{np.median(vs_uniform):.2f}x ({vs_uniform.min():.2f} .. {vs_uniform.max():.2f})",
                f"{np.median(vs_her):.2f}x ({vs_her.min():.2f} .. {vs_her.max():.2f})",
            ]
        )
    log(
        f"HER / uniform median {np.median(her_t / base):.2f}x; "
        f"SB3 / HER median {np.median(sb3_t / her_t):.2f}x"
    )
    return rows, times


def profile(size: int, calls: int, rounds: int) -> tuple[list[list[str]], dict[str, list[float]]]:
    """One HER sample(256) split into its phases, each timed over the same ``calls``
    pre-drawn batches (fresh random items per call, as a real sample), interleaved with
    whole uniform and HER samples; the phases call what the HER read fast path
    (``xpbank.her.records.sample_records``, then ``fast_read.try_records``) calls."""
    from xpbank.her.records import _decode, fused_draw, kernel, sample_records
    from xpbank.replay.fast_read import _plan

    data = make_data(size)
    uniform = xpbank_buffer(data, None)
    sampler = HerSampler(n_sampled_goal=4, strategy="future", compute_reward=compute_reward)
    her = xpbank_buffer(data, sampler)
    her.sample(BATCH)  # resolves the goal keys and the record layout, catches up the episode ends
    ring, gen, plan, layout = her._ring, her._generator, _plan(her), sampler._records
    shot = None if layout is None else layout.shots.get(BATCH)  # what the sample keeps (her/shot.py)
    if plan is None or shot is None or kernel() is None or shot.reward_column is None:
        raise SystemExit("--profile: the HER read fast path does not apply here (numba missing?)")
    m = int(sampler.relabel_fraction * BATCH)
    raws = np.empty((calls, BATCH // 2 + m), dtype=np.int64)  # the fused draws, as sample_records makes them
    for i in range(calls):
        raw = fused_draw(layout, ring.size, BATCH, m, gen)
        if raw is None:
            raise SystemExit("--profile: the fused draw does not apply here")
        raws[i] = raw
    rows = np.empty((calls, BATCH), dtype=np.int64)  # the slots, for the uniform take below
    for i, raw in enumerate(raws):
        _decode(raw, rows[i], ring.size, np.empty(m))  # (its source, run as Python: not timed)
    # the pass's context as the sample's, pointing at draw i (an int set per call)
    context = shot.context.copy()
    at, first_raw, raw_step = int(context.ctypes.data), int(raws.ctypes.data), raws.strides[0]

    def read(i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = np.empty((BATCH, layout.width), shot.row_dtype)
        ids, goal_ids = np.empty(BATCH, dtype=np.int64), np.empty(BATCH, dtype=np.int64)
        reached = np.empty(shot.goal_shape, shot.pair_dtype, shot.order)
        goal = np.empty(shot.goal_shape, shot.pair_dtype, shot.order)
        context[0] = first_raw + i * raw_step
        first = ring.next_id - ring.size
        shot.call(at, ring.size, first, ring.next_id, False, layout.words, out, reached, goal, ids, goal_ids)
        return out, layout.as_goals(reached), layout.as_goals(goal)

    read_out = [read(i) for i in range(calls)]
    rewards = [compute_reward(a, g, None) for _, a, g in read_out]

    def read_write(i: int) -> None:  # the write on the records the pass just wrote, as in a sample
        out = read(i)[0]
        out[shot.reward_column] = rewards[i]

    records = [np.ndarray(BATCH, layout.record, out) for out, _, _ in read_out]
    index = np.zeros(BATCH, dtype=np.int64)  # stand-ins for the ids and goal ids (from_numpy'd)

    phases: dict[str, Callable[[int], object]] = {
        "whole uniform sample": lambda i: uniform.sample(BATCH),
        "whole HER sample": lambda i: her.sample(BATCH),
        "  HER fast path: sample_records": lambda i: sample_records(sampler, plan, ring, BATCH, gen),
        "    draw slots + goal offsets (one call)": lambda i: fused_draw(layout, ring.size, BATCH, m, gen),
        "    decode the draws + read records + choose goals + goal rows (one compiled pass)": read,
        "    the user's compute_reward": lambda i: compute_reward(read_out[i][1], read_out[i][2], None),
        "    the same pass, then the rewards' write": read_write,
        "  split the records + TensorDict": lambda i: _assemble(plan, records[i], index, index),
        "  (uniform: take of the records)": lambda i: plan.reader.records.take(rows[i]),
        "  (uniform: split the records + TensorDict)": lambda i: _assemble(plan, records[i], index),
    }
    times: dict[str, list[float]] = {k: [] for k in phases}
    for r in range(rounds):
        for name, fn in phases.items():
            times[name].append(time_calls(fn, range(calls), calls) / calls)
        log(f"profile round {r + 1}/{rounds}")
    base = np.array(times["whole uniform sample"])
    rows_out = []
    for name, t in times.items():
        arr = np.array(t)
        share = arr / base
        rows_out.append(
            [
                name,
                f"{fmt_us(float(np.median(arr)))} ({fmt_us(float(arr.min()))} .. {fmt_us(float(arr.max()))})",
                f"{np.median(share):.2f}x ({share.min():.2f} .. {share.max():.2f})",
            ]
        )
    return rows_out, times


def _assemble(plan: Any, records: np.ndarray, ids: np.ndarray, goal_ids: np.ndarray | None = None) -> Any:
    """What ``fast_read.try_records`` does with the records: split, ids, the TensorDict
    (``goal_ids`` None: what the uniform path's ``fast_read._batch`` does after its take)."""
    from xpbank.spec.batch import to_tensordict

    flat = plan.reader.split(records)
    flat["index"] = torch.from_numpy(ids)
    if goal_ids is not None:
        flat["her_goal"] = torch.from_numpy(goal_ids)
    return to_tensordict(flat, torch.Size((BATCH,)), plan.device)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100k transitions, few rounds (seconds)")
    p.add_argument("--size", type=int, default=None, help="transitions (default 1M; quick 100k)")
    p.add_argument("--calls", type=int, default=None, help="sample() calls per timed block (default 200)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 7; quick 2)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--profile", action="store_true", help="also time one HER sample phase by phase")
    p.add_argument("--clock", choices=["wall", "thread"], default="wall", help="wall time or thread CPU time")
    args = p.parse_args(argv)
    set_clock(args.clock)
    if args.threads:
        torch.set_num_threads(args.threads)
    size = args.size or (100_000 if args.quick else 1_000_000)
    calls = args.calls or (50 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 7)
    import stable_baselines3

    freeze_heap()
    env = environment({"xpbank": xpbank.__version__, "stable_baselines3": stable_baselines3.__version__})
    rows, times = run(size, calls, rounds)
    headers = ["sample(256)", "per call: median (range)", "vs xpbank uniform", "SB3 HER / this"]
    notes = (
        f"{size:,} transitions of {E} envs in lockstep, episodes of up to {HORIZON} steps; "
        f"{rounds} interleaved rounds (order rotated) of {calls} calls each, clock {args.clock}; "
        "ratios per round, median (range). "
        "Targets: HER at most 1.5x uniform, SB3's at least 3x HER's time."
    )
    title = "HER sample(256): xpbank HerSampler vs uniform vs SB3 HerReplayBuffer"
    lines = [
        f"# {title}",
        "",
        " · ".join(f"{k} {v}" for k, v in env.items()),
        "",
        markdown_table(headers, rows),
    ]
    tables = [{"title": title, "headers": headers, "rows": rows, "notes": notes}]
    seconds: dict[str, Any] = {"sample": times}
    if args.profile:
        p_rows, p_times = profile(size, calls, rounds)
        p_title = "One HER sample(256) (future, k=4), phase by phase"
        p_headers = ["phase", "per call: median (range)", "vs a whole uniform sample"]
        p_notes = (
            f"{rounds} interleaved rounds of {calls} calls (clock {args.clock}), each call on fresh "
            "random items (pre-drawn); the phases are the calls HerSampler makes, timed one by one."
        )
        tables.append({"title": p_title, "headers": p_headers, "rows": p_rows, "notes": p_notes})
        lines += ["", f"# {p_title}", "", markdown_table(p_headers, p_rows)]
        seconds["profile"] = p_times
    results = {
        "benchmark": "bench_her",
        "command": "PYTHONPATH=src python benchmarks/bench_her.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "tables": tables,
        "seconds_per_call": seconds,
    }
    return report(lines, results, args.json)


if __name__ == "__main__":
    sys.exit(main())
