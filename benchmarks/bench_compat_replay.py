"""The compat front-ends against the systems they replace, on identical inputs.

Run from the repository root::

    .venv/bin/python benchmarks/bench_compat_replay.py --threads 1 [--quick]

objectrl: ``xpbank.compat.objectrl.ReplayBuffer`` against objectrl 0.2.0's
``ReplayBuffer`` (TorchRL ``LazyMemmapStorage`` on the CPU), both of ``--capacity``
transitions (obs/next_obs float32[17], action float32[6], reward, done): ``add`` (one
transition), ``add_batch`` (256), ``sample_batch(256)``, ``sample_by_index`` (256 random
positions). TorchRL: one ``ReplayBufferTrainer.extend`` of a [8, 32] collection
(flattened through its mask) then 4 ``sample`` calls of 256, with an xpbank buffer
against TorchRL's hook over a ``TensorDictReplayBuffer(LazyTensorStorage)``. ROSE:
``ExperienceBank.add`` and ``sample(32)`` (there is no ROSE package to compare with: the
numbers say what the list-of-Experience API costs on top of the tensor buffer).

Every number is the fastest of ``--chunks`` timed blocks; per call. No timing asserted.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from collections.abc import Callable

import torch
from tensordict import TensorDict

from _common import best_of, fmt_ratio, fmt_us, freeze_heap, log, markdown_table, run_main

CPU = torch.device("cpu")


def transitions(n: int, seed: int = 0) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "obs": torch.randn(n, 17, generator=g),
            "action": torch.randn(n, 6, generator=g),
            "reward": torch.randn(n, generator=g),
            "next_obs": torch.randn(n, 17, generator=g),
            "done": torch.rand(n, generator=g) < 0.01,
        },
        batch_size=[n],
    )


def bench_objectrl(make: Callable[[], object], capacity: int, calls: int, chunks: int) -> dict[str, float]:
    buf = make()
    buf.add_batch(transitions(capacity))  # type: ignore[attr-defined]
    singles = [transitions(1, s)[0] for s in range(64)]
    batches = [transitions(256, s) for s in range(16)]
    g = torch.Generator().manual_seed(1)
    positions = [torch.randint(0, capacity, (256,), generator=g) for _ in range(16)]
    return {
        "add (1)": best_of(lambda i: buf.add(singles[i % 64]), calls, chunks),  # type: ignore[attr-defined]
        "add_batch (256)": best_of(lambda i: buf.add_batch(batches[i % 16]), calls, chunks),  # type: ignore[attr-defined]
        "sample_batch (256)": best_of(lambda i: buf.sample_batch(256), calls, chunks),  # type: ignore[attr-defined]
        "sample_by_index (256)": best_of(lambda i: buf.sample_by_index(positions[i % 16]), calls, chunks),  # type: ignore[attr-defined]
    }


def collection(n_envs: int = 8, t: int = 32) -> TensorDict:
    td = transitions(n_envs * t).reshape(n_envs, t)
    td["collector", "mask"] = torch.ones(n_envs, t, dtype=torch.bool)
    return td


def bench_hook(hook: object, calls: int, chunks: int) -> float:
    batch = collection()

    def step(i: int) -> None:
        hook.extend(batch)  # type: ignore[attr-defined]
        for _ in range(4):
            hook.sample(None)  # type: ignore[attr-defined]

    return best_of(step, calls, chunks)


def bench_rose(capacity: int, calls: int, chunks: int) -> dict[str, float]:
    from xpbank.compat.rose import ExperienceBank, create_experience

    bank = ExperienceBank(max_size=capacity)
    data = transitions(256)
    exps = [
        create_experience(
            data["obs"][i], data["action"][i], float(data["reward"][i]), data["next_obs"][i], False
        )
        for i in range(256)
    ]
    bank.add_batch(exps * (capacity // 256))
    return {
        "add (1)": best_of(lambda i: bank.add(exps[i % 256]), calls, chunks),
        "sample (32)": best_of(lambda i: bank.sample(32), calls, chunks),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="small sizes: seconds")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--capacity", type=int, default=None)
    ap.add_argument("--chunks", type=int, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    warnings.simplefilter("ignore")
    capacity = args.capacity or (10_000 if args.quick else 200_000)
    calls, chunks = (50, 3) if args.quick else (300, args.chunks or 7)
    from objectrl.replay_buffers.experience_memory import ReplayBuffer as ObjectRL
    from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.trainers import ReplayBufferTrainer as TorchRLHook

    import xpbank
    from xpbank.compat.objectrl import ReplayBuffer as Ours
    from xpbank.compat.torchrl import ReplayBufferTrainer

    freeze_heap()
    log(f"objectrl, capacity {capacity}")
    ours = bench_objectrl(lambda: Ours(CPU, CPU, capacity), capacity, calls, chunks)
    theirs = bench_objectrl(lambda: ObjectRL(CPU, CPU, capacity), capacity, calls, chunks)
    rows = [[op, fmt_us(ours[op]), fmt_us(theirs[op]), fmt_ratio(theirs[op] / ours[op])] for op in ours]
    print(f"## objectrl ReplayBuffer ({capacity:,} transitions, --threads {args.threads})\n")
    print(markdown_table(["call", "xpbank.compat", "objectrl 0.2.0", "speed-up"], rows))
    log("torchrl hook")
    hooks = {
        "xpbank uniform": ReplayBufferTrainer(
            xpbank.ReplayBuffer(capacity, seed=0), 256, flatten_tensordicts=True
        ),
        "xpbank prioritized": ReplayBufferTrainer(
            xpbank.ReplayBuffer(capacity, sampler=xpbank.PrioritizedSampler(), seed=0),
            256,
            flatten_tensordicts=True,
        ),
        "TorchRL hook + TensorDictReplayBuffer": TorchRLHook(
            TensorDictReplayBuffer(storage=LazyTensorStorage(capacity), batch_size=256),
            256,
            flatten_tensordicts=True,
        ),
    }
    times = {name: bench_hook(h, max(calls // 5, 10), chunks) for name, h in hooks.items()}
    print("\n## ReplayBufferTrainer: extend [8, 32] + 4 x sample(256)\n")
    print(markdown_table(["buffer", "per step"], [[k, fmt_us(v)] for k, v in times.items()]))
    log("rose")
    rose = bench_rose(capacity, calls, chunks)
    print(f"\n## ROSE ExperienceBank ({capacity:,} experiences)\n")
    print(markdown_table(["call", "xpbank.compat.rose"], [[k, fmt_us(v)] for k, v in rose.items()]))


if __name__ == "__main__":
    sys.exit(run_main(main))
