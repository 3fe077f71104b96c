"""Bank throughput: save / load against the disk's raw rates, measured in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_bank.py --threads 1            # 1 GB bank (~4 GB RAM, ~6 GB disk)
    .venv/bin/python benchmarks/bench_bank.py --threads 1 --rounds 9 # more fresh-process rounds
    .venv/bin/python benchmarks/bench_bank.py --quick --threads 1    # 64 MB: a smoke test

What is timed (wall clock, one process, files in ``--dir``):

* raw write + fsync: one ``.npy``-sized file written in 16 MB chunks, then ``fsync``.
* raw cold read: the same file read back in 16 MB chunks into ONE reused 16 MB buffer
  after ``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` (issued after the fsync)
  dropped its pages from the page cache. Every "cold" read below is prepared the same way.
* raw cold read into fresh memory: the same file read (16 MB ``readinto`` calls) into
  one new ``np.empty`` array of its size, what ``np.fromfile`` costs: the floor for any
  loader that returns new memory, which pays the first-touch page faults the reused
  buffer never pays.
* ``xpbank.save`` (every file fsynced, then the atomic rename) and ``xpbank.load``
  (cold, checksums verified; packed rows, the default, and ``pack=False``), as rates over
  the bank's data bytes and as ratios to both raw read rates.
* ``--faults``: the fault experiment in the same rounds: touching new memory of the
  bank's size (one byte per page) and the raw read into fresh memory, each with and
  without ``MADV_HUGEPAGE``.
* The raw reads and the loads run ``--rounds`` times, interleaved, each in a fresh
  process (a load's memory is then new to the process, as for a user's first load);
  the table gives the median of each.
* ``xpbank.open_bank`` and ``buffer.checkpoint()`` (after appending 256 items) on a
  small bank and the large one: median of several calls.
* ``torch.save(rb.state_dict())`` + fsync and ``torch.load(weights_only=True)`` (cold) +
  ``load_state_dict``; TorchRL ``ReplayBuffer.dumps`` + fsync of the files it wrote and
  ``loads`` (cold) of the same items, when TorchRL imports.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, load_average, log, markdown_table, run_main

CHUNK = 16 << 20
OBS = 64


def make_buffer(n: int, seed: int = 0) -> xpbank.ReplayBuffer:
    """A full transition buffer of ``n`` items (526 bytes each)."""
    spec = xpbank.Spec(
        {
            "obs": xpbank.Field((OBS,)),
            ("next", "obs"): xpbank.Field((OBS,)),
            "action": xpbank.Field((), torch.int64),
            "reward": xpbank.Field(()),
            "terminated": xpbank.Field((), torch.bool),
            "truncated": xpbank.Field((), torch.bool),
        }
    )
    rb = xpbank.ReplayBuffer(n, spec, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    step = 1 << 16
    for start in range(0, n, step):
        k = min(step, n - start)
        rb.extend(
            {
                "obs": torch.randn(k, OBS, generator=gen),
                ("next", "obs"): torch.randn(k, OBS, generator=gen),
                "action": torch.randint(0, 18, (k,), generator=gen),
                "reward": torch.randn(k, generator=gen),
                "terminated": torch.rand(k, generator=gen) < 0.01,
                "truncated": torch.rand(k, generator=gen) < 0.01,
            }
        )
    return rb


def data_bytes(rb: xpbank.ReplayBuffer) -> int:
    spec = rb.spec
    assert spec is not None
    return len(rb) * sum(f.numel * f.dtype.itemsize for f in spec.values())


def drop_cache(root: Path) -> None:
    """Drop the page cache of every file under ``root`` (fsync first, then DONTNEED)."""
    paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def raw_write(path: Path, nbytes: int) -> float:
    """Write + fsync rate in bytes/s of one file of ``nbytes`` (kept for the reads)."""
    block = np.random.default_rng(0).integers(0, 255, CHUNK, dtype=np.uint8)
    start = time.perf_counter()
    with open(path, "wb") as f:
        left = nbytes
        while left > 0:
            n = min(left, CHUNK)
            f.write(memoryview(block)[:n])
            left -= n
        f.flush()
        os.fsync(f.fileno())
    return nbytes / (time.perf_counter() - start)


def read_reused(path: Path) -> None:
    """The raw cold read: the file through one reused 16 MB buffer."""
    buf = bytearray(CHUNK)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


def fresh_memory(nbytes: int, huge: bool) -> np.ndarray:
    """``nbytes`` of new memory, with ``MADV_HUGEPAGE`` advice when ``huge`` (Linux)."""
    out = np.empty(nbytes, np.uint8)
    if huge:
        page = mmap.PAGESIZE
        start = out.ctypes.data - out.ctypes.data % page
        madvise = ctypes.CDLL(None, use_errno=True).madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise(start, out.ctypes.data + nbytes - start, 14)  # MADV_HUGEPAGE
    return out


def touch(path: Path, huge: bool = False) -> np.ndarray:
    """The fault experiment: write one byte per page of new memory of the file's size."""
    out = fresh_memory(os.path.getsize(path), huge)
    out[:: mmap.PAGESIZE] = 1
    return out


