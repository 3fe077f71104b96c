"""A ReplayBuffer shared by threads: collector, learner and saver at once.

Every row carries a checksum of itself (``check == payload.sum()``) and its own write
number in ``payload[:, 0]``, so a sampled row that is torn (fields from two items) or
does not match its ``"index"`` is caught. Runs are bounded by a short deadline.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import xpbank
from xpbank import Field, PrioritizedSampler, ReplayBuffer, Spec, StaleIndexError

WIDTH = 16
SPEC = Spec({"payload": Field((WIDTH,), torch.int64), "check": Field((), torch.int64)})


def rows(first: int, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """Items ``first .. first + n - 1``: random payload, ``payload[:, 0]`` = item number."""
    payload = torch.randint(0, 2**40, (n, WIDTH), generator=gen)
    payload[:, 0] = torch.arange(first, first + n)
    return {"payload": payload, "check": payload.sum(-1)}


def check_whole(batch: Any) -> None:
    """Each row is one item, whole, and the item its ``"index"`` names."""
    payload, check = batch["payload"], batch["check"]
    assert torch.equal(payload.sum(-1), check), "a torn row: checksum mismatch"
    assert torch.equal(payload[:, 0], batch["index"]), "a row does not hold the item its index names"


def run_threads(targets: list[Any], seconds: float) -> None:
    """Run each ``target(stop)`` in a thread for ``seconds``; re-raise the first failure."""
    stop, errors = threading.Event(), []

    def guard(target: Any) -> None:
        try:
            target(stop)
        except BaseException as exc:  # handed to the test thread below
            errors.append(exc)
            stop.set()

    threads = [threading.Thread(target=guard, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a thread did not stop within 30 s (a deadlock?)"
    if errors:
        raise errors[0]


@pytest.mark.parametrize("prioritized", [False, True])
def test_collector_learner_saver_threads(tmp_path: Path, prioritized: bool) -> None:
    sampler = PrioritizedSampler(alpha=0.6, beta=0.4) if prioritized else None
    rb = ReplayBuffer(500, SPEC, sampler=sampler, seed=0)
    written, sampled, saved, stale = [0], [0], [0], [0]

    def collector(stop: threading.Event) -> None:
        gen = torch.Generator().manual_seed(1)
        while not stop.is_set():
            n = int(torch.randint(1, 64, (1,), generator=gen))
            ids = rb.extend(rows(written[0], n, gen))
            assert ids == range(written[0], written[0] + n)
            written[0] += n

    def learner(stop: threading.Event) -> None:
        while not stop.is_set():
            if len(rb) == 0:
                time.sleep(0.001)
                continue
            batch = rb.sample(32)
            check_whole(batch)
            if prioritized:
                rb.update_priority(batch["index"], batch["check"].double() % 7 + 0.1, stale="skip")
            try:  # in place, same values; the collector may have overwritten them since
                rb.update(batch["index"][:4], {"check": batch["check"][:4]})
            except StaleIndexError:
                stale[0] += 1
            sampled[0] += 1

    def saver(stop: threading.Event) -> None:
        while not stop.is_set():
            if len(rb) == 0:
                time.sleep(0.001)
                continue
            path = xpbank.save(rb, tmp_path / "bank")
            back = xpbank.load(path).sample_all()
            check_whole(back)
            ids = back["index"]
            assert torch.equal(ids, torch.arange(int(ids[0]), int(ids[0]) + ids.shape[0]))
            saved[0] += 1

    run_threads([collector, learner, saver], seconds=1.5)
    assert written[0] > 0 and sampled[0] > 0 and saved[0] > 0, (written, sampled, saved)
    check_whole(rb.sample_all())
    assert rb.sample_all()["index"][-1] == written[0] - 1


def test_lock_groups_calls() -> None:
    """``with rb.lock:`` holds off another thread's writes until it is released."""
    rb = ReplayBuffer(100, SPEC, seed=0)
    gen = torch.Generator().manual_seed(0)
    started, done = threading.Event(), threading.Event()

    def writer() -> None:
        started.set()
        rb.extend(rows(0, 5, gen))
        done.set()

    with rb.lock:
        thread = threading.Thread(target=writer, daemon=True)
        thread.start()
        started.wait(5)
        assert not done.wait(0.05)
        assert len(rb) == 0
    thread.join(timeout=10)
    assert done.is_set() and len(rb) == 5


