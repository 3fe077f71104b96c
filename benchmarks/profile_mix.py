"""Where a mixed batch of two prioritized buffers spends its time, phase by phase.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/profile_mix.py --threads 1 [--quick] [--items N]

Two buffers of SAC-style transitions (``bench_mix.py``'s, ``--items`` each, random
priorities) with ``PrioritizedSampler()``. First, without timers, ``Mixture([a, b], [0.5,
0.5]).sample(256)`` and the two sub-samples it is made of, ``a.sample(128)`` plus
``b.sample(128)``, in interleaved blocks (this thread's CPU time, median of the
rounds). Then each is run with the library's own functions wrapped with timers
(``time.thread_time_ns``), and the time of each phase per call is printed, indented
under the phase that calls it (the median of ``--repeats`` runs); the rest of a phase is
its own Python code and what is not wrapped (the rows' ``take``). A timer costs ~0.3 µs
and a system call, which leaves the caches colder: the phases sum to more than the
untimed call. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from _common import freeze_heap, phase_medians, print_phases, time_phases
from bench_mix import _buffer
from xpbank import Mixture
from xpbank.mix import assemble
from xpbank.replay import fast_read, reading
from xpbank.sampler import prioritized_fast

# (label, depth): the phases in call order; depth is the nesting shown by the indentation
MIXTURE = [
    ("Mixture.sample", 0),
    ("counts (Mixture._draw_counts)", 1),
    ("sources' checks (Mixture._check_sources)", 1),
    ("Assembler.sample", 1),
    ("layout found anew (Assembler._layout_of)", 2),
    ("shares in place (inplace.take_shares)", 2),
    ("uniform draw, declined (fast_read.draw_records)", 3),
    ("prioritized draw into the batch (fast_read.draw_prioritized_at)", 3),
    ("draw (prioritized_fast.draw_at)", 4),
    ("compiled draw (prioritized_calls.draw)", 5),
    ("weights: power, float32 (prioritized_fast._weights)", 5),
    ("fields as views of the records (assemble._join_rows)", 2),
    ("TensorDict, weights, 'source' (assemble._batch)", 2),
]
DIRECT = [
    ("fast sample x2 (fast_read.try_prioritized)", 0),
    ("draw (prioritized_fast.draw_at)", 1),
    ("compiled draw (prioritized_calls.draw)", 2),
    ("weights: power, float32 (prioritized_fast._weights)", 2),
    ("batch: records, TensorDict (fast_read._batch)", 1),
]


def instrument(mix: Mixture, acc: dict[str, int]) -> None:
    """Wrap the real functions both calls take (module attributes, methods, instances)."""
    patches: list[tuple[Any, str, str]] = [
        (mix, "sample", "Mixture.sample"),
        (mix, "_draw_counts", "counts (Mixture._draw_counts)"),
        (mix, "_check_sources", "sources' checks (Mixture._check_sources)"),
        (mix._assembler, "sample", "Assembler.sample"),
        (mix._assembler, "_layout_of", "layout found anew (Assembler._layout_of)"),
        (assemble, "take_shares", "shares in place (inplace.take_shares)"),
        (fast_read, "draw_records", "uniform draw, declined (fast_read.draw_records)"),
        (fast_read, "draw_prioritized_at", "prioritized draw into the batch (fast_read.draw_prioritized_at)"),
        (fast_read, "draw_at", "draw (prioritized_fast.draw_at)"),
        (prioritized_fast, "_weights", "weights: power, float32 (prioritized_fast._weights)"),
        (assemble, "_join_rows", "fields as views of the records (assemble._join_rows)"),
        (assemble, "_batch", "TensorDict, weights, 'source' (assemble._batch)"),
        (reading, "try_prioritized", "fast sample x2 (fast_read.try_prioritized)"),
        (fast_read, "_batch", "batch: records, TensorDict (fast_read._batch)"),
    ]
    for rb in mix.sources:  # each sampler's compiled small calls
        calls = prioritized_fast.tree_calls(rb.sampler)
        if calls is not None:
            patches.append((calls, "draw", "compiled draw (prioritized_calls.draw)"))
    time_phases(patches, acc)


def untimed(fns: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, float]:
    """µs per call of each function: the median of ``rounds`` interleaved blocks."""
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            start = time.thread_time()
            for _ in range(calls):
                fns[name]()
            times[name].append((time.thread_time() - start) / calls * 1e6)
    return {k: statistics.median(v) for k, v in times.items()}


def phases(fn: Callable[[], object], acc: dict[str, int], calls: int, repeats: int) -> dict[str, float]:
    """µs per call of each wrapped phase: the median of ``repeats`` runs of ``calls`` calls."""
    return phase_medians(lambda: [fn() for _ in range(calls)], calls, acc, repeats)


def show(title: str, table: list[tuple[str, int]], found: dict[str, float]) -> None:
    print(title)
    print_phases(table, found, 72)
    print()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20k items per source, fewer calls (seconds)")
    p.add_argument("--items", type=int, default=None, help="items per source (default 200k; quick 20k)")
    p.add_argument("--calls", type=int, default=None, help="calls per block (default 2000; quick 300)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per call; the median is shown")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = p.parse_args(argv)
    args.items = args.items or (20_000 if args.quick else 200_000)
    args.calls = args.calls or (300 if args.quick else 2000)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    a, b = _buffer(args.items, 2, True), _buffer(args.items, 3, True)
    mix = Mixture([a, b], [0.5, 0.5], seed=0)
    k_a, k_b = mix.counts(256)
    fns: dict[str, Callable[[], object]] = {
        "mixture": lambda: mix.sample(256),
        "direct": lambda: (a.sample(k_a), b.sample(k_b)),
    }
    freeze_heap()
    for fn in fns.values():  # warm up
        for _ in range(200):
            fn()
    plain = untimed(fns, max(args.calls // 10, 20), 3 * args.repeats)
    print(
        f"# Mixture([a, b], [0.5, 0.5]).sample(256) of two prioritized buffers, {args.items:,} items each\n"
    )
    print(
        f"without timers: mixture {plain['mixture']:.1f} µs, a.sample({k_a}) + b.sample({k_b}) "
        f"{plain['direct']:.1f} µs, {plain['mixture'] / plain['direct']:.2f}x\n"
    )
    acc: dict[str, int] = {}
    instrument(mix, acc)
    show("mixture, µs per call:", MIXTURE, phases(fns["mixture"], acc, args.calls, args.repeats))
    show("direct sub-samples, µs per pair:", DIRECT, phases(fns["direct"], acc, args.calls, args.repeats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