def read_fresh(path: Path, huge: bool = False) -> np.ndarray:
    """The raw cold read into fresh memory: the file into one new array of its size."""
    out = fresh_memory(os.path.getsize(path), huge)
    view, got = memoryview(out), 0
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view[got : got + CHUNK]):
            got += n
    return out


CHILD_OPS = {
    "raw": read_reused,
    "raw-fresh": read_fresh,
    "load": lambda path: xpbank.load(path),
    "load-unpacked": lambda path: xpbank.load(path, pack=False),
    "touch": touch,
    "touch-huge": lambda path: touch(path, huge=True),
    "raw-fresh-huge": lambda path: read_fresh(path, huge=True),
}


def child(op: str, path: Path) -> None:
    """Run one timed operation in this (fresh) process; print its wall seconds."""
    start = time.perf_counter()
    CHILD_OPS[op](path)
    print(time.perf_counter() - start)


def fresh_process_times(ops: dict[str, Path], rounds: int, threads: int | None) -> dict[str, float]:
    """Median seconds of each ``op`` (a key of ``CHILD_OPS``), each call in a fresh
    process with its files' pages dropped first, the ops interleaved round by round."""
    times: dict[str, list[float]] = {op: [] for op in ops}
    for r in range(rounds):
        for op, path in ops.items():
            drop_cache(path)
            cmd = [sys.executable, __file__, "--child", op, str(path)]
            if threads:
                cmd += ["--threads", str(threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            times[op].append(float(out.split()[-1]))
        log(f"round {r + 1}/{rounds}: " + ", ".join(f"{op} {t[-1]:.3f} s" for op, t in times.items()))
    return {op: statistics.median(t) for op, t in times.items()}


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def median_time(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t, _ = timed(fn)
        times.append(t)
    return statistics.median(times)


def fsync_tree(root: Path) -> None:
    for path in [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def bench_torch(rb: xpbank.ReplayBuffer, directory: Path, nbytes: int) -> dict[str, float]:
    path = directory / "state.pt"

    def dump() -> None:
        torch.save(rb.state_dict(), path)
        fsync_tree(path)

    t_save, _ = timed(dump)
    drop_cache(path)

    def restore() -> xpbank.ReplayBuffer:
        fresh = xpbank.ReplayBuffer(rb.capacity, rb.spec)
        fresh.load_state_dict(torch.load(path, weights_only=True))
        return fresh

    t_load, back = timed(restore)
    assert len(back) == len(rb)
    path.unlink()
    return {"save": nbytes / t_save, "load": nbytes / t_load}


def bench_torchrl(rb: xpbank.ReplayBuffer, directory: Path, nbytes: int) -> dict[str, float] | None:
    try:
        from torchrl.data import LazyTensorStorage, ReplayBuffer
    except Exception as exc:  # any import problem: skip with the reason
        log(f"torchrl skipped: {exc!r}")
        return None
    td = rb.sample_all().exclude("index")
    trl = ReplayBuffer(storage=LazyTensorStorage(len(rb)))
    trl.extend(td)
    del td
    path = directory / "torchrl"

    def dump() -> None:
        trl.dumps(path)
        fsync_tree(path)

    t_save, _ = timed(dump)
    drop_cache(path)
    fresh = ReplayBuffer(storage=LazyTensorStorage(len(rb)))
    t_load, _ = timed(lambda: fresh.loads(path))
    assert len(fresh) == len(rb)
    shutil.rmtree(path)
    return {"save": nbytes / t_save, "load": nbytes / t_load}


def bench_small_ops(path: Path, repeat: int) -> dict[str, float]:
    """Median seconds of open_bank (r) and of append 256 + checkpoint (r+)."""
    drop_cache(path)
    t_open = median_time(lambda: xpbank.open_bank(path, "r"), repeat)
    bank = xpbank.open_bank(path, "r+")
    spec = bank.spec
    assert spec is not None
    batch = {k: torch.zeros(256, *f.shape, dtype=f.dtype) for k, f in spec.items()}
    times = []
    for _ in range(repeat):
        bank.extend(batch)
        t, _ = timed(bank.checkpoint)
        times.append(t)
    del bank
    return {"open": t_open, "checkpoint": statistics.median(times)}


def gbs(rate: float) -> str:
    return f"{rate / 1e9:.2f} GB/s"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a 64 MB bank instead of 1 GB")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=7, help="calls per open/checkpoint median")
    parser.add_argument(
        "--rounds", type=int, default=None, help="rounds of fresh-process reads/loads (default 7; --quick 3)"
    )
    parser.add_argument(
        "--faults",
        action="store_true",
        help="also time touching / reading into new memory (with/without THP)",
    )
    parser.add_argument("--child", nargs=2, metavar=("OP", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    rounds = args.rounds or (3 if args.quick else 7)
    big_mb = 64 if args.quick else 1024
    item = 526
    root = Path(tempfile.mkdtemp(prefix="xpbank-bench-", dir=args.dir))
    try:
        log(f"building a {big_mb} MB buffer")
        rb = make_buffer(big_mb * 2**20 // item)
        nbytes = data_bytes(rb)
        log("raw write + fsync")
        raw_w = raw_write(root / "raw.bin", nbytes)
        log("xpbank.save")
        t_save, path = timed(lambda: xpbank.save(rb, root / "big"))
        for pack in (True, False):  # what the timed loads return, checked once here
            back = xpbank.load(path, pack=pack)
            assert torch.equal(back.sample_all()["obs"], rb.sample_all()["obs"])
            del back
        log(f"raw cold reads and xpbank.load: {rounds} interleaved rounds, a fresh process each")
        raw_file = root / "raw.bin"
        ops = {"raw": raw_file, "raw-fresh": raw_file, "load": path, "load-unpacked": path}
        if args.faults:
            ops.update({"touch": raw_file, "touch-huge": raw_file, "raw-fresh-huge": raw_file})
        rates = {op: nbytes / t for op, t in fresh_process_times(ops, rounds, args.threads).items()}
        raw_file.unlink()
        raw_r, raw_f = rates["raw"], rates["raw-fresh"]
        save_rate = nbytes / t_save
        log("torch.save / torch.load")
        torch_rates = bench_torch(rb, root, nbytes)
        log("torchrl dumps / loads")
        trl_rates = bench_torchrl(rb, root, nbytes)
        log("open_bank / checkpoint")
        small = xpbank.save(make_buffer(10 * 2**20 // item, seed=1), root / "small")
        small_ops = {
            "10 MB": bench_small_ops(small, args.repeat),
            f"{big_mb} MB": bench_small_ops(path, args.repeat),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    versions = {"xpbank": xpbank.__version__}
    print(f"Environment: {environment(versions)} · load_average_at_end {load_average():.2f}\n")
    print(f"Bank of {nbytes / 2**20:.0f} MiB ({len(rb):,} items of {item} bytes, 6 fields)\n")

    def row(name: str, write: float | None, read: float) -> list[str]:
        return [
            name,
            gbs(write) if write else "",
            gbs(read),
            f"{write / raw_w:.2f}x" if write else "",
            f"{read / raw_r:.2f}x",
            f"{read / raw_f:.2f}x",
        ]

    rows = [
        row("raw write + fsync / raw cold read (one reused 16 MB buffer)", raw_w, raw_r),
        row("raw cold read into fresh memory (np.fromfile-like)", None, raw_f),
        row("xpbank save / load (packed rows, the default)", save_rate, rates["load"]),
        row("xpbank load(pack=False) (one block per field)", None, rates["load-unpacked"]),
        row(
            "torch.save(state_dict) / torch.load (one run, in process)",
            torch_rates["save"],
            torch_rates["load"],
        ),
    ]
    if trl_rates:
        rows.append(row("TorchRL dumps / loads (one run, in process)", trl_rates["save"], trl_rates["load"]))
    print(f"Reads and loads: median of {rounds} fresh-process rounds.\n")
    header = ["", "write", "read (cold)", "write / raw", "read / raw", "read / raw fresh"]
    print(markdown_table(header, rows))
    if args.faults:
        print("\nFresh memory (the same rounds, fresh processes, medians):\n")
        names = {
            "touch": "touch new memory (a byte per page)",
            "touch-huge": "touch new memory, MADV_HUGEPAGE",
            "raw-fresh": "raw cold read into fresh memory",
            "raw-fresh-huge": "raw cold read into fresh memory, MADV_HUGEPAGE",
            "raw": "raw cold read (one reused 16 MB buffer)",
        }
        print(
            markdown_table(
                ["", "seconds"], [[name, f"{nbytes / rates[op]:.3f} s"] for op, name in names.items()]
            )
        )
    print()
    print(
        markdown_table(
            ["bank", "open_bank (r)", "append 256 + checkpoint"],
            [
                [name, f"{o['open'] * 1e3:.2f} ms", f"{o['checkpoint'] * 1e3:.2f} ms"]
                for name, o in small_ops.items()
            ],
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    sys.exit(run_main(main))
