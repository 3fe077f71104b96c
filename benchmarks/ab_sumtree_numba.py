"""A/B of the sum-tree's compiled kernels (numba) against its NumPy path, in one process.

Run from the repository root::

    .venv/bin/python benchmarks/ab_sumtree_numba.py --threads 1 [--quick]

One buffer of 1M items (100k with ``--quick``) with a PrioritizedSampler; one step is
``sample(256)`` then ``update_priority`` of the sampled ids (precomputed random values).
Blocks of ``--calls`` steps alternate between the kernels on and off (the switch is
:func:`xpbank.sampler.sumtree_numba.load`'s result, the same tree and buffer), and each
side's median per-step CPU time (``time.process_time``) over ``--blocks`` blocks is
printed, with the sample and the update alone. Needs numba (the ``fast`` extra).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence

import numpy as np
import torch

from xpbank import PrioritizedSampler, ReplayBuffer
from xpbank.sampler import sumtree_numba


def build(capacity: int) -> ReplayBuffer:
    rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6, beta=0.4), seed=0)
    chunk = 100_000
    for start in range(0, capacity, chunk):
        n = min(chunk, capacity - start)
        rb.extend({"obs": torch.randn(n, 64), "reward": torch.randn(n)})
    rng = np.random.default_rng(0)
    rb.update_priority(np.arange(capacity), rng.random(capacity) * 10)
    return rb


def block(fn: Callable[[], object], calls: int) -> float:
    t0 = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - t0) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="100k items, few blocks (seconds)")
    p.add_argument("--calls", type=int, default=200, help="steps per block")
    p.add_argument("--blocks", type=int, default=None, help="blocks per side (default 15; quick 4)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    blocks = args.blocks or (4 if args.quick else 15)
    kernels = sumtree_numba.load()
    if kernels is None:
        print("numba is missing or XPBANK_NO_NUMBA=1: nothing to compare", file=sys.stderr)
        return 1
    capacity = 100_000 if args.quick else 1_000_000
    rb = build(capacity)
    rng = np.random.default_rng(1)
    prios = [rng.random(256) for _ in range(64)]
    ids = [rb.sample(256)["index"] for _ in range(64)]
    state = {"i": 0}

    def step() -> None:
        i = state["i"] = (state["i"] + 1) % 64
        rb.update_priority(rb.sample(256)["index"], prios[i])

    def sample() -> None:
        rb.sample(256)

    def update() -> None:
        i = state["i"] = (state["i"] + 1) % 64
        rb.update_priority(ids[i], prios[i])

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(blocks):
        for side, value in (("numba", kernels), ("NumPy", None)):
            sumtree_numba._loaded = value  # the switch find_prefix_sum / set_leaves read
            for name, fn in (("sample+update", step), ("sample", sample), ("update", update)):
                fn()  # warm (compiles on the first numba block)
                times.setdefault((name, side), []).append(block(fn, args.calls))
    sumtree_numba._loaded = kernels
    print(f"# sum-tree kernels A/B: {capacity:,} items, B=256, {blocks} x {args.calls} calls, median CPU µs")
    print(f"{'':16}{'numba':>10}{'NumPy':>10}{'speed-up':>10}")
    for name in ("sample+update", "sample", "update"):
        a, b = statistics.median(times[(name, "numba")]), statistics.median(times[(name, "NumPy")])
        print(f"{name:16}{a:10.1f}{b:10.1f}{b / a:9.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
