"""Prioritized replay and n-step sampling: xpbank against cpprb, TorchRL and SB3 in one run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_prioritized.py --threads 1 [--quick] [--json out.json]

Part 1, prioritized replay: 1M items (obs float32[64], reward), batch 256. One timed call
is ``sample(256)`` then an update of the 256 sampled items' priorities (precomputed
random values), for xpbank's PrioritizedSampler, cpprb's PrioritizedReplayBuffer and
TorchRL's PrioritizedSampler (where its compiled extension loads). Also xpbank's sample
and update alone (the update of 64 drawn batches' ids in turn), and a plain uniform
sample of the same batch.

Part 2, n-step: 1M items from 8 envs (obs/next_obs float32[64], reward, terminated,
truncated; random episode ends), batch 256: xpbank's uniform sample with ``NStep(3,
0.99)`` against the same buffer's plain uniform sample, and SB3's NStepReplayBuffer
(n_steps=3) against SB3's plain ReplayBuffer. Also extend with and without the episode
index (one [8] step, and [256]), and one [8] step followed by a sample, a training
loop's step (n-step: the sample then also fills the window table for the step's items).

Each part's buffers are built first and then timed together: ``--chunks`` rounds, each
running one block of ``--calls`` calls of every timed function in turn, the fastest block
of each kept, so that compared numbers share the machine's load of the same moments (it
may be shared). Per-call time in µs: wall time, or with ``--clock cpu`` this thread's CPU
time (on a loaded machine a block that outlasts the scheduler's slice is charged, in wall
time, for the processes that ran meanwhile: a step's block of 300 calls of ~100 µs is, a
lone sample's shorter block often is not). No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch

import xpbank
from _common import (
    clock,
    environment,
    fmt_ratio,
    fmt_us,
    freeze_heap,
    log,
    markdown_table,
    run_main,
    set_clock,
)
from xpbank import NStep, PrioritizedSampler, ReplayBuffer
from xpbank.nstep.kernel import kernel as nstep_kernel
from xpbank.sampler import sumtree_numba

BATCH = 256
OBS = 64
NUM_ENVS = 8
T = TypeVar("T")


def interleaved(fns: dict[str, Callable[[int], object]], calls: int, chunks: int) -> dict[str, float]:
    """Seconds per call of each function: ``chunks`` rounds, each timing one block of
    ``calls`` calls of every function in turn; the fastest block of each is kept. Compared
    functions thus share the machine's load of the same moments (it may be shared)."""
    for fn in fns.values():
        for i in range(min(calls, 20)):
            fn(i)
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(chunks):
        for name, fn in fns.items():
            start = clock()
            for i in range(calls):
                fn(i)
            best[name] = min(best[name], (clock() - start) / calls)
    return best


def priorities(k: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.exponential(size=BATCH) for _ in range(k)]


def per_data(capacity: int, chunk: int = 100_000) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(1)
    return [
        {"obs": rng.standard_normal((min(chunk, capacity - s), OBS), dtype=np.float32),
         "reward": rng.standard_normal(min(chunk, capacity - s), dtype=np.float32)}
        for s in range(0, capacity, chunk)
    ]  # fmt: skip


# -- part 1: prioritized replay ----------------------------------------------------------
Timed = dict[str, Callable[[int], object]]

# what each xpbank row times: (its name in the table, what the call does)
ALONE = {
    "xpbank sample + update": (
        "step: sample + update_priority",
        "the table above: a training loop's step, sample(B) then update_priority of its ids",
    ),
    "xpbank sample": ("sample alone", "sample(B) after sample(B): no write between two samples"),
    "xpbank update": (
        "update_priority alone",
        "the ids of 64 earlier samples in turn, with the same priorities at each turn",
    ),
    "xpbank uniform sample": ("uniform sample", "sample(B) of the same data with the uniform sampler"),
}
STEP_GAP = (
    "A step costs more than its sample and its update timed alone: a row that repeats one "
    "call finds the tree's nodes, the rows read and its own arrays in the caches where the "
    "call before left them; in a step each call follows the other (timed inside a step, "
    "both take longer). Summing the top of the tree anew after each write and the min-tree's "
    "upkeep add a few µs at most: benchmarks/profile_prioritized.py shows each phase of a step. "
    "In wall time on a loaded machine the gap widens: a step's block outlasts the scheduler's "
    "slice and is charged for other processes (--clock cpu leaves that out)."
)


