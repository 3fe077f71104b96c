"""Mixed sampling: a batch of 256 from two sources against the two sub-samples taken directly.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/bench_mix.py [--quick] [--threads 1] [--json PATH] \
        [--clock thread] [--base main]

Two sources of SAC-style transitions (obs and next_obs of 17 float32, action of 6, reward,
terminated, truncated), ``--items`` each, for uniform sources, prioritized ones, and an
offline source that is a bank opened ``"r"`` (memmap, page cache warm).

Timed, per call, interleaved round by round in one process: ``Mixture([a, b], [0.5,
0.5]).sample(256)`` (one TensorDict of 256 items with ``"source"``, fresh memory) against
the two sub-samples it is made of, ``a.sample(128)`` plus ``b.sample(128)`` on the same
buffers: the same draws (each source's own sampler and generator; checked once before
timing), without the joining and ``"source"``. A raw-tensor row (``randint`` +
``index_select`` over plain tensors of both sources, then ``cat``) shows what a mixer
over plain per-field tensors costs. The ratio per round is mixture / direct; the table
shows its median and range over rounds. ``--base COMMIT`` adds, in the same rounds, the
mixture and the direct sub-samples of that commit's package (``git archive``, imported as
``xpbank_base``: ``ab_nstep.import_base``) on buffers of the same items: an A/B of both.
"""

from __future__ import annotations

import argparse
import datetime
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import xpbank
from _common import clock, environment, fmt_us, log, markdown_table, median, report, set_clock, settle
from xpbank import Mixture, ReplayBuffer

FIELDS = {"obs": (17,), "next_obs": (17,), "action": (6,), "reward": (), "terminated": (), "truncated": ()}


def _data(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = {k: torch.randn(n, *shape, generator=g) for k, shape in FIELDS.items()}
    data["terminated"] = data["terminated"] > 1.5
    data["truncated"] = data["truncated"] > 2.0
    return data


def _buffer(n: int, seed: int, prioritized: bool, module: Any = xpbank) -> ReplayBuffer:
    """``n`` items of ``_data(n, seed)`` in a buffer of ``module`` (this tree's package, or
    ``--base``'s), uniform or prioritized (random priorities in [0.1, 1.1))."""
    rb = module.ReplayBuffer(n, seed=seed, sampler=module.PrioritizedSampler() if prioritized else None)
    rb.extend(_data(n, seed))
    if prioritized:
        rb.update_priority(
            torch.arange(n), torch.rand(n, generator=torch.Generator().manual_seed(seed)) + 0.1
        )
    return rb


def _raw(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], half: int) -> Callable[[], object]:
    n_a, n_b = len(a["obs"]), len(b["obs"])
    g = torch.Generator().manual_seed(0)

    def sample() -> dict[str, torch.Tensor]:
        ia = torch.randint(n_a, (half,), generator=g)
        ib = torch.randint(n_b, (half,), generator=g)
        return {k: torch.cat([a[k].index_select(0, ia), b[k].index_select(0, ib)]) for k in a}

    return sample


def _block(fn: Callable[[], object], calls: int) -> float:
    settle()
    start = clock()
    for _ in range(calls):
        fn()
    return (clock() - start) / calls


def _check_same_draws(mix: Mixture, counts: list[int], batch_size: int) -> None:
    """The baseline does the mixture's work: each source's share drawn by its own sampler
    and generator, so a mixed batch is the two direct sub-samples concatenated."""
    states = [rb.generator.get_state() for rb in mix.sources]
    mixed = mix.sample(batch_size)
    for rb, state in zip(mix.sources, states, strict=True):
        rb.generator.set_state(state)
    parts = [rb.sample(k) for rb, k in zip(mix.sources, counts, strict=True)]
    for key in parts[0].keys(True, True):
        if not torch.equal(mixed[key], torch.cat([p[key] for p in parts])):
            raise SystemExit(f"bench_mix: the mixed batch's {key!r} differs from the direct sub-samples")


def _pair(mix: Any, a: ReplayBuffer, b: ReplayBuffer, batch: int) -> dict[str, Callable[[], object]]:
    """The mixture's call and the direct sub-samples it is made of (checked: the same draws)."""
    k_a, k_b = counts = mix.counts(batch)  # the shares the mixture draws (exact counts)
    _check_same_draws(mix, counts, batch)
    return {"mixture": lambda: mix.sample(batch), "direct": lambda: (a.sample(k_a), b.sample(k_b))}


