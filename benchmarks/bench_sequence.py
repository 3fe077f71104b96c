"""Sequence sampling (B=32 windows of L=80 steps, strict): cost at 10k vs 2M stored items.

    .venv/bin/python benchmarks/bench_sequence.py --threads 1 [--quick] [--json out.json]

Items: obs float32[16], a recurrent state float32[32], action, reward, terminated;
8 envs in lockstep, episodes of random length 100-2000. For each size the buffer is
filled, then ``rb.sample(32)`` (windows + the gather of 32 x 80 items) and the sampler
alone (window ids only) are timed in interleaved rounds; TorchRL's ``SliceSampler``
(``slice_len=80``, trajectories by an ``end`` key, ``strict_length=True``) runs in the
same process on the same data. ``--quick``: 10k vs 200k items.

"raw gather" is the floor any implementation pays at that size: the same windows' rows
(slots drawn by the sampler beforehand, a new set each call) read by one ``index_select``
per field from plain per-field tensors, with no sampling and no batch assembly.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, fmt_us, log, markdown_table, report, run_main

ENVS, B, L = 8, 32, 80


def make_steps(n_items: int, seed: int) -> dict[str, np.ndarray]:
    """``n_items`` time-major items of 8 envs with random episode ends."""
    rng = np.random.default_rng(seed)
    steps = n_items // ENVS
    ends = np.zeros((steps, ENVS), dtype=bool)
    for e in range(ENVS):
        t = int(rng.integers(100, 2001))
        while t < steps:
            ends[t, e] = True
            t += int(rng.integers(100, 2001))
    n = steps * ENVS
    return {
        "obs": rng.standard_normal((n, 16), dtype=np.float32),
        "hidden": rng.standard_normal((n, 32), dtype=np.float32),
        "action": rng.integers(0, 4, n),
        "reward": rng.random(n, dtype=np.float32),
        "terminated": ends.reshape(-1),
    }


def build_xpbank(data: dict[str, np.ndarray]) -> xpbank.ReplayBuffer:
    n = data["obs"].shape[0]
    rb = xpbank.ReplayBuffer(n, num_envs=ENVS, sampler=xpbank.SequenceSampler(L), seed=0)
    chunk = ENVS * 1000
    for a in range(0, n, chunk):
        rb.extend({k: torch.from_numpy(v[a : a + chunk]) for k, v in data.items()})
    rb.sampler.num_windows(rb._ring)  # index everything before timing
    return rb


def build_torchrl(data: dict[str, np.ndarray]) -> Callable[[], object]:
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    n = data["obs"].shape[0]
    # TorchRL wants each env's trajectory contiguous or marked: store env-major with an end flag
    order = np.arange(n).reshape(-1, ENVS).T.reshape(-1)
    end = data["terminated"][order].copy()
    end.reshape(ENVS, -1)[:, -1] = True  # each env's stream ends where the data does
    td = TensorDict({k: torch.from_numpy(v[order]) for k, v in data.items()}, batch_size=[n])
    td["end"] = torch.from_numpy(end)
    sampler = SliceSampler(slice_len=L, end_key="end", strict_length=True, cache_values=True)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(n), sampler=sampler, batch_size=B * L)
    rb.extend(td)
    return lambda: rb.sample()


def build_raw_gather(
    rb: xpbank.ReplayBuffer, data: dict[str, np.ndarray], sets: int = 64
) -> Callable[[], object]:
    """Gather the rows of pre-drawn windows (a new set each call) from per-field tensors."""
    fields = {k: torch.from_numpy(v) for k, v in data.items()}
    windows = [rb.sampler.sample(rb._ring, B, rb.generator)[0].reshape(-1) for _ in range(sets)]
    turn = iter(range(1 << 62))

    def gather() -> dict[str, torch.Tensor]:
        slots = windows[next(turn) % sets]
        return {k: v.index_select(0, slots).view(B, L, *v.shape[1:]) for k, v in fields.items()}

    return gather


def timed(fn: Callable[[], object], calls: int) -> tuple[float, float]:
    """Seconds per call: wall time and this thread's CPU time (steadier on a loaded machine)."""
    fn()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls, (time.thread_time() - cpu) / calls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10k vs 200k items, few calls")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = (10_000, 200_000 if args.quick else 2_000_000)
    rounds, calls = (3, 20) if args.quick else (9, 50)
    fns: dict[str, Callable[[], object]] = {}
    skipped: dict[str, str] = {}
    for size in sizes:
        data = make_steps(size, seed=size)
        t0 = time.perf_counter()
        rb = build_xpbank(data)
        log(f"xpbank: {len(rb):,} items, {rb.sampler.num_windows(rb._ring):,} windows, "
            f"filled in {time.perf_counter() - t0:.1f} s")  # fmt: skip
        fns[f"xpbank rb.sample(32) @ {size:,}"] = lambda rb=rb: rb.sample(B)
        fns[f"xpbank sampler only @ {size:,}"] = lambda rb=rb: rb.sampler.sample(rb._ring, B, rb.generator)
        fns[f"raw gather of the same rows @ {size:,}"] = build_raw_gather(rb, data)
        try:
            fns[f"torchrl SliceSampler @ {size:,}"] = build_torchrl(data)
        except Exception as exc:  # an optional peer: report why it did not run
            skipped[f"torchrl @ {size:,}"] = f"{type(exc).__name__}: {exc}"[:200]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for r in range(rounds):
        log(f"round {r + 1}/{rounds}")
        for name, fn in fns.items():
            n = calls if "torchrl" not in name else max(2, calls // 10)
            times[name].append(timed(fn, n))
    med = {name: statistics.median(w for w, _ in v) for name, v in times.items()}
    med_cpu = {name: statistics.median(c for _, c in v) for name, v in times.items()}
    rows = [[name, fmt_us(v), fmt_us(med_cpu[name])] for name, v in med.items()]
    small, large = sizes
    out = ["# Sequence sampling, B=32, L=80, strict", "", f"environment: {environment({})}", ""]
    out += [markdown_table(["what", "per call (median)", "CPU per call (median)"], rows), ""]
    results: dict[str, Any] = {"median_s": med, "median_cpu_s": med_cpu, "skipped": skipped}
    whats = ("xpbank rb.sample(32)", "xpbank sampler only", "raw gather of the same rows")
    whats += ("torchrl SliceSampler",)
    for what in whats:
        a, b = med.get(f"{what} @ {small:,}"), med.get(f"{what} @ {large:,}")
        ca, cb = med_cpu.get(f"{what} @ {small:,}"), med_cpu.get(f"{what} @ {large:,}")
        if a and b and ca and cb:
            out.append(
                f"- {what}: {large:,} items / {small:,} items = {b / a:.2f}x (CPU time: {cb / ca:.2f}x)"
            )
            results[f"{what} ratio"] = b / a
            results[f"{what} CPU ratio"] = cb / ca
    x, t = med.get(f"xpbank rb.sample(32) @ {large:,}"), med.get(f"torchrl SliceSampler @ {large:,}")
    if x and t:
        out.append(f"- at {large:,} items TorchRL's SliceSampler takes {t / x:.1f}x xpbank's time")
    out.append(f"skipped: {skipped}" if skipped else "skipped: none")
    return report(out, results, args.json)


if __name__ == "__main__":
    sys.exit(run_main(main))
