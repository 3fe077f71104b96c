"""Prioritized replay in small calls: ``sample(32)`` and an update of 32 priorities.

Run from the repository root::

    PYTHONPATH=src .venv/bin/python benchmarks/ab_small_prioritized.py --threads 1 [--quick] \
        [--base main] [--json out.json]

One process, a buffer of 100k items (obs float32[4], reward: CartPole-sized; 20k with
``--quick``), ``alpha=0.6, beta=0.4``, batch 32, the loop of a prioritized DQN. Timed:
the sample alone, the update alone (the ids of 64 earlier samples in turn) and a step
(a sample, then the update of its ids: what a training loop does, where each sample
follows a write to the tree), of

- xpbank: ``ReplayBuffer(sampler=PrioritizedSampler(...))``: ``sample(32)`` (a TensorDict
  with ``"index"`` and ``"weight"``) and ``update_priority`` of 32 sampled ids;
- cpprb: ``PrioritizedReplayBuffer``: ``sample(32, beta=0.4)`` and ``update_priorities``;
- with ``--base REF``: the same xpbank calls of the package as of commit ``REF``
  (imported as ``xpbank_base``, ``ab_nstep.import_base``), an A/B in the same process;
- raw NumPy: a sum-tree and a min-tree in flat arrays (:class:`RawTree`), the least a
  Python sampler does: a vectorized descent, weights, a gather of the two fields, and
  an update that rewrites each changed leaf's ancestors level by level.

A second table sets issue 21's targets (a sample, an update, and so a step, each in at
most half of cpprb's time for it) beside two floors timed in the same rounds: a uniform
``sample(32)`` of the same items (no tree, no weights) and the batch alone (its four new
tensors and the TensorDict, no data), which every prioritized sample returning this
TensorDict pays before its descent and weights.

Each timed function runs ``--calls`` calls per block; ``--rounds`` rounds, each timing
one block of every function in turn (the order reversed every other round), so all share
the machine's load of the same moments. Reported per call: the median and the range
(min-max) of the blocks, in this thread's CPU time (steadier than wall time on a shared
machine) and wall time. No timing is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, log, markdown_table, report
from ab_nstep import import_base
from xpbank.spec.batch import flat_tensordict

BATCH = 32
OBS = 4
ALPHA, BETA = 0.6, 0.4


class RawTree:
    """A sum-tree and a min-tree over ``capacity`` leaves in flat NumPy arrays (leaves at
    ``size - 1 ...``), with the data in two arrays: the raw baseline."""

    def __init__(self, obs: np.ndarray, reward: np.ndarray, seed: int):
        n = obs.shape[0]
        self.size = 1 << int(np.ceil(np.log2(n)))
        self.n, self.obs, self.reward = n, obs, reward
        self.sum = np.zeros(2 * self.size - 1)
        self.min = np.full(2 * self.size - 1, np.inf)
        self.rng = np.random.default_rng(seed)
        self.update(np.arange(n), np.ones(n))

    def update(self, idx: np.ndarray, prio: np.ndarray) -> None:
        p = prio**ALPHA
        node = idx + self.size - 1
        self.sum[node], self.min[node] = p, p
        while node[0] > 0:
            node = np.unique((node - 1) // 2)
            left = 2 * node + 1
            self.sum[node] = self.sum[left] + self.sum[left + 1]
            self.min[node] = np.minimum(self.min[left], self.min[left + 1])

    def sample(self, b: int) -> dict[str, np.ndarray]:
        total = self.sum[0]
        u = (np.arange(b) + self.rng.random(b)) * (total / b)
        node = np.zeros(b, dtype=np.int64)
        while node[0] < self.size - 1:
            left = 2 * node + 1
            go_right = u >= self.sum[left]
            u = np.where(go_right, u - self.sum[left], u)
            node = left + go_right
        idx = np.minimum(node - (self.size - 1), self.n - 1)
        p = self.sum[node] / total
        w = (p * self.n) ** -BETA / (self.min[0] / total * self.n) ** -BETA
        return {"obs": self.obs[idx], "reward": self.reward[idx], "index": idx, "weight": w}


def data(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.standard_normal((n, OBS), dtype=np.float32), rng.standard_normal(n, dtype=np.float32)


def prios(k: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.exponential(size=BATCH) + 1e-3 for _ in range(k)]


def xpbank_calls(module: Any, n: int, label: str = "xpbank") -> dict[str, Callable[[int], object]]:
    """``module``'s (``xpbank`` or an ``xpbank_base``) sample(32) and update of 32."""
    obs, reward = data(n)
    tps = [torch.from_numpy(p) for p in prios()]
    rb = module.ReplayBuffer(n, sampler=module.PrioritizedSampler(alpha=ALPHA, beta=BETA), seed=0)
    rb.extend({"obs": torch.from_numpy(obs), "reward": torch.from_numpy(reward)})
    ids = [rb.sample(BATCH)["index"] for _ in range(64)]
    return {
        f"{label} sample(32)": lambda i: rb.sample(BATCH),
        f"{label} update_priority(32)": lambda i: rb.update_priority(ids[i % 64], tps[i % 16]),
        f"{label} step": lambda i: rb.update_priority(rb.sample(BATCH)["index"], tps[i % 16]),
    }


