"""A deterministic scheduler for two threads at a ReplayBuffer's lock boundary.

A bounded random run reaches the window between two steps of a call only by luck. Here
thread A runs one call (``sample_all``, ``epochs``, a merge, a save, a checkpoint) on a
buffer whose lock is wrapped by :class:`Interleave`: at A's ``k``-th lock boundary (just
before it takes the lock from free: after an unlocked read of the size, say; or just
after it lets it go: between two locked steps, or before it uses what it read), A is
paused and thread B runs a whole writing call (``clear`` then ``extend``, or an
``extend`` that wraps the ring); then A goes on. Every ``k`` from 1 to one past the
number of boundaries of the call is tried, so every boundary is hit exactly once. A call that is one step sees
the buffer before B or after it, never a mix; :func:`test_the_scheduler_catches_a_two_step_call`
checks that the harness does fail on calls split the way the old ones were.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import xpbank
from test_threads import SPEC, check_whole, rows
from xpbank import BufferChangedError, ReplayBuffer
from xpbank.bank import ops
from xpbank.replay import reading

CAPACITY, STORED = 24, 20


class Interleave:
    """``rb``'s lock, wrapped: the boundaries of ``thread`` (A) are just before each time
    it takes the lock from free and just after each time it lets it go; at the ``at``-th
    (from 1) A is paused and ``interrupt()`` runs to its end in another thread (B).
    ``count``: how many boundaries A has passed."""

    def __init__(self, rb: Any, at: int | None, interrupt: Callable[[], Any]):
        self.inner, self.at, self.interrupt = rb._lock, at, interrupt
        self.thread: threading.Thread | None = None
        self.count, self.fired, self.depth = 0, False, threading.local()
        rb._lock = self

    def _boundary(self) -> None:
        if threading.current_thread() is not self.thread:
            return
        self.count += 1
        if self.count == self.at:  # A holds nothing now: B's whole call runs here
            other = threading.Thread(target=self.interrupt)
            other.start()
            other.join(timeout=30)
            assert not other.is_alive(), "the interrupting call did not finish (a deadlock?)"
            self.fired = True

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        depth = getattr(self.depth, "n", 0)
        if depth == 0:
            self._boundary()
        self.depth.n = depth + 1  # first: the inner lock's own work (a shm pull) nests in it
        got = self.inner.acquire(blocking, timeout)
        if not got:
            self.depth.n = depth
        return got

    def release(self) -> None:
        self.depth.n -= 1
        self.inner.release()
        if self.depth.n == 0:
            self._boundary()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def filled(first: int = 0) -> ReplayBuffer:
    rb = ReplayBuffer(CAPACITY, SPEC, seed=0)
    rb.extend(rows(first, STORED, torch.Generator().manual_seed(first)))
    return rb


def clear_and_extend(rb: ReplayBuffer) -> None:
    """B: a clear and a shorter extend (ids 100 ..: no value of the old state)."""
    rb.clear()
    rb.extend(rows(int(rb.state_dict(data=False)["ring"]["next_id"]), 7, torch.Generator().manual_seed(7)))


def wrap(rb: ReplayBuffer) -> None:
    """B: an extend that overwrites the 9 oldest items (positions shift by 9)."""
    rb.extend(rows(STORED, 13, torch.Generator().manual_seed(13)))


def append(rb: ReplayBuffer) -> None:
    """B: an extend into free slots (3 of the 4 left)."""
    rb.extend(rows(STORED, 3, torch.Generator().manual_seed(3)))


WRITES = {"clear+extend": clear_and_extend, "extend over the oldest": wrap, "extend into free slots": append}


def payloads(rb: ReplayBuffer) -> torch.Tensor:
    """The state of ``rb`` as its items' payloads, oldest first (empty: no rows)."""
    return rb.sample_all()["payload"] if len(rb) else torch.empty(0, SPEC["payload"].shape[0])


def interleave(
    call: Callable[[ReplayBuffer], Any],
    write: Callable[[ReplayBuffer], None],
    make: Callable[[], ReplayBuffer] = filled,
) -> list[tuple[Any, torch.Tensor, torch.Tensor, int]]:
    """Run ``call(rb)`` in thread A, on a fresh ``make()`` each time, with ``write(rb)`` at
    each of its lock boundaries in turn; returns ``(what the call returned, the state
    before, the state after, the boundary)`` for each. An error the call raises is a failure."""
    probe = make()
    counter = Interleave(probe, None, lambda: None)
    counter.thread = threading.current_thread()
    call(probe)
    runs = []
    for at in range(1, counter.count + 2):
        rb = make()
        before = payloads(rb)
        sched = Interleave(rb, at, lambda rb=rb: write(rb))
        out: list[Any] = []

        def run_a(rb: ReplayBuffer = rb, out: list[Any] = out) -> None:
            try:
                out.append(call(rb))
            except Exception as exc:  # handed to the test thread
                out.append(exc)

        sched.thread = threading.Thread(target=run_a)
        sched.thread.start()
        sched.thread.join(timeout=60)
        assert not sched.thread.is_alive(), "thread A did not finish (a deadlock?)"
        if at <= counter.count:
            assert sched.fired, f"boundary {at} of {counter.count} was not reached"
        else:  # one past the last boundary: B never ran during the call
            write(rb)
        if isinstance(out[0], Exception):
            raise AssertionError(f"a write at lock boundary {at} made the call fail: {out[0]!r}")
        runs.append((out[0], before, payloads(rb), at))
    return runs


