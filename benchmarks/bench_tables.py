"""Reverb-style tables: a shared-memory queue against the plain shared-memory buffer, and
heap selectors against the prioritized sampler.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_tables.py --threads 1 [--quick] [--json P] [--base main]

Part (a), a FIFO queue over shared memory: 4 writer processes (fork) each publish one
pre-built batch of ``--batch`` rows of 1 KB (float32[256]) over and over through their
``ShmWriter`` (channels of ``4 * --batch`` rows, the same on both sides); one reader (the
learner process) loops for ``--seconds``. Plain: a :class:`ShmReplayBuffer` (FIFO ring,
uniform sampler); the reader calls ``pull()`` then ``sample(256)``; reported: rows moved
into the ring per second. Queue: ``ShmReplayBuffer(..., sampler=Table.queue())`` (FIFO
selector and remover, ``max_times_sampled=1``; writers wait while it is full); the reader
calls ``sample(256)``, which takes the rows the queue has room for, then the oldest 256
items and removes them; reported: items delivered per second. Both count rows that
entered the buffer from the writers (the queue's also left it, each exactly once):
the same rows, writers, batches and capacity; what differs is the reader's work per
row: the plain reader copies each row into the ring and reads 256 random rows per pull
(of however many rows arrived), the queue's reader copies each row in and out once.
Also reported: the reader's CPU time per row (``time.thread_time``; on a loaded machine
the wall-clock rate also measures how much of a core the reader got). ``--base COMMIT``
adds the queue of that commit's package (``git archive``, imported as ``xpbank_base``)
to the same interleaved rounds: an A/B of the queue's read path in one process. The
kinds run in interleaved rounds (the order reversed every other round), each round
starting its own writers, the median round of each kept.

Part (b), heap selectors at 1M items: one timed call is ``sample(256)`` then
``update_priority`` of the 256 sampled ids (precomputed random values), for the
prioritized sampler (sum-tree; proportional draws, importance weights) and the max- and
min-heap selectors of a :class:`~xpbank.Table` (``replace=False``: the 256 highest /
lowest priorities, ties by insertion order; with replacement a heap hands out its top
item 256 times, as Reverb's does).
``--chunks`` rounds each time one block of ``--calls`` calls of every buffer in turn; the
fastest block of each is kept. ``--base COMMIT`` adds that commit's max- and min-heaps to
the same rounds (an A/B in one process; five buffers of 1M items share the caches, so
every time is higher than without). No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import importlib
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xpbank
from _common import (
    environment,
    fmt_rate,
    fmt_ratio,
    fmt_us,
    freeze_heap,
    load_average,
    log,
    markdown_table,
    run_main,
    set_clock,
)
from bench_prioritized import interleaved
from xpbank import Field, PrioritizedSampler, ReplayBuffer, Spec, Table

WRITERS, READ_BATCH, BATCH = 4, 256, 256


# -- part (a): a queue over shared memory ------------------------------------------------------
def writer_main(writer: Any, batch: int, threads: int, closed: type[Exception]) -> None:
    torch.set_num_threads(threads)
    data = {"obs": torch.from_numpy(np.ones((batch, 256), dtype=np.float32))}
    try:
        while True:  # until the reader terminates it or closes the buffer
            writer.extend(data)
    except closed:  # the package's ChannelError: the reader closed the buffer
        return


def make_buffer(kind: str, args: argparse.Namespace, module: Any) -> Any:
    """``plain``: a FIFO ring with the uniform sampler; else a queue (``module``: the
    package it comes from, this tree's or ``--base``'s)."""
    table = {} if kind == "plain" else {"sampler": module.Table.queue()}
    shm = importlib.import_module(f"{module.__name__}.distributed.shm").ShmReplayBuffer
    row = module.Spec({"obs": module.Field((256,), torch.float32)})  # 1 KB
    return shm(args.capacity, row, num_writers=WRITERS, channel_rows=4 * args.batch, seed=0, **table)


def one_round(kind: str, args: argparse.Namespace) -> tuple[float, float]:
    """Items per second into the ring (plain) or delivered once (queue) over one round,
    and the reader's CPU seconds per item."""
    module = args.base_module if kind == "queue (base)" else xpbank
    rb = make_buffer(kind, args, module)
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=writer_main,
            args=(rb.writer(w), args.batch, args.threads, module.ChannelError),
            daemon=True,
        )
        for w in range(WRITERS)
    ]
    try:
        for p in procs:
            p.start()
        count = 0
        if kind == "plain":
            while len(rb) < READ_BATCH:  # writers started
                pass
            start, cpu = time.perf_counter(), time.thread_time()
            while time.perf_counter() - start < args.seconds:
                count += rb.pull()
                rb.sample(READ_BATCH)
        else:
            rb.sample(READ_BATCH)  # writers started
            start, cpu = time.perf_counter(), time.thread_time()
            while time.perf_counter() - start < args.seconds:
                rb.sample(READ_BATCH)
                count += READ_BATCH
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    finally:
        rb.close()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return count / elapsed, cpu / max(count, 1)


