"""Atari-like transitions: bytes held and sampling speed of FrameStorage vs the naive layout.

    .venv/bin/python benchmarks/bench_images.py --threads 1 [--quick] [--json out.json]

Transitions: obs / next obs uint8[4, 84, 84] (4 stacked frames, gymnasium
FrameStackObservation semantics), action, reward, terminated, truncated; 8 envs in
lockstep, episodes of random length 100-2000. Rows, in one process, sampled in
interleaved rounds (each round times every buffer once; the table shows the median):

- raw torch: one tensor per field, every frame stored 8 times; ``index_select`` per field;
- xpbank naive: ``ReplayBuffer`` over the packed ``TensorStorage`` (same 8 frames);
- xpbank frames: ``ReplayBuffer`` over ``FrameStorage`` (one frame per step);
- cpprb: ``ReplayBuffer(next_of="obs", stack_compress="obs")``, fed one env's stream
  (cpprb's compression assumes consecutive adds are one env's steps).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, fmt_us, load_average, log, markdown_table, report, run_main

FRAME = (84, 84)
STACK = 4
ENVS = 8


class Frames:
    """Lockstep envs producing stacked frames (frames drawn from a fixed random pool)."""

    def __init__(self, num_envs: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.pool = self.rng.integers(0, 256, (997, *FRAME), dtype=np.uint8)
        self.n, self.t = num_envs, 0
        self.stacks = np.stack([self._reset() for _ in range(num_envs)])
        self.left = self.rng.integers(100, 2001, num_envs)

    def _frame(self) -> np.ndarray:
        self.t += 1
        return self.pool[self.t % self.pool.shape[0]]

    def _reset(self) -> np.ndarray:
        first = self._frame()
        return np.stack([first] * STACK)

    def step(self) -> dict[str, np.ndarray]:
        new = np.stack([self._frame() for _ in range(self.n)])[:, None]
        nxt = np.concatenate([self.stacks[:, 1:], new], 1)
        self.left -= 1
        end = self.left == 0
        cut = end & (self.rng.random(self.n) < 0.3)
        out = {
            "obs": self.stacks.copy(),
            "next_obs": nxt,
            "action": self.rng.integers(0, 18, self.n),
            "reward": self.rng.random(self.n).astype(np.float32),
            "terminated": end & ~cut,
            "truncated": cut,
        }
        self.stacks = nxt.copy()
        for e in np.flatnonzero(end):
            self.stacks[e] = self._reset()
            self.left[e] = self.rng.integers(100, 2001)
        return out


def spec() -> xpbank.Spec:
    img = xpbank.Field((STACK, *FRAME), torch.uint8)
    return xpbank.Spec(
        {
            "obs": img,
            ("next", "obs"): img,
            "action": xpbank.Field((), torch.int64),
            "reward": xpbank.Field(()),
            "terminated": xpbank.Field((), torch.bool),
            "truncated": xpbank.Field((), torch.bool),
        }
    )


def as_batch(step: dict[str, np.ndarray]) -> dict[Any, torch.Tensor]:
    return {
        "obs": torch.from_numpy(step["obs"]),
        ("next", "obs"): torch.from_numpy(step["next_obs"]),
        "action": torch.from_numpy(step["action"]),
        "reward": torch.from_numpy(step["reward"]),
        "terminated": torch.from_numpy(step["terminated"]),
        "truncated": torch.from_numpy(step["truncated"]),
    }


class Raw:
    def __init__(self, capacity: int):
        s = spec()
        self.bufs = {k: torch.empty((capacity, *f.shape), dtype=f.dtype) for k, f in s.items()}
        self.capacity, self.pos, self.size = capacity, 0, 0
        self.gen = torch.Generator().manual_seed(0)

    def extend(self, batch: dict[Any, torch.Tensor]) -> None:
        n = batch["obs"].shape[0]
        for k, buf in self.bufs.items():  # n divides capacity here: no wrap inside a batch
            buf[self.pos : self.pos + n].copy_(batch[k])
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, b: int) -> dict[Any, torch.Tensor]:
        idx = torch.randint(self.size, (b,), generator=self.gen)
        return {k: v.index_select(0, idx) for k, v in self.bufs.items()}

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.bufs.values())


def build(capacity: int) -> tuple[dict[str, Any], dict[str, Callable[[int], object]], dict[str, str]]:
    skipped: dict[str, str] = {}
    raw = Raw(capacity)
    naive = xpbank.ReplayBuffer(capacity, spec(), num_envs=ENVS, seed=0)
    storage = xpbank.FrameStorage(capacity)
    frames = xpbank.ReplayBuffer(capacity, spec(), storage=storage, num_envs=ENVS, seed=0)
    envs = Frames(ENVS, seed=0)
    t0 = time.perf_counter()
    for _ in range(capacity // ENVS):
        batch = as_batch(envs.step())
        raw.extend(batch)
        naive.extend(batch)
        frames.extend(batch)
    log(f"filled {capacity} transitions x 3 buffers in {time.perf_counter() - t0:.1f} s")
    samplers: dict[str, Callable[[int], object]] = {
        "raw torch": raw.sample,
        "xpbank naive (TensorStorage)": naive.sample,
        "xpbank frames (FrameStorage)": frames.sample,
    }
    held = {"raw torch": raw.nbytes(), "xpbank naive (TensorStorage)": naive.storage.nbytes()}
    links = frames.episodes.links()  # type: ignore[union-attr]
    names = ("env", "prev", "next", "start", "terminated", "truncated")
    index_bytes = sum(getattr(links, f).nbytes for f in names)
    held["xpbank frames (FrameStorage)"] = frames.storage.nbytes()  # type: ignore[attr-defined]
    try:
        import cpprb

        one = Frames(1, seed=1)
        env_dict = {
            "obs": {"shape": (STACK, *FRAME), "dtype": np.ubyte},
            "act": {"shape": 1, "dtype": np.int64},
            "rew": {},
            "done": {},
        }
        crb = cpprb.ReplayBuffer(capacity, env_dict, next_of="obs", stack_compress="obs")
        for _ in range(capacity):
            s = one.step()
            crb.add(obs=s["obs"][0], act=s["action"][0], rew=s["reward"][0], next_obs=s["next_obs"][0],
                    done=float(s["terminated"][0]))  # fmt: skip
            if s["terminated"][0] or s["truncated"][0]:
                crb.on_episode_end()
        samplers["cpprb (next_of + stack_compress)"] = crb.sample
    except ImportError as exc:
        skipped["cpprb"] = f"not installed ({exc})"
    info = {"held": held, "index_bytes": index_bytes, "frames_rb": frames}
    return info, samplers, skipped


def measure(
    samplers: dict[str, Callable[[int], object]], b: int, rounds: int, calls: int
) -> dict[str, tuple[float, float, float]]:
    """Per buffer: median wall time, median CPU time (this thread) and page faults per call.

    On a loaded machine the CPU time is the steadier of the two; the page faults are the
    kernel zeroing fresh memory for the sampled batch (the allocator returned the last
    batch's memory to the system), which can cost more than the copy itself.
    """
    times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in samplers}
    for _ in range(rounds):
        for name, fn in samplers.items():
            fn(b)
            faults, cpu, start = _minor_faults(), time.thread_time(), time.perf_counter()
            for _ in range(calls):
                fn(b)
            wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
            times[name].append((wall / calls, cpu / calls, (_minor_faults() - faults) / calls))
    medians: dict[str, tuple[float, float, float]] = {}
    for name, v in times.items():
        wall, cpu, faults = (statistics.median(column) for column in zip(*v, strict=True))
        medians[name] = (wall, cpu, faults)
    return medians


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="4,000 transitions, few calls (seconds)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--capacity", type=int, default=None, help="transitions stored (default 40,000)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    capacity = args.capacity or (4_000 if args.quick else 40_000)
    capacity -= capacity % ENVS
    rounds, calls = (3, 10) if args.quick else (15, 30)
    info, samplers, skipped = build(capacity)
    held = info["held"]
    naive = held["raw torch"]
    per_item = (held["xpbank frames (FrameStorage)"] + info["index_bytes"]) / capacity
    budget = 24 * 2**30
    rows = [[name, f"{v / 2**20:,.1f} MiB", f"{v / naive:.3f}x"] for name, v in held.items()]
    out = ["# Atari-like transitions: memory and sampling", "", f"environment: {environment({})}", ""]
    out += [f"{capacity:,} transitions, {ENVS} envs, episodes of 100-2000 steps", ""]
    out += [markdown_table(["buffer", "nbytes", "vs naive"], rows), ""]
    out += [
        f"FrameStorage + episode index: {per_item:,.0f} bytes per transition "
        f"(naive: {naive / capacity:,.0f}); "
        f"24 GiB holds {int(budget / per_item):,} transitions (naive: {int(budget / (naive / capacity)):,}).",
        "",
    ]
    results: dict[str, Any] = {"capacity": capacity, "held": held, "bytes_per_transition": per_item}
    for b in (32, 256):
        log(f"sampling B={b} (load average {load_average()})")
        t = measure(samplers, b, rounds, calls if b == 32 else max(3, calls // 5))
        base, peer = t["raw torch"], t.get("cpprb (next_of + stack_compress)")
        table = [
            [
                name,
                fmt_us(w),
                f"{base[0] / w:.2f}x",
                "n/a" if peer is None else f"{peer[0] / w:.2f}x",
                fmt_us(c),
                f"{base[1] / c:.2f}x",
                "n/a" if peer is None else f"{peer[1] / c:.2f}x",
                f"{f:,.0f}",
            ]
            for name, (w, c, f) in t.items()
        ]
        head = ["buffer", "per call", "vs raw", "vs cpprb", "CPU per call", "CPU vs raw", "CPU vs cpprb"]
        out += [f"sample B={b} (median of {rounds} interleaved rounds x {calls} calls)", ""]
        out += [markdown_table([*head, "page faults per call"], table), ""]
        results[f"sample_{b}"] = t
    out += [f"skipped: {skipped}" if skipped else "skipped: none"]
    return report(out, results, args.json)


if __name__ == "__main__":
    sys.exit(run_main(main))
