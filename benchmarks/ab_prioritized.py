"""Interleaved A/B of prioritized sample + update_priority: this tree against an older commit.

Run from the repository root::

    .venv/bin/python benchmarks/ab_prioritized.py --base main --threads 1 [--quick] [--json out.json]

The package as of ``--base`` is imported as ``xpbank_base`` (``ab_nstep.import_base``),
so both versions run in one process on the same data: a buffer of 1M items (obs
float32[64], reward; 100k with ``--quick``) with ``PrioritizedSampler(alpha=0.6,
beta=0.4)`` from each, as in ``bench_prioritized.py``. Timed: one step (``sample(256)``
then ``update_priority`` of the sampled ids with precomputed random priorities), the
sample alone, and the update alone (the ids of 64 drawn batches in turn). Where numba
is installed, this tree's step with its compiled kernels switched off (the NumPy path)
is timed too. Blocks of ``--calls`` calls alternate (the order reversed every other
round), ``--rounds`` rounds; the median block per call is reported in wall time and in
this thread's CPU time. Before timing, the two versions' batches are compared (same
seed, same draws: equal slots and weights expected). No timing is asserted anywhere.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from _common import ab_args, log, report
from ab_nstep import import_base, timed
from bench_prioritized import BATCH, per_data, priorities


def build(module: Any, capacity: int) -> Any:
    rb = module.ReplayBuffer(capacity, sampler=module.PrioritizedSampler(alpha=0.6, beta=0.4), seed=0)
    for part in per_data(capacity):
        rb.extend({k: torch.from_numpy(v) for k, v in part.items()})
    return rb


def steps(rb: Any, label: str, prios: list[torch.Tensor]) -> dict[str, Callable[[], object]]:
    """The timed calls of one buffer: a step, the sample alone, the update alone."""
    ids = [rb.sample(BATCH)["index"] for _ in range(64)]
    count = iter(range(1 << 62))

    def step() -> None:
        i = next(count)
        rb.update_priority(rb.sample(BATCH)["index"], prios[i % len(prios)])

    def update() -> None:
        i = next(count)
        rb.update_priority(ids[i % 64], prios[i % len(prios)])

    return {
        f"sample + update ({label})": step,
        f"sample ({label})": lambda: rb.sample(BATCH),
        f"update ({label})": update,
    }


def numpy_path(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run with this tree's sum-tree kernels switched off (the NumPy path)."""
    from xpbank.sampler import sumtree_numba

    on = sumtree_numba.load()

    def call() -> object:
        sumtree_numba._loaded = None
        try:
            return fn()
        finally:
            sumtree_numba._loaded = on

    return call


def same_batches(new: Any, old: Any, prios: list[torch.Tensor], n: int = 20) -> bool:
    """Whether ``n`` steps give equal slots and weights in both versions (it changes neither)."""
    state_new, state_old = new.state_dict(), old.state_dict()
    same = True
    for i in range(n):
        a, b = new.sample(BATCH), old.sample(BATCH)
        same = same and torch.equal(a["index"], b["index"]) and torch.equal(a["weight"], b["weight"])
        new.update_priority(a["index"], prios[i % len(prios)])
        old.update_priority(b["index"], prios[i % len(prios)])
    same = same and np.array_equal(
        new.sampler.priority(np.arange(1000)), old.sampler.priority(np.arange(1000))
    )
    new.load_state_dict(state_new)
    old.load_state_dict(state_old)
    return same


def main(argv: Sequence[str] | None = None) -> int:
    args = ab_args(__doc__, argv, rounds=21, quick_rounds=5)
    import xpbank
    from xpbank.sampler import sumtree_numba

    kernels = sumtree_numba.load() is not None
    log(f"sum-tree kernels: {'numba' if kernels else 'NumPy (numba off or missing)'}")
    capacity = 100_000 if args.quick else 1_000_000
    prios = [torch.from_numpy(p) for p in priorities()]
    with tempfile.TemporaryDirectory() as tmp:
        base = import_base(args.base, Path(tmp))
        log(f"building buffers of {capacity:,} items ...")
        new, old = build(xpbank, capacity), build(base, capacity)
        log(f"same slots, weights and priorities in both versions: {same_batches(new, old, prios)}")
        fns = {**steps(old, args.base, prios), **steps(new, "this tree", prios)}
        if kernels:
            fns["sample + update (this tree, NumPy path)"] = numpy_path(fns["sample + update (this tree)"])
        log("timing ...")
        results = timed(fns, args.calls, args.rounds)
    lines = [f"# prioritized A/B: this tree vs {args.base}, {capacity:,} items, batch {BATCH}\n"]
    lines += ["| timed | wall µs | CPU µs |", "|---|---|---|"]
    lines += [f"| {name} | {r['wall_us']:.1f} | {r['cpu_us']:.1f} |" for name, r in results.items()]
    return report(lines, {"args": vars(args), "results": results}, args.json)


if __name__ == "__main__":
    sys.exit(main())