def part_a(args: argparse.Namespace) -> list[str]:
    kinds = ["plain", "queue"] + (["queue (base)"] if args.base else [])
    rates: dict[str, list[float]] = {k: [] for k in kinds}
    cpus: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            rate, cpu = one_round(kind, args)
            rates[kind].append(rate)
            cpus[kind].append(cpu)
            log(f"round {r}: {kind} {fmt_rate(rate)}, reader CPU {cpu * 1e9:.0f} ns/item")
    rate = {k: statistics.median(v) for k, v in rates.items()}
    cpu = {k: statistics.median(v) for k, v in cpus.items()}
    names = {
        "plain": "plain ShmReplayBuffer: pull + sample(256)",
        "queue": "queue table: sample(256), each item once",
        "queue (base)": f"queue table as of {args.base}",
    }
    rows = [
        [names[k], fmt_rate(rate[k]), fmt_ratio(rate[k] / rate["plain"]), f"{cpu[k] * 1e9:.0f} ns",
         fmt_ratio(cpu[k] / cpu["plain"])]
        for k in kinds
    ]  # fmt: skip
    return [
        "## (a) FIFO queue, 4 writer processes, 1 reader, rows of 1 KB",
        "",
        f"writer batch {args.batch} rows, channels of {4 * args.batch} rows, {args.seconds:g} s per round, "
        f"{args.rounds} interleaved rounds (median), capacity {args.capacity:,}; items/s: rows that "
        "entered the buffer from the writers per second (the queue's also left it, each once); "
        "reader CPU: the reader thread's CPU time per row (the plain reader copies each row in and "
        "reads 256 per pull, the queue's copies each row in and out)",
        "",
        markdown_table(["reader", "items/s", "vs plain", "reader CPU per item", "CPU vs plain"], rows),
        "",
        "rounds, in order ("
        + " / ".join(kinds)
        + "): "
        + ", ".join(" / ".join(fmt_rate(rates[k][i]) for k in kinds) for i in range(args.rounds)),
        "",
    ]


