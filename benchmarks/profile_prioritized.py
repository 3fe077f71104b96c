"""Where the time of one prioritized ``sample(256)`` + ``update_priority`` goes.

Run from the repository root::

    .venv/bin/python benchmarks/profile_prioritized.py --threads 1 [--quick] [--batch 32] [--cprofile]

The same buffer as ``bench_prioritized.py`` (1M items: obs float32[64], reward; 100k with
``--quick``). The real functions of the sample and update paths are wrapped with timers
(no copy of their code), and ``--steps`` calls of ``rb.sample(256)`` (``--batch``, at
most 256) then ``rb.update_priority(batch["index"], p)`` are run ``--repeats`` times;
each phase's median time per step is printed, inclusive of the phases nested in it
(indented); a phase the calls did not take (the general path's, where the compiled
small-call paths took them) is left out. A wrapper
costs ~0.3 µs per call, so the phases' sum exceeds an unwrapped step by a few µs. Times
are this thread's CPU time (``thread_time``: a loaded machine's waits left out).
``--cprofile`` prints cProfile's top functions instead (its overhead is larger).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from _common import freeze_heap, phase_medians, print_phases, time_phases
from bench_prioritized import BATCH, per_data, priorities
from xpbank import PrioritizedSampler, ReplayBuffer
from xpbank.replay import fast_read, reading, writing
from xpbank.ring.ids import Ring
from xpbank.sampler import lazymin, prioritized_fast, sumtree, sumtree_numba
from xpbank.sampler import prioritized as prioritized_module

# (label, depth): the phases in call order; depth is the nesting shown by the indentation
PHASES = [
    ("rb.sample", 0),
    ("fast sample (fast_read.try_prioritized)", 1),
    ("draw (prioritized_fast.draw_at)", 2),
    ("top prefix sums (top_prefix)", 3),
    ("smallest priority (LazyMin flush)", 3),
    ("compiled draw (prioritized_calls.draw)", 3),
    ("compiled draw (sumtree_numba.draw_fresh)", 3),
    ("weights: power, float32 (prioritized_fast._weights)", 3),
    ("records (RecordReader.read)", 2),
    ("TensorDict (flat_tensordict)", 2),
    ("batch: ids, records, TensorDict (fast_read._batch)", 2),
    ("general path: sampler.sample", 1),
    ("descent (find_prefix_sum)", 2),
    ("importance_weights", 2),
    ("ring.ids_of_slots", 1),
    ("rb.update_priority", 0),
    ("compiled update (prioritized_fast.update_ids)", 1),
    ("tensor path (prioritized_fast._update_tensors)", 2),
    ("compiled check (prioritized_calls.check)", 3),
    ("power (priorities.power_into)", 3),
    ("compiled tree + min-tree write (prioritized_calls.write)", 3),
    ("smallest priority upkeep (LazyMin.kept_up)", 3),
    ("host views (priorities.host_arrays)", 2),
    ("compiled check (sumtree_numba.live_priorities)", 2),
    ("power + tree write (prioritized_fast.write)", 2),
    ("compiled tree write (sumtree_numba.update)", 3),
    ("smallest priority upkeep (LazyMin.noted)", 3),
    ("general path: check_update", 1),
    ("compiled check (sumtree_numba.live_slots)", 2),
    ("general path: sampler.update_priority", 1),
    ("sum-tree write (set_leaves)", 2),
    ("smallest priority upkeep (LazyMin.changed)", 2),
]


def build(capacity: int) -> ReplayBuffer:
    rb = ReplayBuffer(capacity, sampler=PrioritizedSampler(alpha=0.6, beta=0.4), seed=0)
    for part in per_data(capacity):
        rb.extend({k: torch.from_numpy(v) for k, v in part.items()})
    return rb


def instrument(rb: ReplayBuffer, acc: dict[str, int]) -> None:
    """Wrap the real functions of both paths (module attributes, methods, instances)."""
    sampler = rb.sampler
    patches: list[tuple[Any, str, str]] = [
        (rb, "sample", "rb.sample"),
        (rb, "update_priority", "rb.update_priority"),
        (reading, "try_prioritized", "fast sample (fast_read.try_prioritized)"),
        (fast_read, "draw_at", "draw (prioritized_fast.draw_at)"),
        (fast_read, "_batch", "batch: ids, records, TensorDict (fast_read._batch)"),
        (fast_read, "flat_tensordict", "TensorDict (flat_tensordict)"),
        (prioritized_fast, "_weights", "weights: power, float32 (prioritized_fast._weights)"),
        (prioritized_fast, "_update_tensors", "tensor path (prioritized_fast._update_tensors)"),
        (prioritized_fast, "power_into", "power (priorities.power_into)"),
        (lazymin.LazyMin, "kept_up", "smallest priority upkeep (LazyMin.kept_up)"),
        (sampler, "sample", "general path: sampler.sample"),
        (sampler, "update_priority", "general path: sampler.update_priority"),
        (sumtree, "top_prefix", "top prefix sums (top_prefix)"),
        (sumtree, "find_prefix_sum", "descent (find_prefix_sum)"),
        (sumtree, "set_leaves", "sum-tree write (set_leaves)"),
        (prioritized_module, "importance_weights", "importance_weights"),
        (writing, "update_ids", "compiled update (prioritized_fast.update_ids)"),
        (prioritized_fast, "host_arrays", "host views (priorities.host_arrays)"),
        (prioritized_fast, "write", "power + tree write (prioritized_fast.write)"),
        (writing, "check_update", "general path: check_update"),
        (Ring, "ids_of_slots", "ring.ids_of_slots"),
        (lazymin.LazyMin, "_flush", "smallest priority (LazyMin flush)"),
        (lazymin.LazyMin, "changed", "smallest priority upkeep (LazyMin.changed)"),
        (lazymin.LazyMin, "noted", "smallest priority upkeep (LazyMin.noted)"),
    ]
    kernels = sumtree_numba.load()
    if kernels is not None:  # numba: the compiled calls that replace the NumPy phases above
        patches += [
            (kernels, "draw_fresh", "compiled draw (sumtree_numba.draw_fresh)"),
            (kernels, "live_slots", "compiled check (sumtree_numba.live_slots)"),
            (kernels, "live_priorities", "compiled check (sumtree_numba.live_priorities)"),
            (kernels, "update", "compiled tree write (sumtree_numba.update)"),
        ]
    calls = prioritized_fast.tree_calls(sampler)  # the compiled small calls' entry points
    if calls is not None:
        patches += [
            (calls, "draw", "compiled draw (prioritized_calls.draw)"),
            (calls, "check", "compiled check (prioritized_calls.check)"),
            (calls, "write", "compiled tree + min-tree write (prioritized_calls.write)"),
        ]
    plan = fast_read._plan(rb)
    if plan is not None:
        patches.append((plan.reader, "read", "records (RecordReader.read)"))
    time_phases(patches, acc)


def run_steps(rb: ReplayBuffer, prios: list[torch.Tensor], steps: int) -> None:
    size = prios[0].shape[0]
    for i in range(steps):
        batch = rb.sample(size)
        rb.update_priority(batch["index"], prios[i % len(prios)])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="100k items, fewer steps (seconds)")
    p.add_argument("--steps", type=int, default=None, help="steps per repeat (default 2000; quick 300)")
    p.add_argument("--repeats", type=int, default=5, help="repeats; the median of each phase is shown")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"items per sample (at most {BATCH})")
    p.add_argument("--cprofile", action="store_true", help="print cProfile's top 25 functions instead")
    args = p.parse_args(argv)
    if args.steps is None:
        args.steps = 300 if args.quick else 2000
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    capacity = 100_000 if args.quick else 1_000_000
    rb = build(capacity)
    prios = [torch.from_numpy(p[: args.batch]) for p in priorities()]
    freeze_heap()
    run_steps(rb, prios, 200)  # warm up
    print(f"# prioritized sample({args.batch}) + update_priority, {capacity:,} items, µs per step\n")
    if args.cprofile:
        profile = cProfile.Profile()
        profile.runcall(run_steps, rb, prios, args.steps)
        pstats.Stats(profile, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        return 0
    start = time.thread_time()
    run_steps(rb, prios, args.steps)
    plain = (time.thread_time() - start) / args.steps
    acc: dict[str, int] = {}
    instrument(rb, acc)
    found = phase_medians(lambda: run_steps(rb, prios, args.steps), args.steps, acc, args.repeats)
    print_phases(PHASES, found)  # a phase this path does not take (numba or NumPy) is left out
    print(f"\none step without timers (one run): {plain * 1e6:.1f} µs")
    print(f"load average: {np.round(__import__('os').getloadavg(), 2).tolist()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