def build(n: int, base: Any = None) -> tuple[dict[str, Callable[[int], object]], dict[str, str]]:
    obs, reward = data(n)
    ps = prios()
    fns = xpbank_calls(xpbank, n)
    if base is not None:
        fns.update(xpbank_calls(base, n, "base"))
    # floors of the target (issue 21: a step at most half of cpprb's): the same batch
    # drawn uniformly (no tree, no weights), and the batch's tensors and TensorDict alone
    urb = xpbank.ReplayBuffer(n, seed=0)
    urb.extend({"obs": torch.from_numpy(obs), "reward": torch.from_numpy(reward)})
    fns["floor: uniform sample(32) of the same items"] = lambda i: urb.sample(BATCH)
    size = torch.Size([BATCH])

    def batch_alone(i: int) -> object:
        fields = {
            "obs": torch.empty(BATCH, OBS),
            "reward": torch.empty(BATCH),
            "index": torch.empty(BATCH, dtype=torch.int64),
            "weight": torch.empty(BATCH),
        }
        return flat_tensordict(fields, size, None)

    fns["floor: the batch alone (4 new tensors + TensorDict)"] = batch_alone
    raw = RawTree(obs, reward, 0)
    raw_ids = [raw.sample(BATCH)["index"] for _ in range(64)]
    fns["raw NumPy sample(32)"] = lambda i: raw.sample(BATCH)
    fns["raw NumPy update(32)"] = lambda i: raw.update(raw_ids[i % 64], ps[i % 16])
    fns["raw NumPy step"] = lambda i: raw.update(raw.sample(BATCH)["index"], ps[i % 16])
    skipped: dict[str, str] = {}
    try:
        from cpprb import PrioritizedReplayBuffer

        crb = PrioritizedReplayBuffer(n, {"obs": {"shape": OBS}, "rew": {}}, alpha=ALPHA)
        crb.add(obs=obs, rew=reward)
        c_ids = [crb.sample(BATCH, beta=BETA)["indexes"] for _ in range(64)]
        fns["cpprb sample(32)"] = lambda i: crb.sample(BATCH, beta=BETA)
        fns["cpprb update_priorities(32)"] = lambda i: crb.update_priorities(c_ids[i % 64], ps[i % 16])

        def cpprb_step(i: int) -> None:
            crb.update_priorities(crb.sample(BATCH, beta=BETA)["indexes"], ps[i % 16])

        fns["cpprb step"] = cpprb_step
    except ImportError as exc:
        skipped["cpprb"] = f"not installed ({exc})"
    return fns, skipped


def timed(
    fns: dict[str, Callable[[int], object]], calls: int, rounds: int
) -> dict[str, dict[str, list[float]]]:
    """µs per call of every block of each function (CPU and wall), in interleaved rounds."""
    out: dict[str, dict[str, list[float]]] = {k: {"cpu_us": [], "wall_us": []} for k in fns}
    for fn in fns.values():
        for i in range(min(calls, 20)):
            fn(i)
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = fns[name]
            w, c = time.perf_counter(), time.thread_time()
            for i in range(calls):
                fn(i)
            out[name]["cpu_us"].append((time.thread_time() - c) / calls * 1e6)
            out[name]["wall_us"].append((time.perf_counter() - w) / calls * 1e6)
    return out


def _cell(v: list[float] | None) -> str:
    return f"{np.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "n/a"


