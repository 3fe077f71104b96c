"""Shared-memory writers: aggregate rows/s into one learner against the number of writers.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_shm.py [--quick] [--writers 1 2 4] [--threads 1]

Rows are 64 float32 (256 bytes). Each writer process (fork) publishes one pre-built batch
of ``--batch`` rows over and over through its :class:`ShmWriter`; the learner process
loops ``pull()`` + ``sample(--sample-batch)`` (uniform) for ``--seconds``. Reported:
rows the learner moved into its ring per second (every one of them published, checked
and copied twice), and sample calls per second at the same time. Baselines, in one
process: ``ReplayBuffer.extend`` with the same batches (one copy, no sampler), and the
writer's and the learner's copy timed apart.
Writers that outrun the learner wait for room: the rate is what reached the ring.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time

import torch

from _common import environment, fmt_rate, load_average, log, markdown_table, run_main
from xpbank import Field, ReplayBuffer, Spec
from xpbank.distributed.shm import ShmReplayBuffer, ShmWriter

SPEC = Spec({"obs": Field((64,), torch.float32)})


def writer_main(writer: ShmWriter, batch: int, threads: int) -> None:
    torch.set_num_threads(threads)
    data = {"obs": torch.ones(batch, 64)}
    while True:  # until the learner terminates it
        writer.extend(data)


def run_shm(writers: int, args: argparse.Namespace) -> tuple[float, float]:
    rb = ShmReplayBuffer(args.capacity, SPEC, num_writers=writers, channel_rows=4 * args.batch, seed=0)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(target=writer_main, args=(rb.writer(w), args.batch, args.threads)) for w in range(writers)
    ]
    try:
        for p in procs:
            p.start()
        while len(rb) < args.sample_batch:  # writers started
            rb.pull()
        moved, samples, start = 0, 0, time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            moved += rb.pull()
            rb.sample(args.sample_batch)
            samples += 1
        elapsed = time.perf_counter() - start
    finally:
        for p in procs:
            p.terminate()
            p.join()
        rb.close()
    return moved / elapsed, samples / elapsed


def run_local(args: argparse.Namespace) -> float:
    rb = ReplayBuffer(args.capacity, SPEC, seed=0)
    data = {"obs": torch.ones(args.batch, 64)}
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        rb.extend(data)
        rows += args.batch
    return rows / (time.perf_counter() - start)


def run_inprocess(args: argparse.Namespace) -> tuple[float, float]:
    """One process: ``writer.extend`` then ``pull`` (the two copies apart, no contention)."""
    rb = ShmReplayBuffer(args.capacity, SPEC, num_writers=1, channel_rows=4 * args.batch, seed=0)
    writer, data = rb.writer(0), {"obs": torch.ones(args.batch, 64)}
    t_write = t_pull = 0.0
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        t0 = time.perf_counter()
        for _ in range(4):
            writer.extend(data)
        t1 = time.perf_counter()
        rows += rb.pull()
        t_write, t_pull = t_write + t1 - t0, t_pull + time.perf_counter() - t1
    writer.close()
    rb.close()
    return rows / t_write, rows / t_pull


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 s per point, a smaller ring")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--writers", type=int, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--batch", type=int, default=8192, help="rows per writer extend (default 8192 = 2 MB)")
    p.add_argument("--sample-batch", type=int, default=256)
    p.add_argument("--seconds", type=float, default=None, help="per point (default 5; quick 1)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every process")
    args = p.parse_args(argv)
    args.seconds = args.seconds or (1.0 if args.quick else 5.0)
    args.capacity = 200_000 if args.quick else 1_000_000
    torch.set_num_threads(args.threads)
    log(f"environment: {environment({})}; load average {load_average():.1f}")
    rows = [["1 process, ReplayBuffer.extend (baseline)", fmt_rate(run_local(args)), "-"]]
    write, pull = run_inprocess(args)
    rows.append(["1 process, ShmWriter.extend alone (copy 1)", fmt_rate(write), "-"])
    rows.append(["1 process, pull alone (copy 2, the learner's)", fmt_rate(pull), "-"])
    for w in args.writers:
        rate, samples = run_shm(w, args)
        rows.append(
            [f"{w} writer(s) + learner sampling B={args.sample_batch}", fmt_rate(rate), fmt_rate(samples)]
        )
    print(f"64-float rows, writer batch {args.batch}, {args.seconds:g} s per point, threads {args.threads}\n")
    print(markdown_table(["setup", "rows/s into the ring", "sample calls/s"], rows))


if __name__ == "__main__":
    sys.exit(run_main(main))
