"""The write fast path for a Table's buffer (xpbank.table.runs) against the full path.

Two buffers get the same random stream of adds, extends (batch sizes repeat, so the
signature matches), samples, priority updates and clears; one has the fast path off
(``rb._fast_write = False``). Their ids, samples, stored rows and the table's state must
match call for call, and the fast path must have been taken (counted through the hooks).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from xpbank import EmptyBufferError, RateLimitTimeout, ReplayBuffer, Table


def _tables() -> dict[str, Callable[[], Table]]:
    return {
        "queue": lambda: Table.queue(timeout=0.0),
        "stack": lambda: Table.stack(timeout=0.0),
        "fifo_ring": lambda: Table("uniform", "fifo"),
        "uniform_removal": lambda: Table("fifo", "uniform", max_times_sampled=2),
        "heaps": lambda: Table("max_heap", "min_heap", max_times_sampled=3),
        "prioritized": lambda: Table("prioritized", "fifo", versioned=True),
    }


def _counted(rb: ReplayBuffer, taken: list[int]) -> None:
    start, written = rb.__dict__["_runs"]

    def counting(rows: int) -> int:
        taken.append(rows)
        return written(rows)

    rb.__dict__["_runs"] = (start, counting)


def _call(rb: ReplayBuffer, op: str, arg: object) -> object:
    try:
        if op == "add":
            return rb.add(arg)
        if op == "extend":
            out = rb.extend(arg)
            return list(out) if isinstance(out, range) else out.tolist()
        if op == "sample":
            batch = rb.sample(arg, replace=True)
            return {k: batch[k].tolist() for k in ("obs", "a", "index")}
        if op == "priority":
            ids = rb.sample_all()["index"]
            rb.update_priority(ids[: len(ids) // 2], torch.arange(len(ids) // 2, dtype=torch.float64) + 0.5)
            return None
        rb.clear()
        return None
    except (EmptyBufferError, RateLimitTimeout) as e:
        return type(e).__name__


def _state(rb: ReplayBuffer) -> dict[str, object]:
    slots = rb._sampler.state_dict()["slots"]
    out = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in slots.items()}
    out["all"] = {k: v.tolist() for k, v in rb.sample_all().items()} if len(rb) else None
    return out


@pytest.mark.parametrize("name", list(_tables()))
@pytest.mark.parametrize("seed", [0, 1])
def test_the_fast_path_gives_the_full_paths_ids_samples_and_state(name, seed):
    rng = np.random.default_rng(seed)
    make = _tables()[name]
    fast, slow = ReplayBuffer(24, sampler=make(), seed=seed), ReplayBuffer(24, sampler=make(), seed=seed)
    slow._fast_write = False
    taken: list[int] = []
    _counted(fast, taken)
    for step in range(300):
        op = rng.choice(["add", "extend", "sample", "priority", "clear"], p=[0.3, 0.35, 0.3, 0.03, 0.02])
        if op == "add":
            arg: object = {"obs": rng.standard_normal(3).astype(np.float32), "a": int(rng.integers(9))}
        elif op == "extend":
            n = int(rng.choice([4, 8]))  # repeated sizes: the signature matches
            arg = {"obs": torch.randn(n, 3), "a": torch.randint(0, 9, (n,))}
        else:
            arg = int(rng.integers(1, 6))
        if op == "priority" and "heap" not in name and name != "prioritized":
            continue
        assert _call(fast, op, arg) == _call(slow, op, arg), (step, op)
        assert _state(fast) == _state(slow), (step, op)
    assert taken, "the fast path was never taken"


def test_a_full_queue_declines_and_the_full_path_times_out_with_nothing_written():
    rb = ReplayBuffer(4, sampler=Table.queue(timeout=0.0), seed=0)
    batch = {"obs": torch.randn(2, 3)}
    assert rb.extend(batch) == range(0, 2)
    assert rb.extend(batch) == range(2, 4)  # through the fast path
    assert rb.__dict__["_runs"][0](2) is None  # the limiter says wait: no run offered
    before = _state(rb)
    with pytest.raises(RateLimitTimeout):
        rb.extend(batch)
    assert _state(rb) == before
    assert rb.sample(2)["index"].tolist() == [0, 1]
    assert rb.extend(batch) == range(4, 6)  # room again: slots 0 and 1, ids 4 and 5
    assert rb.sample(4)["index"].tolist() == [2, 3, 4, 5]