def table(t: dict[str, dict[str, list[float]]], base: str | None = None) -> dict[str, Any]:
    calls = {  # the row's series: xpbank, cpprb, raw NumPy, xpbank at base
        "sample(32)": ("sample(32)", "cpprb sample(32)", "raw NumPy sample(32)"),
        "update of 32": ("update_priority(32)", "cpprb update_priorities(32)", "raw NumPy update(32)"),
        "step: sample(32), then update its 32": ("step", "cpprb step", "raw NumPy step"),
    }
    series: dict[str, dict[str, list[float] | None]] = {}
    for op, (ours, peer, raw) in calls.items():
        series[op] = {
            "xpbank": t[f"xpbank {ours}"]["cpu_us"],
            "cpprb": t[peer]["cpu_us"] if peer in t else None,
            "raw": t[raw]["cpu_us"],
            "base": t[f"base {ours}"]["cpu_us"] if base is not None else None,
        }

    def ratio(a: list[float] | None, b: list[float] | None) -> str:
        return f"{np.median(a) / np.median(b):.2f}x" if a and b else "n/a"

    rows = []
    for op, v in series.items():
        row = [op, _cell(v["xpbank"]), _cell(v["cpprb"]), _cell(v["raw"])]
        row += [ratio(v["xpbank"], v["cpprb"]), ratio(v["xpbank"], v["raw"])]
        if base is not None:
            row += [_cell(v["base"]), ratio(v["xpbank"], v["base"])]
        rows.append(row)
    headers = ["call", "xpbank", "cpprb", "raw NumPy", "xpbank / cpprb", "xpbank / raw"]
    notes = (
        "Lower is better; a ratio is xpbank's time over the other's (0.5x: twice as fast). "
        "The update row writes the ids of 64 earlier samples in turn, the step row those of "
        "the sample just drawn (a training loop's step: each call runs after the other's code, "
        "which leaves the caches and branch predictors less warm for it than a repeat of itself "
        "does; summing the tree's top anew after a write is ~0.4 µs of the difference)."
    )
    if base is not None:
        headers += [f"xpbank at {base}", f"xpbank / {base}"]
        notes += f" The {base} columns: the package as of that commit, timed in the same rounds."
    blocks = len(series["sample(32)"]["xpbank"] or ())
    return {
        "title": f"Prioritized small calls, CPU µs per call: median (range of {blocks} blocks)",
        "headers": headers,
        "rows": rows,
        "notes": notes,
    }


def floors(t: dict[str, dict[str, list[float]]]) -> dict[str, Any] | None:
    """Issue 21's targets (each call in at most half of cpprb's time for it) against the
    calls and what a sample costs without a tree."""
    if "cpprb step" not in t:
        return None
    rows = []
    for name, peer in (
        ("xpbank sample(32)", "cpprb sample(32)"),
        ("floor: uniform sample(32) of the same items", "cpprb sample(32)"),
        ("floor: the batch alone (4 new tensors + TensorDict)", "cpprb sample(32)"),
        ("xpbank update_priority(32)", "cpprb update_priorities(32)"),
        ("xpbank step", "cpprb step"),
    ):
        if name not in t:
            continue
        v, target = t[name]["cpu_us"], float(np.median(t[peer]["cpu_us"])) / 2
        ratio = f"{np.median(v) / target:.2f}x"
        rows.append([name.removeprefix("floor: "), _cell(v), f"{target:.1f}", ratio])
    return {
        "title": "Issue 21's prioritized targets against two floors, CPU µs per call",
        "headers": ["call", "µs: median (range)", "target: half of cpprb's µs", "vs the target"],
        "rows": rows,
        "notes": (
            "The targets: a sample(32) and an update of 32 each in at most half of cpprb's "
            "time for the same call (the step: both). A uniform sample(32) of the same items "
            "(no tree, no weights, same TensorDict less 'weight') and the batch's own tensors "
            "and TensorDict (torch.empty x 4 + flat_tensordict, no data) are costs every "
            "prioritized sample returning this TensorDict pays, before its tree descent and "
            "its weights: they are set against the sample's target."
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="20k items, few rounds (seconds)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--size", type=int, default=None, help="items in each buffer (default 100,000)")
    p.add_argument("--calls", type=int, default=200, help="calls per timed block")
    p.add_argument("--rounds", type=int, default=None, help="rounds (default 15; quick 3)")
    p.add_argument("--base", default=None, help="also time xpbank as of this commit (e.g. main)")
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    n = args.size or (20_000 if args.quick else 100_000)
    rounds = args.rounds or (3 if args.quick else 15)
    with tempfile.TemporaryDirectory() as tmp:
        base = None if args.base is None else import_base(args.base, Path(tmp))
        fns, skipped = build(n, base)
        log(f"built {n:,} items; timing {rounds} rounds x {args.calls} calls")
        t = timed(fns, args.calls, rounds)
    tab = table(t, args.base)
    versions = {"xpbank": xpbank.__version__}
    try:
        import cpprb

        versions["cpprb"] = getattr(cpprb, "__version__", "installed")
    except ImportError:
        pass
    lines = [f"# {tab['title']}", "", f"{n:,} items, obs float32[{OBS}]; skipped: {skipped or 'none'}", ""]
    lines += [markdown_table(tab["headers"], tab["rows"]), "", tab["notes"]]
    floor = floors(t)
    if floor is not None:
        lines += [
            "",
            f"# {floor['title']}",
            "",
            markdown_table(floor["headers"], floor["rows"]),
            "",
            floor["notes"],
        ]
    result = {
        "benchmark": "ab_small_prioritized",
        "command": " ".join(["python", "benchmarks/ab_small_prioritized.py", *(argv or sys.argv[1:])]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": environment(versions),
        "tables": [tab] if floor is None else [tab, floor],
        "timings": t,
        "size": n,
    }
    return report(lines, result, args.json)


if __name__ == "__main__":
    sys.exit(main())
