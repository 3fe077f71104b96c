"""Where a whole rsl_rl PPO iteration's time goes, rsl_rl's storage against xpbank's (issue 22).

    PYTHONPATH=src .venv/bin/python benchmarks/profile_rsl_ppo.py --threads 1 --clock thread [--quick]

The PPO iteration of ``bench_compat.py`` (rsl_rl's ``PPO``, an LSTM actor and a GRU critic,
or MLPs with ``--mlp``; ``--envs`` envs x 24 steps, a synthetic env) on four PPOs built
alike: rsl_rl's storage twice (``ref``, ``ref2``: the A/A, the noise floor) and xpbank's
(``xp``: its own minibatch order; ``parity``: rsl_rl's), in interleaved rounds (the order
flips each round; a round's numbers are the fastest of 3 iterations). Phases:

- ``rollout``: ``act`` + ``process_env_step`` x 24 (``add_transition`` inside);
- ``returns``: rsl_rl's ``PPO.compute_returns`` over the storage;
- ``generator``: drawing the minibatches from the storage's generator;
- ``model``: the rest of ``PPO.update`` (forward, loss, backward, optimizer: the networks
  on the tensors the storage handed out).

``--frozen`` times ``PPO.update`` alone on storages filled with the same transitions,
with a learning rate of 0 (the parameters never change, so every PPO does the same
arithmetic in every round): a difference in ``model`` there would be the layout of the
handed-out tensors (strides, contiguity), not the training's noise.

Ratios are per round against ``ref`` (median, and the range). No timing is asserted.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import clock, freeze_heap, set_clock
from bench_compat import ACT, T, filled, make_ppo, ppo_steps, transitions
from xpbank.compat.rsl_rl import RolloutStorage

PHASES = ("rollout", "returns", "generator", "model", "total")
NAMES = ("ref", "xp", "parity", "ref2")


def storage_class(name: str) -> Callable[..., Any]:
    if name.startswith("ref"):
        from rsl_rl.storage import RolloutStorage as Ref

        return Ref
    if name == "parity":
        return lambda *a, **kw: RolloutStorage(*a, parity=True, **kw)
    return lambda *a, **kw: RolloutStorage(*a, seed=0, **kw)


def timed_generator(st: Any, acc: list[float]) -> None:
    """Wrap the storage's generators (on the instance): the time of each ``next`` into ``acc[0]``."""
    for name in ("mini_batch_generator", "recurrent_mini_batch_generator"):
        original = getattr(type(st), name)

        def gen(*args: Any, _f: Any = original, **kw: Any) -> Iterator[Any]:
            it = _f(st, *args, **kw)
            while True:
                start = clock()
                try:
                    batch = next(it)
                except StopIteration:
                    acc[0] += clock() - start
                    return
                acc[0] += clock() - start
                yield batch

        setattr(st, name, gen)


def update(ppo: Any, gen: list[float]) -> tuple[float, float]:
    """``PPO.update``: (the model's seconds, the generator's)."""
    gen[0] = 0.0
    start = clock()
    ppo.update()
    total = clock() - start
    return total - gen[0], gen[0]


def iteration_runner(e: int, recurrent: bool) -> Callable[[str], Callable[[], dict[str, float]]]:
    steps = ppo_steps(e)
    obs0 = steps[0][0]

    def build(name: str) -> Callable[[], dict[str, float]]:
        ppo = make_ppo(obs0, recurrent, storage_class(name)("rl", e, T, obs0, [ACT]))
        gen = [0.0]
        timed_generator(ppo.storage, gen)

        def run() -> dict[str, float]:
            obs, t0 = obs0, clock()
            with torch.inference_mode():
                for nxt, rew, done in steps:
                    ppo.act(obs)
                    ppo.process_env_step(nxt, rew, done, {})
                    obs = nxt
                t1 = clock()
                ppo.compute_returns(obs)
            t2 = clock()
            model, generator = update(ppo, gen)
            return {"rollout": t1 - t0, "returns": t2 - t1, "generator": generator, "model": model}

        return run

    return build


def frozen_runner(e: int, recurrent: bool) -> Callable[[str], Callable[[], dict[str, float]]]:
    trs = transitions(e, recurrent)
    obs0 = trs[0].observations

    def build(name: str) -> Callable[[], dict[str, float]]:
        st = filled(storage_class(name), trs)
        ppo = make_ppo(obs0, recurrent, st, learning_rate=0.0, schedule="fixed")
        gen = [0.0]
        timed_generator(st, gen)

        def run() -> dict[str, float]:
            if isinstance(st, RolloutStorage):  # update() clears it; the targets are still there
                st._targets = True
            model, generator = update(ppo, gen)
            return {"rollout": 0.0, "returns": 0.0, "generator": generator, "model": model}

        return run

    return build


def interleaved(
    runs: dict[str, Callable[[], dict[str, float]]], rounds: int
) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {n: [] for n in runs}
    for run in runs.values():  # first calls, not timed
        run()
    for r in range(rounds):
        for name in list(runs) if r % 2 == 0 else list(runs)[::-1]:
            gc.collect()
            tries = []
            for _ in range(3):
                got = runs[name]()
                got["total"] = sum(got.values())
                tries.append(got)
            out[name].append(min(tries, key=lambda x: x["total"]))
    return out


def report(found: dict[str, list[dict[str, float]]]) -> None:
    base = found["ref"]
    print(f"{'':8}" + "".join(f"{p:>28}" for p in PHASES))
    for name, rounds in found.items():
        cells = []
        for p in PHASES:
            ms = statistics.median(x[p] for x in rounds) * 1e3
            ratios = [y[p] / x[p] for x, y in zip(base, rounds, strict=True) if x[p] > 0]
            span = f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            cells.append(f"{ms:9.2f} ms {span:>15}")
        print(f"{name:8}" + "".join(f"{c:>28}" for c in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "thread"], default="thread")
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--mlp", action="store_true", help="MLP networks (default: LSTM actor, GRU critic)")
    parser.add_argument("--frozen", action="store_true", help="PPO.update alone, parameters frozen")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 20; quick 2)")
    parser.add_argument("--quick", action="store_true", help="2 rounds: a smoke run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    set_clock(args.clock)
    rounds = args.rounds or (2 if args.quick else 20)
    freeze_heap()
    build = (frozen_runner if args.frozen else iteration_runner)(args.envs, not args.mlp)
    found = interleaved({name: build(name) for name in NAMES}, rounds)
    kind = "MLP" if args.mlp else "recurrent"
    what = "PPO.update, parameters frozen" if args.frozen else "PPO iteration"
    print(f"## {what}, {kind}, {args.envs} envs x {T} steps: median per round, ratio to ref (range)")
    print(f"{rounds} interleaved rounds; threads={args.threads}; clock: {args.clock}\n")
    report(found)


if __name__ == "__main__":
    main()