def xpbank_per(capacity: int) -> Timed:
    rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6, beta=0.4), seed=0)
    uniform = ReplayBuffer(capacity, seed=0)
    for part in per_data(capacity):
        rb.extend({k: torch.from_numpy(v) for k, v in part.items()})
        uniform.extend({k: torch.from_numpy(v) for k, v in part.items()})
    prios = [torch.from_numpy(p) for p in priorities()]
    batch = rb.sample(BATCH)
    assert batch["obs"].shape == (BATCH, OBS) and batch["weight"].shape == (BATCH,)
    # update alone: the ids of 64 drawn batches in turn (each with the same priorities every
    # round: this times the trees' work; "sample + update" times a training loop's step, the
    # upkeep of the smallest priority included: see STEP_GAP)
    ids = [rb.sample(BATCH)["index"] for _ in range(64)]

    def step(i: int) -> None:
        b = rb.sample(BATCH)
        rb.update_priority(b["index"], prios[i % len(prios)])

    return {
        "xpbank sample + update": step,
        "xpbank sample": lambda i: rb.sample(BATCH),
        "xpbank update": lambda i: rb.update_priority(ids[i % len(ids)], prios[i % len(prios)]),
        "xpbank uniform sample": lambda i: uniform.sample(BATCH),
    }


def cpprb_per(capacity: int) -> Timed:
    from cpprb import PrioritizedReplayBuffer

    rb = PrioritizedReplayBuffer(capacity, {"obs": {"shape": OBS}, "rew": {}}, alpha=0.6)
    for part in per_data(capacity):
        rb.add(obs=part["obs"], rew=part["reward"])
    prios = priorities()
    sample = rb.sample(BATCH, beta=0.4)
    assert sample["obs"].shape == (BATCH, OBS) and sample["weights"].shape == (BATCH,)

    def step(i: int) -> None:
        s = rb.sample(BATCH, beta=0.4)
        rb.update_priorities(s["indexes"], prios[i % len(prios)])

    return {"cpprb sample + update": step}


def torchrl_per(capacity: int) -> Timed:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSampler as TorchRLPrioritized

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    sampler = TorchRLPrioritized(capacity, alpha=0.6, beta=0.4)  # needs torchrl._torchrl (C++)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), sampler=sampler, batch_size=BATCH)
    for part in per_data(capacity):
        n = part["reward"].shape[0]
        rb.extend(TensorDict({k: torch.from_numpy(v) for k, v in part.items()}, batch_size=[n]))
    prios = [torch.from_numpy(p) for p in priorities()]

    def step(i: int) -> None:
        b = rb.sample()
        rb.update_priority(b["index"], prios[i % len(prios)])

    step(0)
    return {"torchrl sample + update": step}


# -- part 2: n-step ------------------------------------------------------------------------
def nstep_steps(capacity: int, chunk_steps: int = 10_000) -> list[dict[str, np.ndarray]]:
    """``capacity // NUM_ENVS`` env steps as [T * E] time-major chunks."""
    rng = np.random.default_rng(2)
    out, steps = [], capacity // NUM_ENVS
    for s in range(0, steps, chunk_steps):
        n = min(chunk_steps, steps - s) * NUM_ENVS
        end = rng.random(n) < 1 / 200
        trunc = end & (rng.random(n) < 0.3)
        out.append({
            "obs": rng.standard_normal((n, OBS), dtype=np.float32),
            "next_obs": rng.standard_normal((n, OBS), dtype=np.float32),
            "reward": rng.standard_normal(n, dtype=np.float32),
            "terminated": end & ~trunc,
            "truncated": trunc,
        })  # fmt: skip
    return out