def run_case(
    name: str, a: ReplayBuffer, b: ReplayBuffer, args: argparse.Namespace, base: tuple[Any, Any] | None = None
) -> list[list[str]]:
    """One row per package (``base``: ``--base``'s buffers of the same items, timed in
    the same rounds)."""
    fns = _pair(Mixture([a, b], [0.5, 0.5], seed=0), a, b, args.batch)
    if base is not None:
        pair = _pair(args.base_module.Mixture(list(base), [0.5, 0.5], seed=0), *base, args.batch)
        fns.update({f"{k} (base)": fn for k, fn in pair.items()})
    for fn in fns.values():  # warm up (page cache, allocator)
        for _ in range(20):
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(args.rounds):
        for k in names if r % 2 == 0 else names[::-1]:
            times[k].append(_block(fns[k], args.calls))
    rows = []
    for suffix, label in [("", name), (" (base)", f"{name}, as of {args.base}")][: 2 if base else 1]:
        mixed, direct = times["mixture" + suffix], times["direct" + suffix]
        ratios = [m / d for m, d in zip(mixed, direct, strict=True)]
        log(f"{label}: ratios {[round(r, 3) for r in ratios]}")
        rows.append(
            [
                label,
                fmt_us(median(mixed)),
                fmt_us(median(direct)),
                f"{median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})",
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="10k items per source, few rounds (seconds)")
    p.add_argument("--items", type=int, default=None, help="items per source (default 200k; quick 10k)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--calls", type=int, default=None, help="calls per timed block (default 200; quick 50)")
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 15; quick 3)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--clock", choices=["wall", "thread"], default="wall", help="wall time or thread CPU time")
    p.add_argument("--base", default=None, help="also the mixture and sub-samples of this commit (e.g. main)")
    args = p.parse_args(argv)
    args.base_module = None
    if args.base:
        from ab_nstep import import_base

        args.base_module = import_base(args.base, Path(tempfile.mkdtemp(prefix="xpbank-base-")))
    set_clock(args.clock)
    args.items = args.items or (10_000 if args.quick else 200_000)
    args.calls = args.calls or (50 if args.quick else 200)
    args.rounds = args.rounds or (3 if args.quick else 15)
    torch.set_num_threads(args.threads)
    env = environment({"xpbank": "src"})
    old = args.base_module

    def pair(seed: int, prioritized: bool) -> tuple[Any, Any, Any]:
        """Two buffers of this package (seeds ``seed``, ``seed + 1``) and, with ``--base``, that package's."""
        a, b = _buffer(args.items, seed, prioritized), _buffer(args.items, seed + 1, prioritized)
        twins = (
            None
            if old is None
            else (
                _buffer(args.items, seed, prioritized, old),
                _buffer(args.items, seed + 1, prioritized, old),
            )
        )
        return a, b, twins

    rows = []
    a, b, twins = pair(0, False)
    rows += run_case("uniform + uniform (memory)", a, b, args, twins)
    with tempfile.TemporaryDirectory() as tmp:
        bank = xpbank.open_bank(xpbank.save(b, f"{tmp}/offline"), "r")
        banked = None if twins is None else (twins[0], old.open_bank(old.save(twins[1], f"{tmp}/base"), "r"))
        rows += run_case("uniform (memory) + bank opened 'r' (memmap)", a, bank, args, banked)
    a, b, twins = pair(2, True)
    rows += run_case("prioritized + prioritized", a, b, args, twins)
    raw = _raw(_data(args.items, 0), _data(args.items, 1), args.batch // 2)
    raw_t = median([_block(raw, args.calls) for _ in range(args.rounds)])
    rows.append(["raw tensors, 128 + 128: randint + index_select + cat", fmt_us(raw_t), "-", "-"])
    headers = ["sources", "Mixture.sample(256)", "two sub-samples (128 + 128)", "ratio median (range)"]
    notes = (
        f"Per call: Mixture([a, b], [0.5, 0.5]).sample({args.batch}) (one TensorDict with 'source') vs "
        f"a.sample({args.batch // 2}) + b.sample({args.batch - args.batch // 2}) on the same buffers "
        "(the same draws, checked); "
        f"{args.items} items per source, {args.rounds} interleaved rounds of {args.calls} calls, "
        f"threads {args.threads}, clock {args.clock}; ratio per round = mixture / direct; target <= 1.2x"
        + (f"; rows 'as of {args.base}': that commit's package in the same rounds" if args.base else "")
    )
    lines = [notes, "", markdown_table(headers, rows)]
    results = {
        "benchmark": "bench_mix",
        "command": "python benchmarks/bench_mix.py " + shlex.join(sys.argv[1:] if argv is None else argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "environment": env,
        "tables": [
            {
                "title": "Mixed sample of 256 from two sources",
                "headers": headers,
                "rows": rows,
                "notes": notes,
            }
        ],
    }
    return report(lines, results, args.json)


if __name__ == "__main__":
    raise SystemExit(main())
