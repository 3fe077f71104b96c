"""Bank throughput: save / load against the disk's raw rates, measured in the same run.

Run from the repository root::

    .venv/bin/python benchmarks/bench_bank.py --threads 1            # 1 GB bank (~4 GB RAM, ~6 GB disk)
    .venv/bin/python benchmarks/bench_bank.py --quick --threads 1    # 64 MB: a smoke test

What is timed (wall clock, one process, files in ``--dir``):

* raw write + fsync: one ``.npy``-sized file written in 16 MB chunks, then ``fsync``.
* raw cold read: the same file read back in 16 MB chunks after
  ``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)`` (issued after the fsync) dropped
  its pages from the page cache. Every "cold" read below is prepared the same way.
* ``xpbank.save`` (every file fsynced, then the atomic rename) and ``xpbank.load``
  (cold, checksums verified), as rates over the bank's data bytes and as ratios to the
  raw rates.
* ``xpbank.open_bank`` and ``buffer.checkpoint()`` (after appending 256 items) on a
  small bank and the large one: median of several calls.
* ``torch.save(rb.state_dict())`` + fsync and ``torch.load(weights_only=True)`` (cold) +
  ``load_state_dict``; TorchRL ``ReplayBuffer.dumps`` + fsync of the files it wrote and
  ``loads`` (cold) of the same items, when TorchRL imports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, load_average, log, markdown_table

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


def raw_rates(directory: Path, nbytes: int) -> tuple[float, float]:
    """(write + fsync, cold read) in bytes/s for one file of ``nbytes``."""
    path = directory / "raw.bin"
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
    write = nbytes / (time.perf_counter() - start)
    drop_cache(path)
    buf = bytearray(CHUNK)
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass
    read = nbytes / (time.perf_counter() - start)
    path.unlink()
    return write, read


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
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    parser.add_argument("--repeat", type=int, default=7, help="calls per open/checkpoint median")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    big_mb = 64 if args.quick else 1024
    item = 526
    root = Path(tempfile.mkdtemp(prefix="xpbank-bench-", dir=args.dir))
    try:
        log(f"building a {big_mb} MB buffer")
        rb = make_buffer(big_mb * 2**20 // item)
        nbytes = data_bytes(rb)
        log("raw write + fsync / cold read")
        raw_w, raw_r = raw_rates(root, nbytes)
        log("xpbank.save / load")
        t_save, path = timed(lambda: xpbank.save(rb, root / "big"))
        drop_cache(path)
        t_load, back = timed(lambda: xpbank.load(path))
        assert torch.equal(back.sample_all()["obs"], rb.sample_all()["obs"])
        del back
        save_rate, load_rate = nbytes / t_save, nbytes / t_load
        log("torch.save / torch.load")
        torch_rates = bench_torch(rb, root, nbytes)
        log("torchrl dumps / loads")
        trl_rates = bench_torchrl(rb, root, nbytes)
        log("open_bank / checkpoint")
        small = xpbank.save(make_buffer(10 * 2**20 // item, seed=1), root / "small")
        ops = {
            "10 MB": bench_small_ops(small, args.repeat),
            f"{big_mb} MB": bench_small_ops(path, args.repeat),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    versions = {"xpbank": xpbank.__version__}
    print(f"Environment: {environment(versions)} · load_average_at_end {load_average():.2f}\n")
    print(f"Bank of {nbytes / 2**20:.0f} MiB ({len(rb):,} items of {item} bytes, 6 fields)\n")
    rows = [
        ["raw write + fsync / raw cold read", gbs(raw_w), gbs(raw_r), "1.00x", "1.00x"],
        [
            "xpbank save / load",
            gbs(save_rate),
            gbs(load_rate),
            f"{save_rate / raw_w:.2f}x",
            f"{load_rate / raw_r:.2f}x",
        ],
        [
            "torch.save(state_dict) / torch.load",
            gbs(torch_rates["save"]),
            gbs(torch_rates["load"]),
            f"{torch_rates['save'] / raw_w:.2f}x",
            f"{torch_rates['load'] / raw_r:.2f}x",
        ],
    ]
    if trl_rates:
        rows.append(
            [
                "TorchRL dumps / loads",
                gbs(trl_rates["save"]),
                gbs(trl_rates["load"]),
                f"{trl_rates['save'] / raw_w:.2f}x",
                f"{trl_rates['load'] / raw_r:.2f}x",
            ]
        )
    print(markdown_table(["", "write", "read (cold)", "write / raw", "read / raw"], rows))
    print()
    print(
        markdown_table(
            ["bank", "open_bank (r)", "append 256 + checkpoint"],
            [
                [name, f"{o['open'] * 1e3:.2f} ms", f"{o['checkpoint'] * 1e3:.2f} ms"]
                for name, o in ops.items()
            ],
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
