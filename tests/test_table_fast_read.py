"""The read fast path for a consume-once FIFO table (xpbank.table.runs.take_run, read by
xpbank.replay.fast_read.read_run) against the full path.

Two buffers get the same random stream of adds, extends, samples (with and without
replacement, some asking for fields or options), clears and state round trips; one has
the fast read off (``rb._fast_read = False``). Their samples and the table's state must
match call for call; for the queue presets the fast path must have been taken, and for
tables it does not serve (other selectors, limits, versions, orders that must hear of
a removal) it must never be.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from xpbank import ReplayBuffer, Table, XpbankError

TAKES = {
    "queue": lambda: Table.queue(timeout=0.0),
    "fifo_once_lifo_removal": lambda: Table("fifo", "lifo", max_times_sampled=1),  # holes in the log
    "fifo_once_no_limiter": lambda: Table("fifo", "fifo", max_times_sampled=1),
}
DECLINES = {
    "fifo_twice": lambda: Table("fifo", "fifo", max_times_sampled=2),
    "fifo_unlimited": lambda: Table("fifo", "fifo"),
    "stack": lambda: Table.stack(timeout=0.0),
    "versioned_queue": lambda: Table.queue(timeout=0.0, versioned=True),
    "fifo_once_heap_removal": lambda: Table("fifo", "min_heap", max_times_sampled=1),
    "uniform_once": lambda: Table("uniform", "fifo", max_times_sampled=1),
}


def _counted(rb: ReplayBuffer, taken: list[int]) -> None:
    take = rb.__dict__["_take_run"]

    def counting(b: object, replace: bool) -> object:
        out = take(b, replace)
        if out is not None:
            taken.append(len(out[1]))
        return out

    rb.__dict__["_take_run"] = counting


def _call(rb: ReplayBuffer, op: str, arg: object, replace: bool) -> object:
    try:
        if op == "add":
            return rb.add(arg)
        if op == "extend":
            return list(rb.extend(arg))
        if op == "sample":
            batch = rb.sample(arg, replace=replace)
            return {k: (v.dtype, v.tolist()) for k, v in batch.items()}
        if op == "fields":
            return {k: v.tolist() for k, v in rb.sample(arg, fields=["obs"]).items()}
        if op == "timeout":
            return {k: v.tolist() for k, v in rb.sample(arg, timeout=0.0).items()}
        if op == "reload":
            rb.load_state_dict(rb.state_dict())
            return None
        rb.clear()
        return None
    except XpbankError as e:  # empty, short, a wait that timed out: the same error both ways
        return f"{type(e).__name__}: {e}"


def _state(rb: ReplayBuffer) -> dict[str, object]:
    table = rb._sampler.state_dict()
    out = {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in table["slots"].items()}
    out["limiter"] = table.get("limiter")
    out["all"] = {k: v.tolist() for k, v in rb.sample_all().items()} if len(rb) else None
    return out


def _run(make: Callable[[], Table], seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    fast, slow = ReplayBuffer(24, sampler=make(), seed=seed), ReplayBuffer(24, sampler=make(), seed=seed)
    slow._fast_read = False
    taken: list[int] = []
    _counted(fast, taken)
    ops = ["add", "extend", "sample", "fields", "timeout", "reload", "clear"]
    for step in range(300):
        op = rng.choice(ops, p=[0.2, 0.3, 0.35, 0.05, 0.05, 0.03, 0.02])
        if op == "add":
            arg: object = {"obs": rng.standard_normal(3).astype(np.float32), "a": int(rng.integers(9))}
        elif op == "extend":
            n = int(rng.integers(1, 9))  # odd sizes: runs that wrap and that do not
            arg = {"obs": torch.randn(n, 3), "a": torch.randint(0, 9, (n,))}
        else:
            arg = int(rng.integers(1, 7))
        replace = bool(rng.integers(2))
        assert _call(fast, op, arg, replace) == _call(slow, op, arg, replace), (step, op)
        assert _state(fast) == _state(slow), (step, op)
        for ring in (fast._ring, slow._ring):  # the flag the write fast path trusts
            assert not ring.fifo_ids or ring.fifo_ids_hold(), (step, op)
    return taken


@pytest.mark.parametrize("name", list(TAKES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_consume_once_fifo_table_takes_runs_as_the_full_path_samples(name, seed):
    assert _run(TAKES[name], seed), "the fast path was never taken"


@pytest.mark.parametrize("name", list(DECLINES))
def test_other_tables_never_take_a_run_and_sample_as_before(name):
    assert _run(DECLINES[name], 0) == []


def test_a_run_is_declined_at_the_wrap_and_over_a_hole_and_nothing_changes():
    rb = ReplayBuffer(8, sampler=Table("fifo", "lifo", max_times_sampled=1), seed=0)
    take = rb.__dict__["_take_run"]
    rb.extend({"obs": torch.arange(8.0)})
    assert rb.sample(6)["index"].tolist() == [0, 1, 2, 3, 4, 5]  # a run: slots 0..5
    rb.extend({"obs": torch.arange(8.0, 12.0)})  # slots 6, 7 live; 0..3 take ids 8..11
    before = rb._sampler.state_dict()["slots"]["live"].tolist()
    assert take(4, True) is None  # the oldest four are slots 6, 7, 0, 1: they wrap
    assert rb._sampler.state_dict()["slots"]["live"].tolist() == before
    assert rb.sample(4)["index"].tolist() == [6, 7, 8, 9]  # the full path
    rb.extend({"obs": torch.arange(12.0, 18.0)})  # full: the LIFO remover evicts the newest
    batch = rb.sample(3)
    assert batch["index"].tolist() == [10, 11, 12] and batch["obs"].tolist() == [10.0, 11.0, 12.0]


def test_runs_resume_after_a_sample_the_full_path_took():
    rb = ReplayBuffer(16, sampler=Table.queue(timeout=0.0), seed=0)
    taken: list[int] = []
    _counted(rb, taken)
    rb.extend({"obs": torch.arange(12.0)})
    assert rb.sample(3, fields=["obs"])["index"].tolist() == [0, 1, 2]  # the full path
    assert rb.sample(4)["index"].tolist() == [3, 4, 5, 6] and taken == [4]  # a run again
    assert rb.sample(2, timeout=0.0)["index"].tolist() == [7, 8] and taken == [4, 2]  # no wait needed
    with pytest.raises(XpbankError, match="timeout"):
        rb.sample(4, timeout=-1.0)  # a wait is needed: the full path checks the timeout
    assert rb.sample(3)["obs"].tolist() == [9.0, 10.0, 11.0] and taken == [4, 2, 3]
