"""``xpbank bench``: the replay benchmark in short form, xpbank only, in a few seconds.

The full comparison (TorchRL, cpprb, SB3, a raw-tensor baseline) is
``benchmarks/bench_replay.py``. This one times, on CartPole-sized items
(``obs``/``next.obs`` 4 float32, action, reward, terminated, truncated), with one
thread: ``extend`` of batches of 256 into a full buffer (the steady state), ``sample``
of 256, and for the prioritized sampler ``sample`` plus ``update_priority``. Each
number is the fastest of ``repeats`` timed blocks.

Example:
    >>> rows = run_quickbench(capacity=1_000, blocks=2, ops=3)
    >>> [r.name for r in rows]
    ['extend B=256 (uniform)', 'sample B=256 (uniform)', 'sample+update B=256 (prioritized)']
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from xpbank.errors import check_positive_int
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import PrioritizedSampler

__all__ = ["BenchRow", "run_quickbench"]

BATCH = 256


@dataclass(frozen=True)
class BenchRow:
    """One timed operation: the best time per call over the blocks, and items per second."""

    name: str
    us_per_call: float
    items_per_s: float


def _batch(n: int, gen: torch.Generator) -> dict[object, torch.Tensor]:
    return {
        "obs": torch.randn(n, 4, generator=gen),
        ("next", "obs"): torch.randn(n, 4, generator=gen),
        "action": torch.randint(0, 2, (n,), generator=gen),
        "reward": torch.ones(n),
        "terminated": torch.rand(n, generator=gen) < 0.01,
        "truncated": torch.zeros(n, dtype=torch.bool),
    }


def _best(op: Callable[[], object], blocks: int, ops: int) -> float:
    """The fastest block's seconds per call."""
    best = float("inf")
    for _ in range(blocks):
        start = time.perf_counter()
        for _ in range(ops):
            op()
        best = min(best, (time.perf_counter() - start) / ops)
    return best


def _filled(capacity: int, prioritized: bool, gen: torch.Generator) -> ReplayBuffer:
    sampler = PrioritizedSampler() if prioritized else None
    rb = ReplayBuffer(capacity, sampler=sampler, seed=0)
    while not rb.is_full:
        rb.extend(_batch(min(4096, capacity - len(rb)), gen))
    return rb


def _time_uniform(capacity: int, blocks: int, ops: int, gen: torch.Generator) -> list[tuple[str, float]]:
    uniform = _filled(capacity, False, gen)
    data = _batch(BATCH, gen)
    return [
        ("extend B=256 (uniform)", _best(lambda: uniform.extend(data), blocks, ops)),
        ("sample B=256 (uniform)", _best(lambda: uniform.sample(BATCH), blocks, ops)),
    ]


def run_quickbench(capacity: int = 100_000, blocks: int = 5, ops: int = 50) -> list[BenchRow]:
    """Time extend and sample on full buffers of ``capacity`` items (one thread).

    Args:
        capacity: items per buffer (filled before timing).
        blocks: timed blocks per operation; the fastest counts.
        ops: calls per block.
    """
    capacity, blocks, ops = (
        check_positive_int(n, v) for n, v in [("capacity", capacity), ("blocks", blocks), ("ops", ops)]
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        rows = _time_uniform(capacity, blocks, ops, gen)
        per = _filled(capacity, True, gen)
        priorities = torch.rand(BATCH, generator=gen) + 0.1

        def sample_update() -> None:
            per.update_priority(per.sample(BATCH)["index"], priorities)

        rows.append(("sample+update B=256 (prioritized)", _best(sample_update, blocks, ops)))
    finally:
        torch.set_num_threads(threads)
    return [BenchRow(name, s * 1e6, BATCH / s) for name, s in rows]