def test_epochs_while_another_thread_extends() -> None:
    """An epoch pass sees whole minibatches; a concurrent extend stops it with a clear error."""
    rb = ReplayBuffer(1000, SPEC, seed=0)
    gen = torch.Generator().manual_seed(0)
    rb.extend(rows(0, 1000, gen))
    passes = rb.epochs(100)
    check_whole(next(passes))
    thread = threading.Thread(target=rb.extend, args=(rows(1000, 10, gen),))
    thread.start()
    thread.join(timeout=10)
    with pytest.raises(xpbank.BufferChangedError, match="extended or cleared during iteration"):
        next(passes)


def test_a_pickled_buffer_gets_a_fresh_lock_and_the_same_items() -> None:
    import pickle

    rb = ReplayBuffer(8, seed=0)
    rb.extend({"x": torch.arange(5.0)})
    copy = pickle.loads(pickle.dumps(rb))
    assert copy.lock is not rb.lock and torch.equal(copy.sample_all()["x"], torch.arange(5.0))
    with copy.lock:  # usable, and re-entrant
        copy.extend({"x": torch.ones(2)})
    assert len(copy) == 7 and len(rb) == 5


def contiguous(ids: torch.Tensor) -> bool:
    return ids.numel() == 0 or torch.equal(ids, torch.arange(int(ids[0]), int(ids[0]) + ids.numel()))


