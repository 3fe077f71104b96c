"""SB3's ``learn()`` with SB3's ``ReplayBuffer`` and ``XpbankReplayBuffer`` by each of its
paths, in one process, rounds interleaved: the buffer time of each, add and sample apart.

    PYTHONPATH=src .venv/bin/python benchmarks/ab_sb3_loop.py --threads 1 [--case sb3-dqn] [--quick]

The loops are ``bench_in_loop.py``'s (SAC / Pendulum-v1 with SB3's defaults, batch 256;
rl-zoo's DQN / CartPole-v1, batch 64), each run with four buffers:

- ``sb3``: SB3's own ``ReplayBuffer``;
- ``xpbank``: ``XpbankReplayBuffer`` as it is (its short sample and add,
  :mod:`xpbank.integrations.sb3.fast`);
- ``xpbank sample only``: its short sample, every ``add`` by the checked add
  (``_add_checked``);
- ``xpbank general``: ``samples_of(xp.sample(B))`` (an xpbank batch split into SB3's
  samples) and the checked add: the adapter before the short paths.

Reported: the medians over rounds of the seconds inside ``add`` and inside ``sample``
(``_get_samples`` counted once, inside ``sample``), and each buffer's total over SB3's
in the same round (median and range). The first round is a warm-up. No timing is asserted.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

import bench_in_loop as loop
import xpbank.integrations.sb3 as sb3_package
from _common import clock, environment, log, markdown_table, report, run_main, set_clock, settle
from xpbank.integrations.sb3 import XpbankReplayBuffer


class SampleOnly(XpbankReplayBuffer):
    """The short sample; every add by the checked add."""

    def add(self, *args: Any) -> None:
        self._add_checked(*args)


class General(SampleOnly):
    """The adapter's general path: an xpbank batch split into SB3's samples, the checked add."""

    def sample(self, batch_size: int, env: Any = None) -> Any:
        return self.samples_of(self.xp.sample(batch_size), env)


KINDS = {
    "sb3": None,
    "xpbank": XpbankReplayBuffer,
    "xpbank sample only": SampleOnly,
    "xpbank general": General,
}


def run(case: str, kind: str, steps: int) -> tuple[float, float]:
    """Seconds inside ``add`` and inside ``sample`` in one ``learn(steps)``."""
    cls = KINDS[kind]
    saved = sb3_package.XpbankReplayBuffer
    sb3_package.XpbankReplayBuffer = cls or saved  # what bench_in_loop.sb3_model imports
    try:
        model = loop.sb3_model(case, cls is not None)
    finally:
        sb3_package.XpbankReplayBuffer = saved
    adds, samples, buf = loop.CallTimer(), loop.CallTimer(), model.replay_buffer
    buf.add = adds.wrap(buf.add)
    buf.sample = samples.wrap(buf.sample)
    buf._get_samples = samples.wrap(buf._get_samples)
    settle()
    model.learn(steps)
    return adds.seconds, samples.seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--case", choices=["sb3-sac", "sb3-dqn"], default="sb3-sac")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--clock", choices=["wall", "thread"], default="thread")
    p.add_argument(
        "--steps", type=int, default=None, help="env steps (default SAC 1000, DQN 8000; quick 300/1300)"
    )
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 3; quick 1)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    dqn = args.case == "sb3-dqn"
    steps = args.steps or ((1300 if dqn else 300) if args.quick else (8000 if dqn else 1000))
    rounds = args.rounds or (1 if args.quick else 3)
    kinds = list(KINDS)
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(rounds + 1):  # round 0: a warm-up
        for kind in kinds[r % len(kinds) :] + kinds[: r % len(kinds)]:
            start = clock()
            add, sample = run(args.case, kind, steps)
            log(f"round {r} {kind}: loop {clock() - start:.2f} s, add {add:.3f} s, sample {sample:.3f} s")
            if r:
                times[kind].append((add, sample))
    rows, results = [], {}
    for kind in kinds:
        t = np.array(times[kind])
        ratios = t.sum(1) / np.array(times["sb3"]).sum(1)
        results[kind] = {"add_s": t[:, 0].tolist(), "sample_s": t[:, 1].tolist()}
        rows.append([
            kind, f"{np.median(t[:, 0]) * 1e3:.0f}", f"{np.median(t[:, 1]) * 1e3:.0f}",
            f"{np.median(ratios):.2f}x ({ratios.min():.2f}-{ratios.max():.2f})",
        ])  # fmt: skip
    lines = [
        f"## SB3 {args.case[4:].upper()} learn({steps}): buffer time by path "
        f"({args.clock} clock, {rounds} rounds)",
        "",
        markdown_table(["buffer", "add ms", "sample ms", "add + sample vs SB3's (range)"], rows),
    ]
    results["environment"] = environment({})
    return report(lines, results, args.json)


if __name__ == "__main__":
    raise SystemExit(run_main(main))
