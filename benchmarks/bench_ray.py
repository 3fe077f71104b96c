"""RayReplayBuffer on a local Ray: insert and sample rows/s against shards and batch size.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_ray.py [--quick] [--shards 1 2 4] [--threads 1]

Rows are 64 float32 plus an int64 ``env_id`` (264 bytes), 64 envs, so every flush is
split over all shards and sent to them in parallel. Insert: the client ``extend``s
batches of ``--batch`` rows with ``flush_bytes`` equal to one batch, so each ``extend``
is one flush that waits for every shard's answer (rows/s that reached the shards).
Sample: ``sample(B)`` in a loop (one status round trip to every shard, then the parts
in parallel; rows/s = B x calls/s). Baseline in the same process: a local
``ReplayBuffer`` doing the same ``extend`` and ``sample`` calls.

What this measures and what not: one machine, actors and client sharing its cores; no
network, no object store spilling, no second node. Ray's per-call cost and the copies
through its object store are in the numbers; a cluster adds network latency per round
trip (a sample is two) and bandwidth per byte.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from _common import environment, fmt_rate, load_average, log, markdown_table, run_main
from xpbank import Field, ReplayBuffer, Spec

SPEC = Spec({"obs": Field((64,), torch.float32), "env_id": Field((), torch.int64)})
ROW_BYTES = 64 * 4 + 8


def batch_of(n: int) -> dict[str, torch.Tensor]:
    return {"obs": torch.ones(n, 64), "env_id": torch.arange(n) % 64}


def rate(fn: object, rows_per_call: int, seconds: float) -> float:
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()  # type: ignore[operator]
        rows += rows_per_call
    return rows / (time.perf_counter() - start)


def measure(rb: object, label: str, batch: int, args: argparse.Namespace) -> list[str]:
    """``[label, insert rows/s, sample rows/s per sample batch]`` for one buffer."""
    data = batch_of(batch)
    cells = [label, fmt_rate(rate(lambda: rb.extend(data), batch, args.seconds))]  # type: ignore[attr-defined]
    for b in args.sample_batches:
        cells.append(fmt_rate(rate(lambda b=b: rb.sample(b), b, args.seconds)))  # type: ignore[attr-defined]
    return cells


def run_ray(shards: int, args: argparse.Namespace) -> list[list[str]]:
    from xpbank.distributed.ray import RayReplayBuffer

    rows = []
    for batch in args.batches:
        rb = RayReplayBuffer(shards, args.capacity, SPEC, seed=0, flush_bytes=batch * ROW_BYTES)
        try:
            label = f"{shards} shard(s), write batch {batch} ({batch * ROW_BYTES / 2**20:.2f} MB)"
            rows.append(measure(rb, label, batch, args))
        finally:
            rb.close()
    return rows


def run_local(args: argparse.Namespace) -> list[list[str]]:
    label = "local ReplayBuffer (baseline), batch {}"
    return [
        measure(ReplayBuffer(args.capacity, SPEC, seed=0), label.format(b), b, args) for b in args.batches
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 and 2 shards, 1 s per point, a smaller buffer")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--shards", type=int, nargs="+", default=None, help="default 1 2 4 (quick: 1 2)")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="rows per write (default 4096 16384)")
    p.add_argument("--sample-batches", type=int, nargs="+", default=[256, 4096])
    p.add_argument("--seconds", type=float, default=None, help="per point (default 3; quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads here and in the actors")
    args = p.parse_args(argv)
    args.shards = args.shards or ([1, 2] if args.quick else [1, 2, 4])
    args.batches = args.batches or ([4096] if args.quick else [4096, 16384])
    args.seconds = args.seconds or (1.0 if args.quick else 3.0)
    args.capacity = 100_000 if args.quick else 1_000_000
    torch.set_num_threads(args.threads)

    import ray

    ray.init(
        num_cpus=max(args.shards) + 1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"OMP_NUM_THREADS": str(args.threads)}},
    )
    log(f"environment: {environment({'ray': ray.__version__})}; load average {load_average():.1f}")
    rows = run_local(args)
    for shards in args.shards:
        rows += run_ray(shards, args)
    ray.shutdown()
    print(
        f"rows of 64 float32 + env_id ({ROW_BYTES} B), {args.seconds:g} s per point, threads {args.threads}\n"
    )
    headers = ["setup", "insert rows/s"] + [f"sample rows/s (B={b})" for b in args.sample_batches]
    print(markdown_table(headers, rows))


if __name__ == "__main__":
    sys.exit(run_main(main))
