"""Small calls: one transition in, one small batch out (issue 21), against SB3, cpprb,
TorchRL and a raw NumPy / torch baseline, in one process.

    .venv/bin/python benchmarks/bench_small_calls.py --threads 1 [--quick] [--json out.json]

Items are CartPole transitions: obs / next obs float32[4], action int64, reward float32,
terminated, truncated. Rows (each buffer built and filled to capacity first, so every
write is a steady-state write into a full ring):

- ``add`` of one transition: a dict of NumPy arrays and Python numbers (what a
  gymnasium loop has), a dict of 0-d / 1-d torch tensors, a TensorDict; SB3's
  ``ReplayBuffer.add`` (n_envs=1), cpprb's ``add``, raw NumPy (one array per field,
  one store each at the cursor);
- ``extend`` of one ``[8]`` vector step (NumPy, torch), SB3 with ``n_envs=8``, cpprb
  ``add`` of 8 rows, raw NumPy (8-row slice stores);
- the same xpbank calls with the episode index on (``num_envs=``) and with
  ``nstep=NStep(3, 0.99)``: compared with the plain xpbank call (target <= 1.25x);
- ``sample(32)`` / ``sample(256)`` from 100k and 1M items: SB3, cpprb, TorchRL
  (``TensorDictReplayBuffer`` over ``LazyTensorStorage``, where it imports), raw torch
  (``randint`` + ``index_select`` per field) and raw NumPy (``integers`` + ``take``);
- FrameStorage (``stacked=False``, as the SB3 adapter uses it): ``extend`` of one
  ``[8]`` step of uint8[4,84,84] observations and ``sample(32)``, against SB3's
  ``optimize_memory_usage=True`` (n_envs=8), cpprb with ``next_of="obs"`` and raw NumPy
  (obs stored once per step, next obs read from the next row, like SB3);
- prioritized: ``sample(32)`` then ``update_priority`` of the 32 sampled items, xpbank's
  PrioritizedSampler against cpprb's PrioritizedReplayBuffer (no raw baseline: a sum
  tree is what both implement).

Timing: ``--rounds`` rounds; each round times one block of calls of every (row,
library) case in turn (wall time, or with ``--clock cpu`` this thread's CPU time, which
a loaded machine's preemption does not inflate), in an order rotated per round, so
every number of a round shares the machine's load of the same moments. Tables show the
median per-call time and the min-max over rounds; ratios are medians of per-round ratios
(xpbank / peer, lower is better for xpbank). No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

import xpbank
from _common import environment, fmt_us, freeze_heap, log, markdown_table, median, settle
from xpbank import Field, FrameStorage, NStep, ReplayBuffer, Spec
from xpbank.sampler import PrioritizedSampler

Call = Callable[[], object]
E = 8  # vector envs of the [8] rows
FRAME = (4, 84, 84)
SPEC = Spec(
    {
        "obs": Field((4,)),
        "action": Field((), torch.int64),
        "reward": Field(()),
        "next_obs": Field((4,)),
        "terminated": Field((), torch.bool),
        "truncated": Field((), torch.bool),
    }
)


def cycle(inputs: list[Any], fn: Callable[[Any], object], start: int = 0) -> Call:
    """A call of ``fn`` on the next of the pre-made ``inputs`` (the first: ``inputs[start]``)."""
    state = [start - 1]
    k = len(inputs)

    def call() -> object:
        state[0] += 1
        return fn(inputs[state[0] % k])

    return call


# -- inputs --------------------------------------------------------------------------
def np_items(rng: np.random.Generator, k: int) -> list[dict[str, Any]]:
    """One transition as a gymnasium loop has it: arrays and Python numbers."""
    out = []
    for _ in range(k):
        obs = rng.standard_normal(4).astype(np.float32)
        out.append(
            {
                "obs": obs,
                "action": int(rng.integers(2)),
                "reward": 1.0,
                "next_obs": rng.standard_normal(4).astype(np.float32),
                "terminated": bool(rng.random() < 0.01),
                "truncated": False,
            }
        )
    return out


def torch_item(item: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.from_numpy(item["obs"]),
        "action": torch.tensor(item["action"]),
        "reward": torch.tensor(item["reward"], dtype=torch.float32),
        "next_obs": torch.from_numpy(item["next_obs"]),
        "terminated": torch.tensor(item["terminated"]),
        "truncated": torch.tensor(item["truncated"]),
    }


def np_steps(rng: np.random.Generator, k: int, n: int) -> list[dict[str, np.ndarray]]:
    """``k`` vector steps of ``n`` envs (what a gymnasium vector env gives)."""
    return [
        {
            "obs": rng.standard_normal((n, 4)).astype(np.float32),
            "action": rng.integers(0, 2, n),
            "reward": np.ones(n, np.float32),
            "next_obs": rng.standard_normal((n, 4)).astype(np.float32),
            "terminated": rng.random(n) < 0.01,
            "truncated": np.zeros(n, bool),
        }
        for _ in range(k)
    ]


def torch_step(step: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in step.items()}


def fill(rb: ReplayBuffer, n: int, rng: np.random.Generator, envs: int = 1) -> ReplayBuffer:
    chunk = 100_000 - 100_000 % envs
    while len(rb) < n:
        rb.extend(np_steps(rng, 1, min(chunk, n - len(rb)))[0])
    return rb


# -- peers ---------------------------------------------------------------------------
def sb3_buffer(size: int, n_envs: int, frames: bool = False) -> Any:
    import gymnasium as gym
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    if frames:
        space = gym.spaces.Box(0, 255, FRAME, np.uint8)
        return SB3Buffer(
            size // n_envs, space, gym.spaces.Discrete(4), device="cpu", n_envs=n_envs,
            optimize_memory_usage=True, handle_timeout_termination=False,
        )  # fmt: skip
    space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
    return SB3Buffer(size // n_envs, space, gym.spaces.Discrete(2), device="cpu", n_envs=n_envs)


def sb3_add(rb: Any) -> Callable[[dict[str, Any]], object]:
    n = rb.n_envs
    infos = [{} for _ in range(n)]

    def add(s: dict[str, Any]) -> object:
        return rb.add(s["obs"], s["next_obs"], s["action"], s["reward"], s["terminated"], infos)

    return add


def sb3_args(step: dict[str, Any], n: int) -> dict[str, Any]:
    """SB3's add arguments: [n_envs, ...] arrays, as SB3's own loop passes them."""
    return {
        "obs": np.asarray(step["obs"]).reshape(n, -1) if step["obs"].ndim < 3 else step["obs"],
        "next_obs": np.asarray(step["next_obs"]).reshape(n, -1)
        if step["next_obs"].ndim < 3
        else step["next_obs"],
        "action": np.asarray(step["action"]).reshape(n, 1),
        "reward": np.asarray(step["reward"], np.float32).reshape(n),
        "terminated": np.asarray(step["terminated"], np.float32).reshape(n),
    }


def cpprb_buffer(size: int, frames: bool = False, prioritized: bool = False) -> Any:
    import cpprb

    if frames:
        env = {"obs": {"shape": FRAME, "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
        return cpprb.ReplayBuffer(size, env, next_of="obs")
    env = {
        "obs": {"shape": 4},
        "act": {"dtype": np.int64},
        "rew": {},
        "next_obs": {"shape": 4},
        "done": {},
    }
    return cpprb.PrioritizedReplayBuffer(size, env) if prioritized else cpprb.ReplayBuffer(size, env)


def cpprb_add(rb: Any, frames: bool = False) -> Callable[[dict[str, Any]], object]:
    if frames:
        return lambda s: rb.add(
            obs=s["obs"], next_obs=s["next_obs"], act=s["action"], rew=s["reward"], done=s["terminated"]
        )
    return lambda s: rb.add(
        obs=s["obs"], act=s["action"], rew=s["reward"], next_obs=s["next_obs"], done=s["terminated"]
    )


class RawNumpy:
    """The baseline: one preallocated NumPy array per field, a cursor, stores at it."""

    def __init__(self, size: int, frames: bool = False):
        self.size, self.pos, self.full = size, 0, False
        shape, dtype = (FRAME, np.uint8) if frames else ((4,), np.float32)
        self.fields: dict[str, np.ndarray] = {
            "obs": np.zeros((size, *shape), dtype),
            "action": np.zeros(size, np.int64),
            "reward": np.zeros(size, np.float32),
            "terminated": np.zeros(size, bool),
            "truncated": np.zeros(size, bool),
        }
        self.frames = frames
        if not frames:
            self.fields["next_obs"] = np.zeros((size, *shape), dtype)
        self.rng = np.random.default_rng(0)

    def add(self, item: dict[str, Any]) -> None:
        p = self.pos
        for k, arr in self.fields.items():
            arr[p] = item[k]
        self.pos = (p + 1) % self.size

    def extend(self, step: dict[str, np.ndarray]) -> None:
        p = self.pos
        n = step["obs"].shape[0]
        for k, arr in self.fields.items():
            arr[p : p + n] = step[k]
        self.pos = (p + n) % self.size  # sizes here are multiples of n: no split at the wrap

    def sample(self, b: int) -> dict[str, np.ndarray]:
        idx = self.rng.integers(0, self.size, b)
        out = {k: arr.take(idx, axis=0) for k, arr in self.fields.items()}
        if self.frames:  # SB3-style: the next obs is the next row's obs
            out["next_obs"] = self.fields["obs"].take((idx + E) % self.size, axis=0)
        return out


def raw_torch_sample(size: int, rng: np.random.Generator) -> Callable[[int], dict[str, torch.Tensor]]:
    data = {k: torch.from_numpy(v) for k, v in np_steps(rng, 1, size)[0].items()}
    gen = torch.Generator().manual_seed(0)

    def sample(b: int) -> dict[str, torch.Tensor]:
        idx = torch.randint(0, size, (b,), generator=gen)
        return {k: v.index_select(0, idx) for k, v in data.items()}

    return sample


def torchrl_sample(size: int, rng: np.random.Generator) -> Callable[[int], object] | str:
    """TorchRL's uniform buffer, or why it is skipped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(size), sampler=RandomSampler())
    step = np_steps(rng, 1, size)[0]
    rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in step.items()}, batch_size=[size]))
    return lambda b: rb.sample(batch_size=b)


