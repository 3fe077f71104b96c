"""Adding image steps with frames stored once: xpbank (this tree and ``--base``) vs SB3.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/ab_frames_add.py --threads 1 [--quick] \
        [--base main] [--json out.json]

One process, one stream of Atari-like steps (``bench_images.Frames``: 8 envs in
lockstep, uint8[4, 84, 84] stacked frames, episodes of 100-2000 steps, one env's end
among many; a cycle of ``--steps`` pre-made steps whose last ends every episode, so it
repeats as a valid stream), then the same with one env (``--envs``: a table per env
count), each buffer of ``--capacity`` transitions filled past its
first wrap before timing (the steady state: every add overwrites, stacks are kept aside
as the ring wraps). Timed per call, adding one ``[8]`` step:

- SB3 ``ReplayBuffer(optimize_memory_usage=True)``: its ``add`` (the reference);
- SB3 adapter: ``XpbankReplayBuffer(optimize_memory_usage=True).add`` (whole observations
  stored once, ``FrameStorage(stacked=False)``), this tree and ``--base``;
- ``ReplayBuffer(storage=FrameStorage(...), num_envs=8).extend`` of the ``[8]`` step
  (each frame stored once), this tree and ``--base``, and this tree's with
  ``verify=False`` (the frame-stack checks skipped: their share of the time);
- ``FrameStorage(stacked=False)`` (whole observations, the SB3 adapter's layout and
  ``bench_small_calls``' frames row) ``extend`` of the step as a dict of NumPy arrays,
  this tree and ``--base``;
- ``ReplayBuffer(num_envs=8).extend`` over the packed ``TensorStorage`` (no dedup).

Then ``sample(32)`` of the FrameStorage buffers (this tree, ``--base``) against cpprb's
``ReplayBuffer(next_of="obs", stack_compress="obs")`` (fed one env's stream).

Blocks of ``--calls`` calls, ``--rounds`` rounds, each timing one block of every function
in turn (the order reversed every other round). Reported: the median block and the
range, in this thread's CPU time (steadier than wall time on a shared machine). No
timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, interleaved_us, log, markdown_table, report
from bench_images import ENVS, FRAME, STACK, Frames, as_batch, spec

E = ENVS  # envs per step (--envs)


def stream(steps: int) -> list[dict[str, np.ndarray]]:
    """``steps`` env steps whose last ends every env's episode (so the list cycles)."""
    envs = Frames(E, seed=0)
    out = [envs.step() for _ in range(steps)]
    out[-1]["terminated"][:] = True
    out[-1]["truncated"][:] = False
    return out