def test_sample_all_is_one_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clear and a shorter extend landing after sample_all read the size (here from
    inside its read, as another thread's calls would) cannot make it read past the end."""
    from xpbank.replay import reading

    rb = ReplayBuffer(200, SPEC, seed=0)
    gen = torch.Generator().manual_seed(0)
    rb.extend(rows(0, 104, gen))
    read = reading.sample_by_index

    def compete(*args: Any) -> Any:  # the old sample_all read the size, then came here
        rb.clear()
        rb.extend(rows(104, 50, gen))
        return read(*args)

    monkeypatch.setattr(reading, "sample_by_index", compete)
    got = rb.sample_all()
    check_whole(got)
    assert contiguous(got["index"]) and got["index"].numel() in (104, 50)


def test_epochs_marker_is_taken_when_the_plan_is_made() -> None:
    rb = ReplayBuffer(100, SPEC, seed=0)
    gen = torch.Generator().manual_seed(0)
    rb.extend(rows(0, 40, gen))
    passes = rb.epochs(10)  # planned for 40 items
    rb.extend(rows(40, 5, gen))  # before the first next()
    with pytest.raises(xpbank.BufferChangedError, match="extended or cleared during iteration"):
        next(passes)
    passes = rb.epochs(10)
    assert sum(b["index"].numel() for b in passes) == 45  # no write: the whole epoch


def id_writer(rb: ReplayBuffer, issued: list[int], counts: dict[str, int], seed: int) -> Any:
    """A ``run_threads`` target extending ``rb`` with items whose ``payload[:, 0]`` is the
    id the buffer gives them (``issued[0]``: the next id, shared by every such writer)."""

    def run(stop: threading.Event) -> None:
        gen = torch.Generator().manual_seed(seed)
        while not stop.is_set():
            n = int(torch.randint(1, 40, (1,), generator=gen))
            with rb.lock:  # values encode the ids this extend is given
                assert rb.extend(rows(issued[0], n, gen)) == range(issued[0], issued[0] + n)
                issued[0] += n
            counts["extend"] += 1

    return run


def test_clear_sample_all_epochs_save_while_writers_extend(tmp_path: Path) -> None:
    """Bounded, seeded: every result is one state of the buffer (ids contiguous, each
    row the item its id names) and every bank saved meanwhile loads."""
    rb = ReplayBuffer(300, SPEC, seed=0)
    issued, counts = [0], dict.fromkeys(["extend", "clear", "all", "epoch", "save"], 0)

    def clearer(stop: threading.Event) -> None:
        while not stop.wait(0.02):
            with rb.lock:  # clear moves the next id on to a fresh one
                rb.clear()
                issued[0] = int(rb.state_dict(data=False)["ring"]["next_id"])
            counts["clear"] += 1

    def reader(stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                got = rb.sample_all()
            except xpbank.EmptyBufferError:
                continue
            check_whole(got)
            assert contiguous(got["index"]) and got["index"].numel() <= rb.capacity
            counts["all"] += 1

    def epocher(stop: threading.Event) -> None:
        while not stop.is_set():
            with rb.lock:
                if len(rb) == 0:
                    continue
                first, n = rb.sample_by_index([0])["index"].item(), len(rb)
                passes = rb.epochs(16)
            try:
                for batch in passes:
                    check_whole(batch)
                    assert ((batch["index"] >= first) & (batch["index"] < first + n)).all()
            except xpbank.BufferChangedError as exc:
                assert "during iteration" in str(exc)
            counts["epoch"] += 1

    def saver(stop: threading.Event) -> None:
        while not stop.is_set():
            path = xpbank.save(rb, tmp_path / "bank")
            back = xpbank.load(path)
            if len(back):
                got = back.sample_all()
                check_whole(got)
                assert contiguous(got["index"])
            counts["save"] += 1

    writers = [id_writer(rb, issued, counts, seed) for seed in (1, 2)]
    run_threads([*writers, clearer, reader, epocher, saver], seconds=1.5)
    assert all(counts.values()), counts


def check_copy(got: Any) -> None:
    """A copy with new ids (a merge): whole rows, the items of one contiguous run of ids."""
    payload = got["payload"]
    assert torch.equal(payload.sum(-1), got["check"]), "a torn row: checksum mismatch"
    assert contiguous(payload[:, 0]), "items of two states (their ids are not one run)"
    assert torch.equal(got["index"], torch.arange(payload.shape[0])), "a merge numbers its items 0 .."


def test_checkpoint_and_merge_while_writers_extend(tmp_path: Path) -> None:
    """Bounded, seeded: an ``open_bank(.., "r+")`` buffer checkpointed and merged (with an
    empty buffer, both ways) while two threads extend it: every merge is one state of the
    buffer, and every checkpoint loads as the buffer was at that moment."""
    path = xpbank.save(ReplayBuffer(300, SPEC, seed=0), tmp_path / "bank")
    rb = xpbank.open_bank(path, "r+")
    issued, counts = [0], dict.fromkeys(["extend", "checkpoint", "merge"], 0)

    def checkpointer(stop: threading.Event) -> None:
        while not stop.is_set():
            rb.checkpoint()
            with rb.lock:  # the bank as committed now: no write between this checkpoint and the load
                rb.checkpoint()
                want = rb.sample_all() if len(rb) else None
                back = xpbank.load(path)
            got = back.sample_all() if len(back) else None
            assert (got is None) == (want is None)
            if got is not None and want is not None:
                check_whole(got)
                assert contiguous(got["index"]) and torch.equal(got["payload"], want["payload"])
            counts["checkpoint"] += 1

    def merger(stop: threading.Event) -> None:
        empty = ReplayBuffer(4, SPEC)
        turn = 0
        while not stop.is_set():
            turn += 1
            merged = xpbank.merge(rb, empty) if turn % 2 else xpbank.merge(empty, rb)
            if len(merged):
                check_copy(merged.sample_all())
            counts["merge"] += 1

    writers = [id_writer(rb, issued, counts, seed) for seed in (1, 2)]
    run_threads([*writers, checkpointer, merger], seconds=1.5)
    assert all(counts.values()), counts
    rb.checkpoint()
    final = xpbank.load(path).sample_all()  # the last checkpoint: every item written
    check_whole(final)
    assert contiguous(final["index"]) and int(final["index"][-1]) == issued[0] - 1


def public_methods(cls: type) -> list[str]:
    """``cls``'s public methods (and ``len``), not its properties."""
    import inspect

    names = [n for n in dir(cls) if not n.startswith("_") or n == "__len__"]
    return [n for n in names if callable(inspect.getattr_static(cls, n)) or n == "__len__"]


@pytest.mark.parametrize("where", ["ReplayBuffer", "ShmReplayBuffer", "RayReplayBuffer"])
def test_every_public_method_says_what_it_sees_under_threads(where: str) -> None:
    """Each public method's docstring has a "Threads:" (or "Threads/processes:") note."""
    import importlib
    import inspect
    import re

    module = {"ReplayBuffer": "xpbank", "ShmReplayBuffer": "xpbank.distributed.shm"}
    if where == "RayReplayBuffer":
        pytest.importorskip("ray")
    cls = getattr(importlib.import_module(module.get(where, "xpbank.distributed.ray")), where)
    names = public_methods(cls)
    assert {"sample", "extend", "__len__"} <= set(names)
    missing = [
        n for n in names if not re.search(r"Threads(/processes)?:", inspect.getdoc(getattr(cls, n)) or "")
    ]
    assert not missing, f"{where}: no 'Threads:' note in {missing}"