def one_of(got: torch.Tensor, before: torch.Tensor, after: torch.Tensor, at: int) -> None:
    assert torch.equal(got, before) or torch.equal(got, after), (
        f"a write at lock boundary {at} made the call see neither the state before it nor after it: "
        f"ids {got[:, 0].tolist()}"
    )


@pytest.mark.parametrize("write", list(WRITES))
def test_sample_all_sees_one_state(write: str) -> None:
    for got, before, after, at in interleave(lambda rb: rb.sample_all(), WRITES[write]):
        check_whole(got)
        one_of(got["payload"], before, after, at)


@pytest.mark.parametrize("write", list(WRITES))
def test_epochs_see_one_state_or_raise(write: str) -> None:
    def drain(rb: ReplayBuffer) -> Any:
        seen: list[torch.Tensor] = []
        try:
            for batch in rb.epochs(6, shuffle=False):
                check_whole(batch)
                seen.append(batch["payload"])
        except BufferChangedError as exc:
            return exc, torch.cat(seen) if seen else torch.empty(0, SPEC["payload"].shape[0])
        return None, torch.cat(seen)

    raised = 0
    for (error, got), before, after, at in interleave(drain, WRITES[write]):
        if error is None:  # planned and read wholly before B, or wholly after it
            one_of(got, before, after, at)
        else:  # the minibatches read before the error are of the state the plan was made on
            raised += 1
            assert torch.equal(got, before[: got.shape[0]]), f"boundary {at}: a minibatch of another state"
    assert raised, "no write landed between the plan and a minibatch"


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("how", ["merge(rb, empty)", "merge(empty, rb)", "empty.merge_(rb)"])
def test_merge_copies_one_state(monkeypatch: pytest.MonkeyPatch, how: str, write: str) -> None:
    monkeypatch.setattr(ops, "_MERGE_CHUNK", 4)  # several chunks: several steps, were they locked apart

    def merge(rb: ReplayBuffer) -> Any:
        empty = ReplayBuffer(8, SPEC)
        if how == "merge(rb, empty)":
            return xpbank.merge(rb, empty)
        return xpbank.merge(empty, rb) if how == "merge(empty, rb)" else empty.merge_(rb)

    for got, before, after, at in interleave(merge, WRITES[write]):
        keep = got.capacity  # a merge into a smaller buffer keeps the newest
        one_of(payloads(got), before[-keep:], after[-keep:], at)


@pytest.mark.parametrize("write", list(WRITES))
def test_a_saved_bank_is_one_state(tmp_path: Path, write: str) -> None:
    banks = iter(range(1000))

    def save(rb: ReplayBuffer) -> Any:
        return xpbank.load(xpbank.save(rb, tmp_path / f"bank{next(banks)}"))

    for got, before, after, at in interleave(save, WRITES[write]):
        one_of(payloads(got), before, after, at)


def test_a_checkpoint_is_one_state(tmp_path: Path) -> None:
    """The buffer is an ``open_bank(.., "r+")`` bank, written by B into free slots; what
    a checkpoint commits loads as one state of it. (B's write is an append: an r+ bank's
    rows are written in place, so a write that overwrites counted rows after the
    checkpoint changes what loads until the next one, as ``xpbank.bank.checkpoint`` says.)"""
    paths: dict[int, Path] = {}

    def bank() -> ReplayBuffer:
        path = xpbank.save(filled(), tmp_path / f"bank{len(paths)}")
        rb = xpbank.open_bank(path, "r+")
        paths[id(rb)] = path
        return rb

    def checkpoint(rb: ReplayBuffer) -> Any:
        rb.checkpoint()
        return xpbank.load(paths[id(rb)])

    for got, before, after, at in interleave(checkpoint, append, make=bank):
        check_whole(got.sample_all())
        one_of(payloads(got), before, after, at)


class SplitCalls(ReplayBuffer):
    """The calls as they were before they became one step (issue 20), for the meta-test."""

    def sample_all(self, fields: Any = None) -> Any:
        n = len(self)  # the size, read before the locked read
        return self.sample_by_index(torch.arange(n), fields)

    def epochs(self, batch_size: int, n_epochs: int = 1, shuffle: bool = True, *args: Any) -> Any:
        with self.lock:
            plan = reading.epoch_plan(len(self), batch_size, n_epochs, shuffle, False, self.generator)

        def run() -> Any:  # the marker taken at the first next(), not with the plan
            with self.lock:
                marker = reading._marker(self)
            return reading._run_plan(self, plan, None, marker)

        return (b for b in _Lazy(run))


class _Lazy:
    def __init__(self, make: Callable[[], Any]):
        self.make, self.it = make, None

    def __iter__(self) -> Any:
        return self

    def __next__(self) -> Any:
        if self.it is None:
            self.it = self.make()
        return next(self.it)


@pytest.mark.parametrize("test", [test_sample_all_sees_one_state, test_epochs_see_one_state_or_raise])
def test_the_scheduler_catches_a_two_step_call(monkeypatch: pytest.MonkeyPatch, test: Any) -> None:
    """The checks above fail on the old two-step ``sample_all`` and ``epochs``."""
    monkeypatch.setattr(ReplayBuffer, "sample_all", SplitCalls.sample_all)
    monkeypatch.setattr(ReplayBuffer, "epochs", SplitCalls.epochs)
    with pytest.raises(AssertionError, match="lock boundary"):
        test("clear+extend")
