"""Small writes, this tree against ``--base``, with SB3's ``add`` in the same process (issue 21).

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/ab_small_writes.py --threads 1 [--base main] \
        [--quick] [--json out.json]

The package as of ``--base`` is extracted with ``git archive`` and imported as
``xpbank_base`` (``ab_nstep.import_base``), so both versions write the same pre-made
inputs in one process. The write rows of ``bench_small_calls.py`` (CartPole
transitions, buffers of 100k filled to capacity first, so every write is a steady-state
write into a full ring):

- ``add`` of one transition: NumPy arrays + Python numbers, 0-d / 1-d torch tensors, a
  TensorDict; the NumPy one with ``num_envs=1`` and with ``nstep=NStep(3, 0.99)``;
- ``extend`` of one ``[8]`` step: NumPy, torch; the NumPy one with ``num_envs=8`` and
  with ``num_envs=8, nstep=NStep(3, 0.99)``;
- SB3's ``ReplayBuffer.add`` with ``n_envs=1`` and ``n_envs=8`` (the references).

Each round times one block of ``--calls`` calls of every function in turn (the order
reversed every other round), ``--rounds`` rounds, in this thread's CPU time (a loaded
machine's preemption does not inflate it). Reported: the median block per call, and
ratios as medians of per-round ratios: against SB3 (``add`` rows: SB3 n_envs=1;
``extend`` rows: SB3 n_envs=8), against the plain call (the episode-index rows), and
this tree / base. No timing is asserted anywhere.
"""

from __future__ import annotations

import datetime
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from tensordict import TensorDict

import xpbank
from _common import ab_args, environment, interleaved_us, log, markdown_table, median
from bench_small_calls import (
    SPEC,
    E,
    np_items,
    np_steps,
    sb3_add,
    sb3_args,
    sb3_buffer,
    torch_item,
    torch_step,
)

CAP = 100_000
# row -> (call, input kind, buffer kwargs as (num_envs, nstep), plain row it is compared with)
ROWS: dict[str, tuple[str, str, tuple[int | None, bool], str | None]] = {
    "add: NumPy + Python numbers": ("add", "items", (None, False), None),
    "add: torch 0-d / 1-d": ("add", "titems", (None, False), None),
    "add: TensorDict": ("add", "tds", (None, False), None),
    "add: NumPy, num_envs=1": ("add", "items", (1, False), "add: NumPy + Python numbers"),
    "add: NumPy, nstep=NStep(3, 0.99)": ("add", "items", (1, True), "add: NumPy + Python numbers"),
    "extend [8]: NumPy": ("extend", "steps", (None, False), None),
    "extend [8]: torch": ("extend", "tsteps", (None, False), None),
    "extend [8]: NumPy, num_envs=8": ("extend", "steps", (E, False), "extend [8]: NumPy"),
    "extend [8]: NumPy, num_envs=8, nstep": ("extend", "steps", (E, True), "extend [8]: NumPy"),
}


def buffer(module: Any, num_envs: int | None, nstep: bool, rng: np.random.Generator) -> Any:
    """A buffer of ``module`` (this tree's or the base's), filled to capacity."""
    spec = module.Spec({k: module.Field(f.shape, f.dtype) for k, f in SPEC.items()})
    kw: dict[str, Any] = {"num_envs": num_envs} if num_envs else {}
    if nstep:
        kw["nstep"] = module.NStep(3, 0.99)
    rb = module.ReplayBuffer(CAP, spec, seed=0, **kw)
    rb.extend(np_steps(rng, 1, CAP)[0])
    return rb


def build(base: Any) -> dict[str, Callable[[int], object]]:
    """Every timed function, by name; each takes the call's number (it picks the input)."""
    rng = np.random.default_rng(0)
    items = np_items(rng, 64)
    titems = [torch_item(i) for i in items]
    inputs = {
        "items": items,
        "titems": titems,
        "tds": [TensorDict(t, batch_size=[]) for t in titems],
        "steps": np_steps(rng, 64, E),
    }
    inputs["tsteps"] = [torch_step(s) for s in inputs["steps"]]
    fns: dict[str, Callable[[int], object]] = {}
    for label, module in (("this tree", xpbank), ("base", base)):
        if module is None:
            continue
        for row, (call, kind, (num_envs, nstep), _) in ROWS.items():
            method = getattr(buffer(module, num_envs, nstep, rng), call)
            data = inputs[kind]
            fns[f"{row} ({label})"] = lambda i, m=method, d=data: m(d[i % 64])
    for n in (1, E):
        sb = sb3_buffer(CAP, n)
        args = [
            sb3_args({k: np.asarray(v) for k, v in s.items()}, n)
            for s in (items if n == 1 else inputs["steps"])
        ]
        add = sb3_add(sb)
        for i in range(CAP // n):
            add(args[i % 64])
        fns[f"SB3 add n_envs={n}"] = lambda i, a=add, d=args: a(d[i % 64])
    return fns


def ratio(t: dict[str, list[float]], a: str, b: str) -> str:
    if a not in t or b not in t:
        return ""
    return f"{median([x / y for x, y in zip(t[a], t[b], strict=True)]):.2f}x"


def table(t: dict[str, list[float]]) -> dict[str, Any]:
    rows = []
    for row, (call, _, _, plain) in ROWS.items():
        ref = "SB3 add n_envs=1" if call == "add" else f"SB3 add n_envs={E}"
        this, base = f"{row} (this tree)", f"{row} (base)"
        vs = (
            (ratio(t, this, f"{plain} (this tree)"), ratio(t, base, f"{plain} (base)")) if plain else ("", "")
        )
        rows.append(
            [
                row,
                f"{median(t[this]):.2f}",
                f"{median(t[base]):.2f}" if base in t else "",
                ratio(t, this, base),
                f"{median(t[ref]):.2f}",
                ratio(t, this, ref),
                ratio(t, base, ref),
                *vs,
            ]
        )
    headers = ["call", "this tree µs", "base µs", "this / base", "SB3 µs", "this / SB3", "base / SB3",
               "this / plain", "base / plain"]  # fmt: skip
    return {"title": "small writes, this tree vs base", "headers": headers, "rows": rows, "notes": ""}


def main(argv: list[str] | None = None) -> int:
    args = ab_args(__doc__, argv, rounds=15, quick_rounds=5)
    base = None
    if args.base:
        from ab_nstep import import_base

        base = import_base(args.base, Path(tempfile.mkdtemp(prefix="xpbank_base_")))
    log("building buffers ...")
    fns = build(base)
    calls = args.calls if args.calls != 100 else (300 if args.quick else 2000)
    t = interleaved_us(fns, calls, args.rounds, warm=min(calls, 50))
    out = table(t)
    commit = subprocess.run(["git", "rev-parse", "--short", args.base], capture_output=True, text=True).stdout
    out["notes"] = (
        f"{args.rounds} rounds of {calls} calls, thread CPU time, median block; "
        f"base = {args.base} ({commit.strip() or '?'})."
    )
    print(f"\n### {out['title']}\n\n{markdown_table(out['headers'], out['rows'])}\n\n{out['notes']}")
    if args.json:
        import json

        doc = {
            "benchmark": "ab_small_writes",
            "command": "python " + " ".join(["benchmarks/ab_small_writes.py", *(argv or sys.argv[1:])]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment({"xpbank": xpbank.__version__}),
            "tables": [out],
            "times_us": t,
        }
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