# -- part (b): heap selectors ----------------------------------------------------------------
def heap_buffers(capacity: int, base: Any = None) -> dict[str, ReplayBuffer]:
    """The prioritized sampler's buffer and the heaps' (``base``: also the heaps of that
    package, ``--base``), the same items and priorities in each."""
    spec = Spec({"obs": Field((4,)), "reward": Field(())})
    rng = np.random.default_rng(1)
    per = PrioritizedSampler(alpha=0.6, beta=0.4)
    buffers = {
        "prioritized (sum-tree)": ReplayBuffer(capacity, spec, sampler=per),
        "max-heap": make_heap("max", capacity, spec),
        "min-heap": make_heap("min", capacity, spec),
    }
    if base is not None:
        base_spec = base.Spec({"obs": base.Field((4,)), "reward": base.Field(())})
        for kind in ("max", "min"):
            buffers[f"{kind}-heap (base)"] = base.ReplayBuffer(
                capacity, base_spec, sampler=base.Table(f"{kind}_heap")
            )
    for lo in range(0, capacity, 100_000):
        n = min(100_000, capacity - lo)
        obs = torch.from_numpy(rng.standard_normal((n, 4), dtype=np.float32))
        part = {"obs": obs, "reward": torch.zeros(n)}
        prio = torch.from_numpy(rng.exponential(size=n))
        for rb in buffers.values():
            ids = torch.as_tensor(rb.extend(part))
            rb.update_priority(ids, prio)
    return buffers


def make_heap(kind: str, capacity: int, spec: Spec) -> ReplayBuffer:
    return ReplayBuffer(capacity, spec, sampler=Table(f"{kind}_heap"))


def part_b(args: argparse.Namespace) -> list[str]:
    buffers = heap_buffers(args.items, args.base_module)
    prios = [torch.from_numpy(np.random.default_rng(i).exponential(size=BATCH)) for i in range(16)]
    freeze_heap()

    def step(rb: ReplayBuffer) -> Callable[[int], object]:
        distinct = (
            type(rb.sampler).__name__ == "Table"
        )  # a heap's first 256 (with replacement: its top 256 times)

        def call(i: int) -> None:
            batch = rb.sample(BATCH, replace=not distinct)
            rb.update_priority(batch["index"], prios[i % len(prios)])

        return call

    best = interleaved({name: step(rb) for name, rb in buffers.items()}, args.calls, args.chunks)
    base = best["prioritized (sum-tree)"]
    rows = [
        [name.replace("(base)", f"({args.base})"), fmt_us(t), fmt_ratio(t / base)] for name, t in best.items()
    ]
    return [
        f"## (b) Heap selectors: sample(256) + update_priority(256) at {args.items:,} items",
        "",
        f"fastest of {args.chunks} interleaved blocks of {args.calls} calls ({args.clock} clock)",
        "",
        markdown_table(["selector", "µs per sample + update", "time vs prioritized"], rows),
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="a smoke run: short rounds, 100k items")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in every process")
    p.add_argument("--batch", type=int, default=256, help="rows per writer extend")
    p.add_argument("--seconds", type=float, default=None, help="per round (default 3; quick 0.5)")
    p.add_argument("--rounds", type=int, default=None, help="rounds of each (default 5; quick 2)")
    p.add_argument("--calls", type=int, default=None, help="calls per timed block (default 200; quick 20)")
    p.add_argument("--chunks", type=int, default=None, help="timed blocks (default 7; quick 2)")
    p.add_argument("--part", choices=["a", "b", "both"], default="both")
    p.add_argument(
        "--clock", choices=["wall", "thread"], default="wall", help="part (b): wall time or thread CPU time"
    )
    p.add_argument(
        "--base", default=None, help="also the queue (a) and the heaps (b) of this commit (e.g. main)"
    )
    args = p.parse_args(argv)
    q = args.quick
    args.seconds = args.seconds or (0.5 if q else 3.0)
    args.rounds = args.rounds or (2 if q else 5)
    args.calls = args.calls or (20 if q else 200)
    args.chunks = args.chunks or (2 if q else 7)
    args.capacity = 65_536
    args.items = 100_000 if q else 1_000_000
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    args.base_module = None
    if args.base:
        from ab_nstep import import_base

        args.base_module = import_base(args.base, Path(tempfile.mkdtemp(prefix="xpbank-base-")))
    log(f"environment: {environment({})}; load average {load_average():.1f}")
    lines: list[str] = []
    if args.part in ("a", "both"):
        lines += part_a(args)
    if args.part in ("b", "both"):
        lines += part_b(args)
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(run_main(main))