# -- the cases ---------------------------------------------------------------------
def build(quick: bool) -> tuple[dict[str, dict[str, Call]], dict[str, str], list[str]]:
    """Every (row -> {library: call}), the row targets, and notes on what was skipped."""
    rng = np.random.default_rng(0)
    cap = 100_000
    sizes = (100_000,) if quick else (100_000, 1_000_000)
    rows: dict[str, dict[str, Call]] = {}
    targets: dict[str, str] = {}
    skipped: list[str] = []
    items = np_items(rng, 64)
    titems = [torch_item(i) for i in items]
    tds = [TensorDict(t, batch_size=[]) for t in titems]
    steps = np_steps(rng, 64, E)
    tsteps = [torch_step(s) for s in steps]

    def xp(**kw: Any) -> ReplayBuffer:
        return fill(ReplayBuffer(cap, SPEC, seed=0, **kw), cap, rng, kw.get("num_envs") or 1)

    sb1 = sb3_buffer(cap, 1)
    sb1_items = [sb3_args({k: np.asarray(v) for k, v in i.items()}, 1) for i in items]
    for s in sb1_items[:1] * cap:
        sb3_add(sb1)(s)
    cp1 = cpprb_buffer(cap)
    raw1 = RawNumpy(cap)
    add_peers = {
        "SB3": cycle(sb1_items, sb3_add(sb1)),
        "cpprb": cycle(items, cpprb_add(cp1)),
        "raw NumPy": cycle(items, raw1.add),
    }
    rows["add: NumPy + Python numbers"] = {"xpbank": cycle(items, xp().add), **add_peers}
    rows["add: torch 0-d / 1-d"] = {"xpbank": cycle(titems, xp().add), **add_peers}
    rows["add: TensorDict"] = {"xpbank": cycle(tds, xp().add), **add_peers}
    targets["add: NumPy + Python numbers"] = "<= 1.0x SB3"
    targets["add: torch 0-d / 1-d"] = targets["add: TensorDict"] = "<= 1.5x SB3"
    plain_add = rows["add: NumPy + Python numbers"]["xpbank"]
    rows["add: NumPy, num_envs=1"] = {"xpbank": cycle(items, xp(num_envs=1).add), "xpbank plain": plain_add}
    rows["add: NumPy, nstep=NStep(3, 0.99)"] = {
        "xpbank": cycle(items, xp(num_envs=1, nstep=NStep(3, 0.99)).add),
        "xpbank plain": plain_add,
    }

    sb8 = sb3_buffer(cap, E)
    sb8_steps = [sb3_args(s, E) for s in steps]
    for _ in range(cap // E):
        sb3_add(sb8)(sb8_steps[0])
    cp8, raw8 = cpprb_buffer(cap), RawNumpy(cap)
    step_peers = {
        "SB3": cycle(sb8_steps, sb3_add(sb8)),
        "cpprb": cycle(steps, cpprb_add(cp8)),
        "raw NumPy": cycle(steps, raw8.extend),
    }
    rows["extend [8]: NumPy"] = {"xpbank": cycle(steps, xp().extend), **step_peers}
    rows["extend [8]: torch"] = {"xpbank": cycle(tsteps, xp().extend), **step_peers}
    targets["extend [8]: NumPy"], targets["extend [8]: torch"] = "<= 1.0x SB3", "<= 1.5x SB3"
    plain8 = rows["extend [8]: NumPy"]["xpbank"]
    rows["extend [8]: NumPy, num_envs=8"] = {
        "xpbank": cycle(steps, xp(num_envs=E).extend),
        "xpbank plain": plain8,
    }
    rows["extend [8]: NumPy, num_envs=8, nstep"] = {
        "xpbank": cycle(steps, xp(num_envs=E, nstep=NStep(3, 0.99)).extend),
        "xpbank plain": plain8,
    }
    for name in [r for r in rows if "num_envs" in r or "nstep" in r]:
        targets[name] = "<= 1.25x plain"

    for size in sizes:
        rb = fill(ReplayBuffer(size, SPEC, seed=0), size, rng)
        sb = sb3_buffer(size, 1000)
        sbs = sb3_args(np_steps(rng, 1, 1000)[0], 1000)
        for _ in range(size // 1000):
            sb3_add(sb)(sbs)
        cp = cpprb_buffer(size)
        cp_fill = np_steps(rng, 1, size)[0]
        cpprb_add(cp)(cp_fill)
        raw = RawNumpy(size)
        raw.extend(np_steps(rng, 1, size)[0])
        rawt = raw_torch_sample(size, rng)
        trl = torchrl_sample(size, rng)
        if isinstance(trl, str):
            skipped.append(f"TorchRL sample ({trl})")
        for b in (32, 256):
            row = f"sample({b}) of {size // 1000}k"
            rows[row] = {
                "xpbank": lambda rb=rb, b=b: rb.sample(b),
                "SB3": lambda sb=sb, b=b: sb.sample(b),
                "cpprb": lambda cp=cp, b=b: cp.sample(b),
                "raw NumPy": lambda raw=raw, b=b: raw.sample(b),
                "raw torch": lambda rawt=rawt, b=b: rawt(b),
            }
            if not isinstance(trl, str):
                rows[row]["TorchRL"] = lambda trl=trl, b=b: trl(b)
            targets[row] = "<= 0.5x SB3, < 1x cpprb"

    fcap = 8_000 if quick else 20_000
    fsteps = frame_steps(rng, 16)
    xsteps = [{("next", "obs") if k == "next_obs" else k: v for k, v in s.items()} for s in fsteps]
    frb = ReplayBuffer(fcap, storage=FrameStorage(fcap, frame_spec(), stacked=False), num_envs=E, seed=0)
    fsb = sb3_buffer(fcap, E, frames=True)
    fsb_steps = [sb3_args(s, E) for s in fsteps]
    fcp, fraw = cpprb_buffer(fcap, frames=True), RawNumpy(fcap, frames=True)
    for i in range(fcap // E):
        frb.extend(xsteps[i % len(fsteps)])
        sb3_add(fsb)(fsb_steps[i % len(fsteps)])
        cpprb_add(fcp, frames=True)(fsteps[i % len(fsteps)])
        fraw.extend(fsteps[i % len(fsteps)])
    rows["frames: extend [8] uint8[4,84,84]"] = {
        "xpbank": cycle(xsteps, frb.extend, (fcap // E) % len(xsteps)),  # the stream goes on
        "SB3": cycle(fsb_steps, sb3_add(fsb)),
        "cpprb": cycle(fsteps, cpprb_add(fcp, frames=True)),
        "raw NumPy": cycle(fsteps, fraw.extend),
    }
    targets["frames: extend [8] uint8[4,84,84]"] = "<= 2x SB3"
    rows["frames: sample(32)"] = {
        "xpbank": lambda: frb.sample(32),
        "SB3": lambda: fsb.sample(32),
        "cpprb": lambda: fcp.sample(32),
        "raw NumPy": lambda: fraw.sample(32),
    }
    targets["frames: sample(32)"] = "unchanged, >= 1x cpprb"

    prb = fill(ReplayBuffer(cap, SPEC, sampler=PrioritizedSampler(), seed=0), cap, rng)
    pcp = cpprb_buffer(cap, prioritized=True)
    cpprb_add(pcp)(np_steps(rng, 1, cap)[0])
    prios = [np.abs(rng.standard_normal(32)).astype(np.float32) + 0.01 for _ in range(16)]
    tprios = [torch.from_numpy(p) for p in prios]

    def xp_per(p: torch.Tensor) -> None:
        prb.update_priority(prb.sample(32)["index"], p)

    def cp_per(p: np.ndarray) -> None:
        pcp.update_priorities(pcp.sample(32, beta=0.4)["indexes"], p)

    rows["prioritized: sample(32) + update(32)"] = {
        "xpbank": cycle(tprios, xp_per),
        "cpprb": cycle(prios, cp_per),
    }
    targets["prioritized: sample(32) + update(32)"] = "<= 0.5x cpprb"
    return rows, targets, skipped


def frame_spec() -> Spec:
    return Spec(
        {
            "obs": Field(FRAME, torch.uint8),
            "action": Field((), torch.int64),
            "reward": Field(()),
            ("next", "obs"): Field(FRAME, torch.uint8),
            "terminated": Field((), torch.bool),
            "truncated": Field((), torch.bool),
        }
    )


def frame_steps(rng: np.random.Generator, k: int) -> list[dict[str, Any]]:
    """``k`` [8] steps that close into a cycle: step ``i``'s next obs is step ``i+1``'s obs
    (no episode ends), so FrameStorage's checks pass on any number of passes."""
    frames = rng.integers(0, 256, (k, E, *FRAME), dtype=np.uint8)
    out = []
    for i in range(k):
        nxt = frames[(i + 1) % k]
        out.append(
            {
                "obs": frames[i],
                "action": rng.integers(0, 4, E),
                "reward": np.ones(E, np.float32),
                "next_obs": nxt,
                "terminated": np.zeros(E, bool),
                "truncated": np.zeros(E, bool),
            }
        )
    return out


# -- timing and report ---------------------------------------------------------------
def run(
    rows: dict[str, dict[str, Call]], rounds: int, calls: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, dict[str, list[float]]]:
    cases = [(row, lib, fn) for row, libs in rows.items() for lib, fn in libs.items()]
    times: dict[str, dict[str, list[float]]] = {row: {lib: [] for lib in libs} for row, libs in rows.items()}
    for _, _, fn in cases:  # warm up every call once (lazy layouts, caches, first-touch pages)
        for _ in range(20):
            fn()
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        shift = (r * 7) % len(cases)
        for row, lib, fn in cases[shift:] + cases[:shift]:
            n = max(10, calls // 10) if row.startswith(("frames", "prioritized")) else calls
            settle()
            start = clock()
            for _ in range(n):
                fn()
            times[row][lib].append((clock() - start) / n)
    return times


def ratios(a: list[float], b: list[float]) -> list[float]:
    return [x / y for x, y in zip(a, b, strict=True)]


def fmt_range(ts: list[float]) -> str:
    return f"{fmt_us(median(ts))} ({min(ts) * 1e6:.1f}-{max(ts) * 1e6:.1f})"


def tables(times: dict[str, dict[str, list[float]]], targets: dict[str, str]) -> list[dict[str, Any]]:
    peers = ["SB3", "cpprb", "TorchRL", "raw NumPy", "raw torch"]
    main_rows, index_rows = [], []
    for row, libs in times.items():
        if "xpbank plain" in libs:
            r = ratios(libs["xpbank"], libs["xpbank plain"])
            index_rows.append(
                [row, fmt_range(libs["xpbank"]), fmt_range(libs["xpbank plain"]),
                 f"{median(r):.2f}x ({min(r):.2f}-{max(r):.2f})", targets.get(row, "")]
            )  # fmt: skip
            continue
        cells = [row, fmt_range(libs["xpbank"])]
        cells += [fmt_range(libs[p]) if p in libs else "—" for p in peers]
        for p in ("SB3", "cpprb"):
            r = ratios(libs["xpbank"], libs[p]) if p in libs else None
            cells.append("—" if r is None else f"{median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
        cells.append(targets.get(row, ""))
        main_rows.append(cells)
    head = ["call", "xpbank", *peers, "xpbank / SB3", "xpbank / cpprb", "target"]
    return [
        {
            "title": "Small calls: µs per call, median (min-max over rounds)",
            "headers": head,
            "rows": main_rows,
            "notes": "",
        },
        {
            "title": "The episode index's cost: the same call with num_envs= / nstep= against the plain call",
            "headers": ["call", "with the index", "plain", "ratio", "target"],
            "rows": index_rows,
            "notes": "",
        },
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100k items only, 3 rounds (seconds)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 9; quick 3)")
    p.add_argument("--calls", type=int, default=None, help="calls per timed block (default 1000; quick 300)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="wall time, or this thread's CPU time (on a loaded machine a block preempted "
        "midway counts only the time it ran)",
    )
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or (3 if args.quick else 9)
    calls = args.calls or (300 if args.quick else 1000)
    log("building buffers ...")
    rows, targets, skipped = build(args.quick)
    freeze_heap()
    times = run(rows, rounds, calls, time.thread_time if args.clock == "cpu" else time.perf_counter)
    out = tables(times, targets)
    notes = f"{rounds} rounds of {calls} calls ({calls // 10} for frames and prioritized rows)"
    notes += ", thread CPU time." if args.clock == "cpu" else ", wall time."
    if skipped:
        notes += " Skipped: " + "; ".join(skipped) + "."
    out[0]["notes"] = notes
    import cpprb
    import stable_baselines3

    versions = {
        "xpbank": xpbank.__version__,
        "stable_baselines3": stable_baselines3.__version__,
        "cpprb": getattr(cpprb, "__version__", "?"),
    }
    result = {
        "benchmark": "bench_small_calls",
        "command": "python " + " ".join(["benchmarks/bench_small_calls.py", *(argv or sys.argv[1:])]),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(versions),
        "tables": out,
        "times_us": {
            row: {lib: [t * 1e6 for t in ts] for lib, ts in libs.items()} for row, libs in times.items()
        },
    }
    for t in out:
        print(f"\n### {t['title']}\n\n{markdown_table(t['headers'], t['rows'])}\n\n{t['notes']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