def xpbank_nstep(capacity: int) -> tuple[Timed, Timed]:
    """(samples, extends) of a plain buffer and one with ``num_envs=8, nstep=NStep(3, 0.99)``."""
    data = [{k: torch.from_numpy(v) for k, v in part.items()} for part in nstep_steps(capacity)]
    step8 = [{k: v[j * NUM_ENVS : (j + 1) * NUM_ENVS] for k, v in data[0].items()} for j in range(64)]
    step256 = [{k: v[j * BATCH : (j + 1) * BATCH] for k, v in data[0].items()} for j in range(16)]
    samples: Timed = {}
    extends: Timed = {}
    for label, kwargs in (("plain", {}), ("nstep", {"num_envs": NUM_ENVS, "nstep": NStep(3, 0.99)})):
        rb = ReplayBuffer(capacity, seed=0, **kwargs)  # type: ignore[arg-type]
        for part in data:
            rb.extend(part)
        if label == "nstep":
            assert rb.sample(BATCH)["nstep_return"].shape == (BATCH,)
        samples[f"xpbank sample ({label})"] = lambda i, rb=rb: rb.sample(BATCH)
        extends[f"extend [8] ({label})"] = lambda i, rb=rb: rb.extend(step8[i % 64])
        extends[f"extend [256] ({label})"] = lambda i, rb=rb: rb.extend(step256[i % 16])
        # a training loop's step: one env step written, one batch drawn (n-step: the
        # sample also fills the window table for the 8 items completed by the write)
        extends[f"extend [8] + sample ({label})"] = lambda i, rb=rb: write_then_sample(rb, step8[i % 64])
    return samples, extends


def write_then_sample(rb: ReplayBuffer, step: dict[str, torch.Tensor]) -> None:
    rb.extend(step)
    rb.sample(BATCH)


def sb3_nstep(capacity: int) -> Timed:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import NStepReplayBuffer
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Replay

    obs_space = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act_space = spaces.Box(-1, 1, (1,), np.float32)
    out: Timed = {}
    for label, cls, kw in (
        ("plain", SB3Replay, {}),
        ("nstep", NStepReplayBuffer, {"n_steps": 3, "gamma": 0.99}),
    ):
        rb = cls(capacity, obs_space, act_space, device="cpu", n_envs=NUM_ENVS, **kw)  # capacity // 8 steps
        t = 0
        for part in nstep_steps(capacity):  # written straight into SB3's [T, E] arrays
            n = part["reward"].shape[0] // NUM_ENVS
            rb.observations[t : t + n] = part["obs"].reshape(n, NUM_ENVS, OBS)
            rb.next_observations[t : t + n] = part["next_obs"].reshape(n, NUM_ENVS, OBS)
            rb.rewards[t : t + n] = part["reward"].reshape(n, NUM_ENVS)
            rb.dones[t : t + n] = (part["terminated"] | part["truncated"]).reshape(n, NUM_ENVS)
            rb.timeouts[t : t + n] = part["truncated"].reshape(n, NUM_ENVS)
            t += n
        rb.full, rb.pos = True, 0
        assert rb.sample(BATCH).rewards.shape == (BATCH, 1)
        out[f"sb3 sample ({label})"] = lambda i, rb=rb: rb.sample(BATCH)
    return out


def attempt(name: str, build: Callable[[], T], skipped: dict[str, str], default: T) -> T:
    log(f"building {name} ...")
    try:
        return build()
    except Exception as exc:  # a peer library that cannot run here is reported, not fatal
        skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        log(f"skipped {name}: {skipped[name]}")
        return default


