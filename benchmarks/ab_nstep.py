"""Interleaved A/B of n-step sampling and extend: this tree against an older commit, in one process.

Run from the repository root::

    .venv/bin/python benchmarks/ab_nstep.py --base main --threads 1 [--quick] [--json out.json]

The package as of ``--base`` is extracted with ``git archive`` into a temporary directory
and imported as ``xpbank_base`` (its imports rewritten), so both versions run in one
process on the same data (and, where numba is installed, this tree's n-step sample with
its compiled kernel switched off, the NumPy path, interleaved likewise): a buffer of
``num_envs=8, nstep=NStep(3, 0.99)`` from each, and
a plain buffer from this tree (the uniform sample n-step is compared with). 1M items
(obs/next_obs float32[64], reward, terminated, truncated; random episode ends) as in
``bench_prioritized.py``; batch 256; extend of one [8] step and of [256].

Each round runs a block of ``--calls`` calls of every timed function in turn (the order
reversed every other round), ``--rounds`` rounds; per call it reports the median block
in wall time and in this thread's CPU time (``time.thread_time``: on a shared, loaded
machine the time spent waiting for a core is left out). The base's n-step batch is
checked to equal this tree's before timing. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _common import log
from bench_prioritized import BATCH, NUM_ENVS, nstep_steps

ROOT = Path(__file__).resolve().parents[1]
_IMPORT = re.compile(r"\b(from|import) xpbank\b")


def import_base(commit: str, into: Path) -> Any:
    """The package ``src/xpbank`` as of ``commit``, importable as ``xpbank_base``."""
    blob = subprocess.run(
        ["git", "-C", str(ROOT), "archive", commit, "src/xpbank"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    package = into / "xpbank_base"
    (into / "src" / "xpbank").rename(package)
    for path in package.rglob("*.py"):
        text = path.read_text()
        text = _IMPORT.sub(lambda m: f"{m.group(1)} xpbank_base", text).replace('"xpbank.', '"xpbank_base.')
        path.write_text(text)
    sys.path.insert(0, str(into))
    return importlib.import_module("xpbank_base")


def build(module: Any, capacity: int, data: list[dict[str, torch.Tensor]], nstep: bool) -> Any:
    kwargs = {"num_envs": NUM_ENVS, "nstep": module.NStep(3, 0.99)} if nstep else {}
    rb = module.ReplayBuffer(capacity, seed=0, **kwargs)
    for part in data:
        rb.extend(part)
    return rb


def timed(fns: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median µs per call of each function over ``rounds`` interleaved blocks (wall, CPU)."""
    wall: dict[str, list[float]] = {k: [] for k in fns}
    cpu: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for _ in range(min(calls, 20)):
            fn()
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = fns[name]
            w, c = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn()
            cpu[name].append((time.thread_time() - c) / calls * 1e6)
            wall[name].append((time.perf_counter() - w) / calls * 1e6)
    return {k: {"wall_us": float(np.median(wall[k])), "cpu_us": float(np.median(cpu[k]))} for k in fns}


def numpy_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with this tree's numba n-step kernel switched off (its NumPy path); the
    switch costs two list assignments a call."""
    from xpbank.nstep import kernel as nstep_kernel

    on = list(nstep_kernel._compiled)

    def call() -> object:
        nstep_kernel._compiled[:] = [None]
        try:
            return fn()
        finally:
            nstep_kernel._compiled[:] = on

    return call


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--base", default="main", help="the commit to compare with (default main)")
    p.add_argument("--quick", action="store_true", help="100k items, fewer rounds (seconds)")
    p.add_argument("--calls", type=int, default=100, help="calls per timed block")
    p.add_argument("--rounds", type=int, default=None, help="timed blocks per function (default 31; quick 7)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = 7 if args.quick else 31
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    import xpbank
    from xpbank.nstep import kernel as nstep_kernel

    log(f"numba n-step kernel: {'used' if nstep_kernel.kernel() is not None else 'not available'}")

    capacity = 100_000 if args.quick else 1_000_000
    with tempfile.TemporaryDirectory() as tmp:
        base = import_base(args.base, Path(tmp))
        log(f"building buffers of {capacity:,} items ...")
        data = [{k: torch.from_numpy(v) for k, v in part.items()} for part in nstep_steps(capacity)]
        new, old = build(xpbank, capacity, data, True), build(base, capacity, data, True)
        plain = build(xpbank, capacity, data, False)
        a, b = new.sample(BATCH), old.sample(BATCH)
        for key in b.keys(True, True):
            if not torch.equal(a[key], b[key]):
                log(f"note: {key!r} differs between the two versions' batches")
        steps = {
            n: [{k: v[j * n : (j + 1) * n] for k, v in data[0].items()} for j in range(64)] for n in (8, 256)
        }
        count = iter(range(1 << 62))

        def extend(rb: Any, n: int) -> Callable[[], object]:
            return lambda: rb.extend(steps[n][next(count) % 64])

        log("timing samples ...")
        samples = {
            "uniform sample (this tree)": lambda: plain.sample(BATCH),
            f"n-step sample ({args.base})": lambda: old.sample(BATCH),
            "n-step sample (this tree)": lambda: new.sample(BATCH),
        }
        if nstep_kernel.kernel() is not None:  # the same buffer with the numba kernel off
            samples["n-step sample (this tree, NumPy path)"] = numpy_path(lambda: new.sample(BATCH))
        results = timed(samples, args.calls, args.rounds)
        log("timing extends ...")
        for n in (8, 256):
            extends = {
                f"extend [{n}] plain (this tree)": extend(plain, n),
                f"extend [{n}] nstep ({args.base})": extend(old, n),
                f"extend [{n}] nstep (this tree)": extend(new, n),
            }
            results.update(timed(extends, args.calls, args.rounds))
    uniform = results["uniform sample (this tree)"]
    print(f"# n-step A/B: this tree vs {args.base}, {capacity:,} items from {NUM_ENVS} envs, batch {BATCH}\n")
    print("| timed | wall µs | CPU µs | CPU vs uniform sample |\n|---|---|---|---|")
    for name, r in results.items():
        ratio = f"{r['cpu_us'] / uniform['cpu_us']:.2f}x" if "sample" in name else ""
        print(f"| {name} | {r['wall_us']:.1f} | {r['cpu_us']:.1f} | {ratio} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
