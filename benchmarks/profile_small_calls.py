"""Where the time of one small call goes: a per-phase profile of ``add``, ``extend`` of
one ``[8]`` step, ``sample(32)`` / ``sample(256)`` and a prioritized sample + update (issue 21).

    .venv/bin/python benchmarks/profile_small_calls.py --threads 1 [--quick] [--json out.json]

Each phase is the library's own function for that step, timed on its own over many
calls (best of ``--rounds`` blocks, thread CPU time) with the input it gets inside the real call; the
whole call is timed the same way, so the phases' sum can be compared with it (the rest
is the call's own glue: the lock, argument passing). Phases of a write:

- full path: input conversion (``flatten``), checks and cast (``Spec.conform``), the
  episode index's plan (``EpisodeIndex.plan``), the storage write, the sampler and ring
  upkeep (``on_write``, ``Ring.advance``), the index's upkeep (``EpisodeIndex.apply``);
- fast path (:mod:`xpbank.replay.fast_write`): the signature match (per-field checks
  and conversion: ``fast_values``' reader; for a batch of dense CPU tensors,
  ``raw_rows``' checker, which takes their pointers), the row store (the path the call
  takes: one compiled copy of the tensors' bytes or of an extend's NumPy arrays, a
  record store for an add, else a NumPy store per field), the sampler and ring upkeep,
  and the index's upkeep:
  for one lockstep env step one compiled call that reads the ends from the stored rows
  (``episode_step.record_step``), else
  ``EpisodeIndex.plan`` of the values and ``apply``.

A uniform sample, general path (``rb._fast_read = False``): the sampler's draw, ids
from slots, the storage gather, the TensorDict's construction; fast path
(:mod:`xpbank.replay.fast_read`): the draw into the kept slot tensor, the ids by NumPy
arithmetic, one take of whole records and a tensor per field, the TensorDict. A
prioritized ``sample(32)`` then ``update_priority`` of its 32 ids: the sampler's draw,
the batch of its slots, the update's checks and the sampler's update. The same items as
``bench_small_calls.py`` (CartPole transitions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

import numpy as np
import torch

from _common import environment, log, markdown_table
from bench_small_calls import SPEC, fill, np_items, np_steps, torch_item, torch_step
from xpbank import NStep, ReplayBuffer
from xpbank.replay import fast_read, fast_write, writing
from xpbank.ring.episode_step import record_step
from xpbank.sampler import PrioritizedSampler
from xpbank.sampler.priorities import check_update
from xpbank.spec.batch import flat_tensordict, flatten, to_tensordict


def best(fn: Callable[[], object], calls: int, rounds: int) -> float:
    """µs per call: the fastest of ``rounds`` blocks of ``calls`` calls, in this thread's
    CPU time (on a shared machine a block of whole calls, longer than a scheduler time
    slice, was preempted in every round and read 3-4x its phases' sum in wall time)."""
    for _ in range(min(calls, 50)):
        fn()
    out = float("inf")
    for _ in range(rounds):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        out = min(out, (time.thread_time() - start) / calls)
    return out * 1e6


def write_phases(rb: ReplayBuffer, batch: Any, add: bool, calls: int, rounds: int) -> list[tuple[str, float]]:
    """The phases of one write of ``batch`` into ``rb``, full path and fast path."""
    ring, storage, spec = rb._ring, rb._storage, rb.spec
    assert spec is not None
    n = 1 if add else next(iter(flatten(batch).values())).shape[0]
    bdim = 0 if add else 1
    flat = flatten(batch)
    _, conformed = writing.conform(rb, spec, flat, bdim)
    rows = {k: v.unsqueeze(0) for k, v in conformed.items()} if add else conformed
    slot = ring.next_id % ring.capacity
    slots = slice(slot, slot + n)
    eps = ring.episodes
    out = [
        ("full: input conversion (flatten)", best(lambda: flatten(batch), calls, rounds)),
        (
            "full: checks + cast (Spec.conform)",
            best(lambda: writing.conform(rb, spec, flat, bdim), calls, rounds),
        ),
    ]
    if add:
        out.append(
            (
                "full: add's unsqueeze per field",
                best(lambda: {k: v.unsqueeze(0) for k, v in conformed.items()}, calls, rounds),
            )
        )
    if eps is not None:
        plan = eps.plan(rows, n, spec)
        out.append(("full: episode plan", best(lambda: eps.plan(rows, n, spec), calls, rounds)))
    out.append(("full: storage write", best(lambda: storage.write(slots, rows), calls, rounds)))
    out.append(
        (
            "full: ring segments + sampler.on_write",
            best(lambda: (ring.segments(n), rb._sampler.on_write(slots, ring)), calls, rounds),
        )
    )
    if eps is not None:
        out.append(("full: episode apply", best(lambda: eps.apply(plan), calls, rounds)))
    rb._fast_write = False
    method = rb.add if add else rb.extend
    out.append(("full: whole call", best(lambda: method(batch), calls, rounds)))
    rb._fast_write = True
    method(batch)  # keys the signature on this batch
    sig = rb.__dict__.get("_signature")
    if sig is None:
        out.append(("fast path: not taken (no signature)", float("nan")))
        return out
    src = sig.source(batch)
    raw = sig.raw
    ptrs = None if raw is None or src is None else raw[2](src)
    values = None if ptrs is not None else sig.values(batch)
    if ptrs is None and values is None:
        out.append(("fast path: not taken (signature differs)", float("nan")))
        return out
    if ptrs is not None:  # every field a dense CPU tensor: checks + pointers, one compiled copy
        out.append(
            (
                "fast: signature match (raw_rows checker: checks + pointers)",
                best(lambda: raw[2](src), calls, rounds),
            )
        )
    else:
        out.append(
            (
                "fast: signature match + conversion (fast_values reader)",
                best(lambda: sig.values(batch), calls, rounds),
            )
        )
    step = sig.step
    first = ring.next_id
    if eps is not None and step is not None:  # one lockstep step: one compiled call after the store
        out.append(
            ("fast: episode upkeep (record_step)", best(lambda: record_step(eps, step, first), calls, rounds))
        )
    elif eps is not None:
        assert values is not None  # an index that plans from the values: no compiled copy
        by_key = dict(zip(sig.keys, values, strict=True))
        hplan = eps.plan(by_key, n, spec)
        out.append(
            ("fast: episode plan (of the values)", best(lambda: eps.plan(by_key, n, spec), calls, rounds))
        )
    arrays = sig.arrays
    if ptrs is not None:
        name = "fast: row store (raw_rows.copy_rows: one compiled copy of the tensors' bytes)"

        def store() -> None:
            raw[0](raw[1], slot, n if not add else 1, ptrs)
    elif add:
        name = "fast: row store (one record)"
        rec, tup = sig.records, tuple(values)

        def store() -> None:
            rec[slot] = tup
    elif arrays is not None and arrays[0](arrays[1], slot, n, tuple(values)):
        name = "fast: row store (raw_rows.copy_arrays: one compiled copy of the arrays)"
        tup = tuple(values)

        def store() -> None:
            arrays[0](arrays[1], slot, n, tup)
    else:
        name = "fast: row store (a NumPy store per field)"

        def store() -> None:
            for view, v in zip(sig.views, values, strict=True):
                view[slot : slot + n] = v

    out.append((name, best(store, calls, rounds)))
    out.append(("fast: sampler.on_write", best(lambda: rb._sampler.on_write(slots, ring), calls, rounds)))
    if eps is not None and step is None:
        out.append(("fast: episode apply", best(lambda: eps.apply(hplan), calls, rounds)))
    out.append(
        (
            "fast: try_write (all of the above)",
            best(lambda: fast_write.try_write(rb, batch, add), calls, rounds),
        )
    )
    out.append(("fast: whole call", best(lambda: method(batch), calls, rounds)))
    return out


def sample_phases(rb: ReplayBuffer, b: int, calls: int, rounds: int) -> list[tuple[str, float]]:
    """A uniform sample's phases: the general path's, then the fast path's (fast_read.py)."""
    ring, gen = rb._ring, rb._generator
    slots, _ = rb._sampler.sample(ring, b, gen)
    ids = ring.ids_of_slots(slots)
    flat = rb._storage.gather(slots, None)

    def build() -> object:
        return to_tensordict({**flat, "index": ids}, (b,), rb._storage.device)

    rb._fast_read = False
    out = [
        ("general: sampler.sample", best(lambda: rb._sampler.sample(ring, b, gen), calls, rounds)),
        ("general: ids of slots (Ring.ids_of_slots)", best(lambda: ring.ids_of_slots(slots), calls, rounds)),
        ("general: storage gather", best(lambda: rb._storage.gather(slots, None), calls, rounds)),
        ("general: TensorDict construction (to_tensordict)", best(build, calls, rounds)),
        ("general: whole call", best(lambda: rb.sample(b), calls, rounds)),
    ]
    rb._fast_read = True
    rb.sample(b)  # makes the read plan and the slot tensor of this size
    plan = rb.__dict__["_read_plan"]
    kept, rows, size = plan.draw(b)
    reader = plan.reader
    fields = {**reader.read(rows), "index": torch.from_numpy(fast_read.ids_of_rows(ring, rows))}
    phases: list[tuple[str, Callable[[], object]]] = [
        ("fast: draw into the kept slot tensor (draw_into)", lambda: plan.sampler.draw_into(ring, kept, gen)),
        ("fast: ids (ids_of_rows) + from_numpy", lambda: torch.from_numpy(fast_read.ids_of_rows(ring, rows))),
        ("fast: one take of records, a tensor per field (RecordReader.read)", lambda: reader.read(rows)),
        (
            "fast: TensorDict construction (flat_tensordict)",
            lambda: flat_tensordict(dict(fields), size, plan.device),
        ),
        ("fast: whole call", lambda: rb.sample(b)),
    ]
    out += [(name, best(fn, calls, rounds)) for name, fn in phases]
    return out


def prioritized_phases(rb: ReplayBuffer, calls: int, rounds: int) -> list[tuple[str, float]]:
    """A prioritized ``sample(32)`` and ``update_priority`` of its 32 ids, phase by phase."""
    ring, gen, sampler = rb._ring, rb._generator, rb._sampler
    prios = torch.rand(32) + 0.01
    batch = rb.sample(32)
    index = batch["index"]
    slots, info = sampler.sample(ring, 32, gen)
    checked = check_update(ring, index, prios, "raise")

    def pair() -> None:
        rb.update_priority(rb.sample(32)["index"], prios)

    return [
        (
            "sampler.sample (draw, descent, weights)",
            best(lambda: sampler.sample(ring, 32, gen), calls, rounds),
        ),
        (
            "the batch of its slots (fast_read.try_read)",
            best(lambda: fast_read.try_read(rb, slots, info), calls, rounds),
        ),
        ("sample: whole call", best(lambda: rb.sample(32), calls, rounds)),
        ('batch["index"] (TensorDict lookup)', best(lambda: batch["index"], calls, rounds)),
        (
            "update: checks (check_update)",
            best(lambda: check_update(ring, index, prios, "raise"), calls, rounds),
        ),
        ("update: sampler.update_priority", best(lambda: sampler.update_priority(*checked), calls, rounds)),
        ("update_priority: whole call", best(lambda: rb.update_priority(index, prios), calls, rounds)),
        ("sample + update_priority (the loop's pair)", best(pair, calls, rounds)),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer calls")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    calls = 300 if args.quick else 3000
    rng = np.random.default_rng(0)
    cap = 100_000
    item = np_items(rng, 1)[0]
    step = np_steps(rng, 1, 8)[0]
    cases: list[tuple[str, Any, bool, dict[str, Any]]] = [
        ("add: NumPy + Python numbers", item, True, {}),
        ("add: torch 0-d / 1-d", torch_item(item), True, {}),
        ("extend [8]: NumPy", step, False, {}),
        ("extend [8]: torch", torch_step(step), False, {}),
        ("extend [8]: NumPy, num_envs=8", step, False, {"num_envs": 8}),
        ("extend [8]: NumPy, num_envs=8, nstep", step, False, {"num_envs": 8, "nstep": NStep(3, 0.99)}),
    ]
    tables = []
    for title, batch, add, kw in cases:
        log(title)
        rb = fill(ReplayBuffer(cap, SPEC, seed=0, **kw), cap // 2, rng, kw.get("num_envs") or 1)
        rows = write_phases(rb, batch, add, calls, args.rounds)
        tables.append(
            {
                "title": title,
                "headers": ["phase", "µs"],
                "rows": [[k, f"{v:.2f}"] for k, v in rows],
                "notes": "",
            }
        )
    rb = fill(ReplayBuffer(cap, SPEC, seed=0), cap, rng)
    for b in (32, 256):
        log(f"sample({b})")
        rows = sample_phases(rb, b, calls, args.rounds)
        tables.append(
            {
                "title": f"sample({b}) of 100k",
                "headers": ["phase", "µs"],
                "rows": [[k, f"{v:.2f}"] for k, v in rows],
                "notes": "",
            }
        )
    log("prioritized sample(32) + update(32)")
    prb = fill(ReplayBuffer(cap, SPEC, sampler=PrioritizedSampler(), seed=0), cap, rng)
    tables.append(
        {
            "title": "prioritized sample(32) + update_priority(32) of 100k",
            "headers": ["phase", "µs"],
            "rows": [[k, f"{v:.2f}"] for k, v in prioritized_phases(prb, calls, args.rounds)],
            "notes": "",
        }
    )
    for t in tables:
        print(f"\n### {t['title']}\n\n{markdown_table(t['headers'], t['rows'])}")
    if args.json:
        result = {
            "benchmark": "profile_small_calls",
            "command": "python " + " ".join(["benchmarks/profile_small_calls.py", *(argv or sys.argv[1:])]),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "environment": environment({}),
            "tables": tables,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
