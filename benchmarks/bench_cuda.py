"""xpbank on a CUDA device against a raw-torch baseline and SB3's buffer on the same device.

Run from the repository root on a machine with a GPU::

    .venv/bin/python benchmarks/bench_cuda.py [--capacity 1000000] [--rounds 5] [--json out.json]

The loops a GPU learner runs, each timed as blocks of ``--calls`` calls with
``torch.cuda.synchronize()`` after every call (the time until the batch is usable on the
device), in ``--rounds`` interleaved rounds (every other round in reverse order), on a
buffer filled to ``--capacity`` with MuJoCo-sized transitions (obs 17, action 6):

- one env step in: ``add`` of one transition from CPU tensors;
- ``sample(B)`` from a full buffer: storage on the GPU; storage on the CPU delivering to
  the GPU; the raw baseline (``randint`` and one gather per field, on the GPU); SB3's
  ``ReplayBuffer(device="cuda")`` (NumPy storage, copied to the GPU per sample);
- prioritized ``sample(B)`` + ``update_priority(B)``: trees on the GPU, trees in NumPy,
  and the raw baseline (``torch.multinomial`` over every priority, then a scatter).

Medians over rounds (and the range) in µs per call, and each row's ratio to the raw one.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import xpbank
from _common import environment, interleaved_us, log, markdown_table, median, report, run_main

OBS, ACT = 17, 6
DEV = torch.device("cuda")  # --device cpu: a dry run of the script's logic


def _batch(n: int, device: str = "cpu", seed: int = 0) -> dict[Any, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {
        "obs": torch.randn(n, OBS, generator=g),
        "action": torch.rand(n, ACT, generator=g) * 2 - 1,
        "reward": torch.randn(n, generator=g),
        "terminated": torch.rand(n, generator=g) < 0.01,
        ("next", "obs"): torch.randn(n, OBS, generator=g),
    }
    return {k: v.to(device) for k, v in out.items()}


def _filled(capacity: int, **kw: Any) -> xpbank.ReplayBuffer:
    rb = xpbank.ReplayBuffer(capacity, seed=0, **kw)
    chunk = 65_536
    for start in range(0, capacity, chunk):
        rb.extend(_batch(min(chunk, capacity - start), seed=start))
    return rb


class RawRing:
    """The raw baseline: one preallocated GPU tensor per field and a write position."""

    def __init__(self, capacity: int, device: str) -> None:
        proto = _batch(1)
        self.data = {
            k: torch.empty((capacity, *v.shape[1:]), dtype=v.dtype, device=device) for k, v in proto.items()
        }
        self.capacity, self.pos, self.size, self.device = capacity, 0, 0, device

    def extend(self, batch: dict[Any, torch.Tensor]) -> None:
        n = next(iter(batch.values())).shape[0]
        idx = (torch.arange(n) + self.pos) % self.capacity
        idx = idx.to(self.device)
        for k, v in batch.items():
            self.data[k].index_copy_(0, idx, v.to(self.device, non_blocking=True))
        self.pos, self.size = (self.pos + n) % self.capacity, min(self.size + n, self.capacity)

    def sample(self, b: int) -> dict[Any, torch.Tensor]:
        idx = torch.randint(self.size, (b,), device=self.device)
        return {k: v.index_select(0, idx) for k, v in self.data.items()}


def _sb3(capacity: int) -> Any:
    try:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer
    except ImportError:
        return None
    obs = gym.spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
    act = gym.spaces.Box(-1, 1, (ACT,), np.float32)
    buf = ReplayBuffer(capacity, obs, act, DEV.type, handle_timeout_termination=False)
    b = {k: v.numpy() for k, v in _batch(capacity).items()}
    buf.observations[:] = b["obs"][:, None]
    buf.next_observations[:] = b[("next", "obs")][:, None]
    buf.actions[:] = b["action"][:, None]
    buf.rewards[:] = b["reward"][:, None]
    buf.dones[:] = b["terminated"][:, None]
    buf.full, buf.pos = True, 0
    return buf


def _sync() -> None:
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def _timed(fns: dict[str, Callable[[], object]], calls: int, rounds: int) -> dict[str, list[float]]:
    """µs per call (wall clock, synchronized after each call) of each block, interleaved."""

    def synced(fn: Callable[[], object]) -> Callable[[int], object]:
        def call(i: int) -> None:
            fn()
            _sync()

        return call

    synced_fns = {name: synced(fn) for name, fn in fns.items()}
    return interleaved_us(synced_fns, calls, rounds, warm=10, clock=time.perf_counter)


def _rows(times: dict[str, list[float]], raw: str) -> list[list[str]]:
    base = median(times[raw])
    return [
        [name, f"{median(t):.1f}", f"{min(t):.1f}-{max(t):.1f}", f"{median(t) / base:.2f}x"]
        for name, t in times.items()
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prio-batches", default="256,4096", help="batch sizes of the prioritized rows")
    p.add_argument("--profile", action="store_true", help="log a torch profile of the GPU sample")
    p.add_argument("--device", default="cuda", help="cpu: a dry run of the script's logic")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    global DEV
    DEV = torch.device(args.device)
    if DEV.type == "cuda" and not torch.cuda.is_available():
        log("no CUDA device: nothing to measure")
        return 1
    torch.set_num_threads(args.threads)
    cap, b = args.capacity, args.batch
    lines = [
        f"# xpbank on {torch.cuda.get_device_name() if DEV.type == 'cuda' else 'the CPU'}: "
        f"capacity {cap:,}, batch {b}",
        "",
    ]
    results: dict[str, Any] = {"env": environment({"torch": torch.__version__})}

    log("one env step in ...")
    gpu = _filled(cap, storing_device=DEV)
    raw = RawRing(cap, DEV)
    raw.extend(_batch(cap))
    step = _batch(1)
    item = {k: v[0] for k, v in step.items()}
    add = _timed(
        {"raw torch (index_copy_)": lambda: raw.extend(step), "xpbank add": lambda: gpu.add(item)},
        args.calls,
        args.rounds,
    )
    lines += ["## one transition in (CPU tensors into GPU storage)", ""]
    lines += [
        markdown_table(["", "µs (median)", "range", "vs raw"], _rows(add, "raw torch (index_copy_)")),
        "",
    ]
    results["add"] = add

    log("sample ...")
    host = _filled(cap, device=DEV, storage=xpbank.TensorStorage(cap, pin_memory=DEV.type == "cuda"))
    sb3 = _sb3(cap)
    fns: dict[str, Callable[[], object]] = {
        "raw torch (randint + index_select)": lambda: raw.sample(b),
        "xpbank, GPU storage": lambda: gpu.sample(b),
        "xpbank, pinned CPU storage -> GPU": lambda: host.sample(b),
    }
    if sb3 is not None:
        fns["SB3 ReplayBuffer(device='cuda')"] = lambda: sb3.sample(b)
    for fn in fns.values():  # every batch is on the GPU with b rows before anything is timed
        out = fn()
        obs = out.observations if hasattr(out, "observations") else out["obs"]
        assert obs.device.type == DEV.type and obs.shape[0] == b
    sample = _timed(fns, args.calls, args.rounds)
    lines += [f"## sample({b}) from a full buffer, batch on the GPU", ""]
    lines += [
        markdown_table(
            ["", "µs (median)", "range", "vs raw"], _rows(sample, "raw torch (randint + index_select)")
        ),
        "",
    ]
    results["sample"] = sample

    if args.profile and DEV.type == "cuda":  # where a GPU-storage sample's time goes
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(50):
                gpu.sample(b)
                _sync()
        log(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))

    log("prioritized ...")
    prio_gpu = _filled(cap, storing_device=DEV, sampler=xpbank.PrioritizedSampler(tree_device=DEV))
    prio_np = _filled(cap, storing_device=DEV, sampler=xpbank.PrioritizedSampler(tree_device="numpy"))
    pri = torch.rand(cap, device=DEV) + 0.1
    results["prioritized"] = {}
    for pb in (int(x) for x in args.prio_batches.split(",")):
        new = torch.rand(pb, device=DEV) + 0.1

        def raw_prio(pb: int = pb, new: torch.Tensor = new) -> None:
            idx = torch.multinomial(pri, pb, replacement=True)
            w = (pri[idx] / pri.sum() * cap) ** -0.4
            _ = {k: v.index_select(0, idx) for k, v in raw.data.items()}, w / w.max()
            pri.index_copy_(0, idx, new)

        def ours(rb: xpbank.ReplayBuffer, pb: int = pb, new: torch.Tensor = new) -> Callable[[], None]:
            def step() -> None:
                batch = rb.sample(pb)
                rb.update_priority(batch["index"], new, stale="raise")

            return step

        prio = _timed(
            {
                "raw torch (multinomial + scatter)": raw_prio,
                "xpbank, trees on the GPU": ours(prio_gpu),
                "xpbank, trees in NumPy (default)": ours(prio_np),
            },
            args.calls // 2,
            args.rounds,
        )
        lines += [f"## prioritized sample({pb}) + update_priority({pb}), storage on the GPU", ""]
        rows = _rows(prio, "raw torch (multinomial + scatter)")
        lines += [markdown_table(["", "µs (median)", "range", "vs raw"], rows), ""]
        results["prioritized"][pb] = prio
    return report(lines, results, args.json)


if __name__ == "__main__":
    sys.exit(run_main(main))