def adders(module: Any, label: str, capacity: int, steps: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The add calls of one xpbank version: the SB3 adapter's and FrameStorage's."""
    from gymnasium import spaces

    sb3 = __import__(f"{module.__name__}.integrations.sb3", fromlist=["XpbankReplayBuffer"])
    osp = spaces.Box(0, 255, (STACK, *FRAME), np.uint8)
    adapter = sb3.XpbankReplayBuffer(
        capacity, osp, spaces.Discrete(18), "cpu", n_envs=E, optimize_memory_usage=True
    )
    frames = module.ReplayBuffer(
        capacity, spec_of(module), storage=module.FrameStorage(capacity), num_envs=E, seed=0
    )
    whole = module.ReplayBuffer(
        capacity, spec_of(module), storage=module.FrameStorage(capacity, stacked=False), num_envs=E, seed=0
    )
    batches = [as_batch(s) for s in steps]
    arrays = [{k: v.numpy() for k, v in b.items()} for b in batches]  # the NumPy arrays SB3 is given
    out = {
        f"SB3 adapter dedup add ({label})": (adapter, lambda b, s: b.add(*sb3_args(s))),
        f"FrameStorage extend [{E}] ({label})": (frames, lambda b, s: b.extend(batches[s["_i"]])),
        f"FrameStorage(stacked=False) extend [{E}] NumPy ({label})": (
            whole,
            lambda b, s: b.extend(arrays[s["_i"]]),
        ),
    }
    if label == "this tree":  # the checks' share: the same writes, not verified
        trusting = module.FrameStorage(capacity, verify=False)
        unchecked = module.ReplayBuffer(capacity, spec_of(module), storage=trusting, num_envs=E, seed=0)
        out[f"FrameStorage(verify=False) extend [{E}] ({label})"] = (
            unchecked,
            out[f"FrameStorage extend [{E}] ({label})"][1],
        )
    return out


def spec_of(module: Any) -> Any:
    """``bench_images.spec()`` built with ``module``'s classes."""
    return module.Spec({k: module.Field(f.shape, f.dtype) for k, f in spec().items()})


def sb3_args(s: dict[str, np.ndarray]) -> tuple[Any, ...]:
    done = s["terminated"] | s["truncated"]
    infos = [{"TimeLimit.truncated": bool(t)} for t in s["truncated"]]
    return s["obs"], s["next_obs"], s["action"], s["reward"], done, infos


def build(args: argparse.Namespace, base: Any) -> tuple[dict[str, Callable[[int], object]], dict[str, Any]]:
    from gymnasium import spaces
    from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

    steps = stream(args.steps)
    for i, s in enumerate(steps):
        s["_i"] = i  # type: ignore[assignment]
    cap = args.capacity - args.capacity % E
    infos = [[{"TimeLimit.truncated": bool(t)} for t in s["truncated"]] for s in steps]
    osp = spaces.Box(0, 255, (STACK, *FRAME), np.uint8)
    sb3 = SB3Buffer(cap, osp, spaces.Discrete(18), "cpu", n_envs=E, optimize_memory_usage=True,
                    handle_timeout_termination=False)  # fmt: skip
    naive = xpbank.ReplayBuffer(cap, spec(), num_envs=E, seed=0)
    batches = [as_batch(s) for s in steps]
    calls: dict[str, tuple[Any, Callable[[Any, Any], object]]] = {
        "SB3 ReplayBuffer(optimize_memory_usage) add": (
            sb3,
            lambda b, s: b.add(
                s["obs"],
                s["next_obs"],
                s["action"],
                s["reward"],
                s["terminated"] | s["truncated"],
                infos[s["_i"]],
            ),
        ),
        f"xpbank TensorStorage extend [{E}] (no dedup)": (naive, lambda b, s: b.extend(batches[s["_i"]])),
    }
    calls.update(adders(xpbank, "this tree", cap, steps))
    if base is not None:
        calls.update(adders(base, "base", cap, steps))
    n = len(steps)
    fill = -(-2 * cap // E // n) * n  # whole cycles, past the first wrap
    log(f"filling {len(calls)} buffers with {fill} steps each")
    for buf, fn in calls.values():
        for i in range(fill):
            fn(buf, steps[i % n])
    cursor = dict.fromkeys(calls, 0)

    def timed_fn(name: str) -> Callable[[int], object]:
        buf, fn = calls[name]

        def call(_: int) -> None:
            i = cursor[name]
            cursor[name] = i + 1
            fn(buf, steps[i % n])

        return call

    extras = {"frames": calls[f"FrameStorage extend [{E}] (this tree)"][0], "capacity": cap}
    if base is not None:
        extras["base frames"] = calls[f"FrameStorage extend [{E}] (base)"][0]
    return {name: timed_fn(name) for name in calls}, extras


def samplers(extras: dict[str, Any]) -> dict[str, Callable[[int], object]]:
    frames_rb, base_rb, capacity = extras["frames"], extras.get("base frames"), extras["capacity"]
    out: dict[str, Callable[[int], object]] = {
        "FrameStorage sample(32) (this tree)": lambda i: frames_rb.sample(32)
    }
    if base_rb is not None:
        out["FrameStorage sample(32) (base)"] = lambda i: base_rb.sample(32)
    try:
        import cpprb
    except ImportError:
        return out
    one = Frames(1, seed=1)
    env_dict = {"obs": {"shape": (STACK, *FRAME), "dtype": np.ubyte}, "act": {"shape": 1, "dtype": np.int64},
                "rew": {}, "done": {}}  # fmt: skip
    crb = cpprb.ReplayBuffer(capacity, env_dict, next_of="obs", stack_compress="obs")
    for _ in range(capacity + capacity // 4):
        s = one.step()
        crb.add(obs=s["obs"][0], act=s["action"][0], rew=s["reward"][0], next_obs=s["next_obs"][0],
                done=float(s["terminated"][0]))  # fmt: skip
        if s["terminated"][0] or s["truncated"][0]:
            crb.on_episode_end()
    out["cpprb (next_of + stack_compress) sample(32)"] = lambda i: crb.sample(32)
    return out


def _cell(v: list[float]) -> str:
    return f"{np.median(v):,.1f} ({min(v):,.1f}-{max(v):,.1f})"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small buffers, few rounds (seconds)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--base", default=None, help="also time the package as of this commit (e.g. main)")
    p.add_argument("--capacity", type=int, default=None, help="transitions per buffer (default 16,000)")
    p.add_argument("--steps", type=int, default=None, help="pre-made steps in the cycle (default 400)")
    p.add_argument(
        "--envs",
        type=int,
        nargs="+",
        default=[ENVS, 1],
        help=f"envs per step, a table each (default {ENVS} 1)",
    )
    p.add_argument("--calls", type=int, default=None, help="calls per timed block (default 200)")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 9; quick 2)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    global E
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    logging.getLogger("stable_baselines3").setLevel(logging.ERROR)
    args.capacity = args.capacity or (1_600 if args.quick else 16_000)
    args.steps = args.steps or (100 if args.quick else 400)
    calls = args.calls or (20 if args.quick else 200)
    rounds = args.rounds or (2 if args.quick else 9)
    base = None
    if args.base:
        from ab_nstep import import_base

        base = import_base(args.base, Path(tempfile.mkdtemp(prefix="xpbank_base_")))
    tables, adds_by_envs, samples = [], {}, None
    for envs in args.envs:  # a table of adds per env count; samples from the first's buffers
        E = envs
        fns, extras = build(args, base)
        log(f"timing adds of [{E}] steps: {rounds} rounds x {calls} calls")
        adds = adds_by_envs[E] = interleaved_us(fns, calls, rounds)
        ref = float(np.median(adds["SB3 ReplayBuffer(optimize_memory_usage) add"]))
        tables.append(
            {
                "title": f"Adding one [{E}] step of uint8[4, 84, 84] stacks ({extras['capacity']:,} items), "
                "CPU µs",
                "headers": ["call", "median (range)", "vs SB3's add"],
                "rows": [[k, _cell(v), f"{np.median(v) / ref:.2f}x"] for k, v in adds.items()],
                "notes": "Lower is better. 'vs SB3's add': the call's time over SB3's (the target is <= 2x).",
            }
        )
        if samples is None:
            log("timing samples")
            samples = interleaved_us(samplers(extras), calls, rounds)
            peer = samples.get("cpprb (next_of + stack_compress) sample(32)")
            sample_rows = [
                [k, _cell(v), "n/a" if peer is None else f"{np.median(peer) / np.median(v):.2f}x"]
                for k, v in samples.items()
            ]
            sample_table = {
                "title": f"sample(32) from the same FrameStorage buffer ([{E}] steps), CPU µs",
                "headers": ["call", "median (range)", "speed vs cpprb"],
                "rows": sample_rows,
                "notes": "Higher speed is better (cpprb's time over the call's).",
            }
    tables.append(sample_table)
    import stable_baselines3

    versions = {"xpbank": xpbank.__version__, "stable_baselines3": stable_baselines3.__version__}
    lines = []
    for t in tables:
        lines += [f"## {t['title']}", "", markdown_table(t["headers"], t["rows"]), "", t["notes"], ""]
    result = {
        "benchmark": "ab_frames_add",
        "command": " ".join(["python", "benchmarks/ab_frames_add.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(versions),
        "tables": tables,
        "timings": {"add": {str(k): v for k, v in adds_by_envs.items()}, "sample": samples},
    }
    return report(lines, result, args.json)


if __name__ == "__main__":
    sys.exit(main())