def report(r: dict[str, float], capacity: int, skipped: dict[str, str], cpu: bool = False) -> str:
    lines = [f"## Prioritized replay: {capacity:,} items (obs float32[64], reward), batch {BATCH}", ""]
    base = r.get("xpbank sample + update")
    rows = []
    for name in ("xpbank", "cpprb", "torchrl"):
        t = r.get(f"{name} sample + update")
        if t is not None:
            rows.append([name, fmt_us(t), fmt_ratio(t / base if base else None)])
    lines.append(markdown_table(["library", "sample + update_priority", "time vs xpbank"], rows))
    alone = ("xpbank sample + update", "xpbank sample", "xpbank update", "xpbank uniform sample")
    if all(k in r for k in alone):
        clock_name = "this thread's CPU time" if cpu else "wall time"
        lines += ["", f"## xpbank's prioritized calls, in a step and alone, batch {BATCH} ({clock_name})", ""]
        rows = [[ALONE[k][0], fmt_us(r[k]), ALONE[k][1]] for k in alone]
        lines += [markdown_table(["timed", "µs per call", "what the call does"], rows), "", STEP_GAP]
    lines += ["", f"## N-step (n=3): {capacity:,} items from {NUM_ENVS} envs, batch {BATCH}", ""]
    rows = []
    for name in ("xpbank", "sb3"):
        plain, nstep = r.get(f"{name} sample (plain)"), r.get(f"{name} sample (nstep)")
        if plain and nstep:
            rows.append([name, fmt_us(plain), fmt_us(nstep), fmt_ratio(nstep / plain)])
    lines.append(markdown_table(["library", "uniform sample", "n-step sample", "n-step / uniform"], rows))
    used = "used" if nstep_kernel() is not None else "not used (numba missing or XPBANK_NO_NUMBA=1)"
    lines += ["", f"xpbank n-step numba kernel (xpbank.nstep.kernel): {used}"]
    extends = [(k, v) for k, v in r.items() if k.startswith("extend")]
    if extends:
        text = ", ".join(f"{k} {fmt_us(v)}" for k, v in extends)
        lines += ["", f"xpbank extend, plain vs with the episode index (num_envs=8, nstep): {text}"]
    lines += [f"\nSkipped {name}: {why}" for name, why in skipped.items()]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100k items and few calls (seconds)")
    p.add_argument("--calls", type=int, default=None, help="calls per timed block (default 300; quick 50)")
    p.add_argument("--chunks", type=int, default=5, help="timed blocks; the fastest is reported")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time, or this thread's CPU time (steadier on a loaded machine: a block longer "
        "than the scheduler's slice is not charged for the other processes that ran meanwhile)",
    )
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.calls is None:
        args.calls = 50 if args.quick else 300
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    set_clock("thread" if args.clock == "cpu" else "wall")
    warnings.filterwarnings("ignore")
    capacity = 100_000 if args.quick else 1_000_000
    freeze_heap()
    env = environment({"xpbank": xpbank.__version__})
    env["sum-tree kernels"] = "numba" if sumtree_numba.load() is not None else "NumPy (numba off or missing)"
    env["clock"] = "this thread's CPU time" if args.clock == "cpu" else "wall time"
    print("# xpbank prioritized / n-step benchmark\n\n" + " · ".join(f"{k} {v}" for k, v in env.items()))
    skipped: dict[str, str] = {}
    c, k = args.calls, args.chunks
    # each part's buffers are built first, then timed together in interleaved blocks
    per = {
        **attempt("xpbank PER", lambda: xpbank_per(capacity), skipped, {}),
        **attempt("cpprb PER", lambda: cpprb_per(capacity), skipped, {}),
        **attempt("torchrl PER", lambda: torchrl_per(capacity), skipped, {}),
    }
    log("timing prioritized replay ...")
    results = interleaved(per, c, k)
    per = {}
    gc.collect()
    none: tuple[Timed, Timed] = ({}, {})
    samples, extends = attempt("xpbank n-step", lambda: xpbank_nstep(capacity), skipped, none)
    samples = {**samples, **attempt("sb3 n-step", lambda: sb3_nstep(capacity), skipped, {})}
    log("timing n-step ...")
    results.update(interleaved(samples, c, k))
    results.update(interleaved(extends, c, k))
    print("\n" + report(results, capacity, skipped, args.clock == "cpu"), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"environment": env, "args": vars(args), "results": results, "skipped": skipped}, f, indent=2
            )
    return 1 if "xpbank PER" in skipped or "xpbank n-step" in skipped else 0


if __name__ == "__main__":
    sys.exit(run_main(main))
