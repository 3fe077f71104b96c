"""Shared timing and reporting helpers for the benchmarks (no timing asserts anywhere)."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch


def time_calls(fn: Callable[[Any], object], inputs: Sequence[Any], n: int) -> float:
    """Seconds for ``n`` calls of ``fn``, cycling through the pre-made ``inputs``."""
    k = len(inputs)
    start = time.perf_counter()
    for i in range(n):
        fn(inputs[i % k])
    return time.perf_counter() - start


def best_of(fn: Callable[[int], object], calls: int, chunks: int) -> float:
    """Seconds per call: the fastest of ``chunks`` blocks of ``calls`` calls (warmed up)."""
    for i in range(min(calls, 20)):
        fn(i)
    best = float("inf")
    for _ in range(chunks):
        start = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - start) / calls)
    return best


def time_repeat(fn: Callable[[], object], n: int) -> float:
    """Seconds for ``n`` calls of the argument-less ``fn``."""
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return time.perf_counter() - start


def fastest_block(fn: Callable[[], object], calls: int, chunks: int) -> float:
    """Seconds per call of the argument-less ``fn``: the fastest of ``chunks`` blocks of
    ``calls`` calls, garbage collected before each block."""
    times = []
    for _ in range(chunks):
        settle()
        times.append(time_repeat(fn, calls) / calls)
    return min(times)


def freeze_heap() -> None:
    """Move every object alive now (imported modules ...) out of the collector's sight.

    With torch, TorchRL and SB3 imported a full ``gc.collect()`` takes ~0.1 s; after
    this it only walks what the benchmark itself made.
    """
    gc.collect()
    gc.freeze()


def settle() -> None:
    """Collect garbage so a timed phase does not pay for the previous one's."""
    gc.collect()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt_rate(per_s: float) -> str:
    """Items per second as ``12.3 M/s`` / ``850 k/s``."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:,.1f} ms"


def fmt_ratio(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rss_gb() -> float:
    """Resident set size of this process in GB (Linux; 0.0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def load_average() -> float:
    """The 1-minute load average (0.0 where unknown): how busy the machine is with others."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def environment(versions: dict[str, str]) -> dict[str, Any]:
    """What the numbers were taken on."""
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        **versions,
        "load_average_at_start": load_average(),
    }


def log(msg: str) -> None:
    """Progress goes to stderr so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def report(lines: Sequence[str], results: dict[str, Any], json_path: str | None) -> int:
    """Print the markdown report (stdout) and write ``results`` as JSON when asked."""
    print("\n".join(lines))
    if json_path:
        import json

        with open(json_path, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def ab_args(doc: str | None, argv: Sequence[str] | None, rounds: int, quick_rounds: int) -> Any:
    """The options of an interleaved A/B against a base commit (``ab_*.py``): ``--base``,
    ``--quick``, ``--calls``, ``--rounds``, ``--threads`` (applied here), ``--json``."""
    import argparse

    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--base", default="main", help="the commit to compare with (default main)")
    p.add_argument("--quick", action="store_true", help="100k items, fewer rounds (seconds)")
    p.add_argument("--calls", type=int, default=100, help="calls per timed block")
    default = f"default {rounds}; quick {quick_rounds}"
    p.add_argument("--rounds", type=int, default=None, help=f"timed blocks per function ({default})")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = quick_rounds if args.quick else rounds
    if args.threads:
        torch.set_num_threads(args.threads)
    return args
