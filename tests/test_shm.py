"""ShmReplayBuffer: collector processes write through shared memory while the learner samples.

Every row carries ``payload[:, 0] = writer``, ``payload[:, 1] = its number in that
writer's stream`` and ``check = payload.sum()``: a torn row fails the checksum, and the
rows a writer published must arrive exactly once each, in its order (the reference).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing

import xpbank
from xpbank import BufferTimeoutError, ChannelError, Field, PrioritizedSampler, Spec, SpecError
from xpbank.distributed.channel import SHUT
from xpbank.distributed.shm import ShmReplayBuffer, ShmWriter

WIDTH = 8
SPEC = Spec({"payload": Field((WIDTH,), torch.int64), "check": Field((), torch.int64), "x": Field((3,))})


def rows(writer: int, first: int, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rows made with NumPy only: a forked child must not enter torch's OpenMP pool
    once the parent has used it (GNU OpenMP hangs after fork)."""
    rng = np.random.default_rng(seed * 1_000_003 + first)
    payload = rng.integers(0, 2**40, (n, WIDTH), dtype=np.int64)
    payload[:, 0], payload[:, 1] = writer, np.arange(first, first + n)
    x = payload[:, :3].astype(np.float32)
    return {
        "payload": torch.from_numpy(payload),
        "check": torch.from_numpy(payload.sum(-1)),
        "x": torch.from_numpy(x),
    }


def check_whole(batch: Any) -> None:
    payload = batch["payload"]
    assert torch.equal(payload.sum(-1), batch["check"]), "a torn row: checksum mismatch"
    assert torch.equal(payload[:, :3].float(), batch["x"]), "a torn row: x differs from its payload"


def produce(writer: ShmWriter, index: int, n: int, batch: int) -> None:
    """A collector: ``n`` rows in batches, then a clean close."""
    with writer:
        for lo in range(0, n, batch):
            writer.extend(rows(index, lo, min(batch, n - lo)))


def produce_forever(writer: ShmWriter, index: int, batch: int) -> None:
    """A collector that writes one batch over and over until it is killed."""
    data = rows(index, 0, batch)
    while True:
        writer.extend(data)


def check_streams(rb: ShmReplayBuffer, counts: dict[int, int]) -> None:
    """Every writer's published rows arrived once each, in order (the rows ``0 .. count - 1``)."""
    got = rb.sample_all()
    check_whole(got)
    for w, count in counts.items():
        seq = got["payload"][got["payload"][:, 0] == w][:, 1]
        assert torch.equal(seq, torch.arange(count)), f"writer {w}: rows lost, repeated or reordered"


def learn_while(rb: ShmReplayBuffer, procs: list[Any], deadline_s: float = 60.0) -> int:
    """Sample (and check) while the writer processes run; returns the batches sampled."""
    sampled, end = 0, time.monotonic() + deadline_s
    while any(p.is_alive() for p in procs):
        assert time.monotonic() < end, "writers did not finish in time"
        if rb.pull() or len(rb):
            batch = rb.sample(64)
            check_whole(batch)
            if isinstance(rb.sampler, PrioritizedSampler):
                rb.update_priority(batch["index"], batch["check"].double() % 5 + 0.5, stale="skip")
            sampled += 1
        else:
            time.sleep(0.001)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0, f"writer exit code {p.exitcode}"
    rb.pull()
    return sampled


@pytest.mark.parametrize(
    "mp, method, writers",
    [
        (multiprocessing, "fork", 2),
        (torch.multiprocessing, "fork", 2),
        pytest.param(multiprocessing, "spawn", 1, marks=pytest.mark.slow),  # ~10 s: imports torch
        pytest.param(torch.multiprocessing, "spawn", 1, marks=pytest.mark.slow),
    ],
    ids=["mp-fork", "torch-fork", "mp-spawn", "torch-spawn"],
)
def test_writer_processes(mp: Any, method: str, writers: int) -> None:
    ctx = mp.get_context(method)
    n = 3000
    rb = ShmReplayBuffer(writers * n, SPEC, num_writers=writers, channel_rows=500, seed=0)
    try:
        procs = [ctx.Process(target=produce, args=(rb.writer(w), w, n, 97)) for w in range(writers)]
        for p in procs:
            p.start()
        learn_while(rb, procs)
        assert len(rb) == writers * n
        check_streams(rb, dict.fromkeys(range(writers), n))
        assert [s.state for s in rb.writers()] == ["free"] * writers
        assert [s.published for s in rb.writers()] == [n] * writers
    finally:
        rb.close()


def test_prioritized_with_writer_processes() -> None:
    ctx = multiprocessing.get_context("fork")
    rb = ShmReplayBuffer(
        1000, SPEC, num_writers=2, channel_rows=256, sampler=PrioritizedSampler(eps=0.0), seed=0
    )
    try:
        procs = [ctx.Process(target=produce, args=(rb.writer(w), w, 2000, 50)) for w in range(2)]
        for p in procs:
            p.start()
        assert learn_while(rb, procs) >= 0
        assert len(rb) == 1000  # wrapped: the newest 1000 of 4000
        ids = rb.sample_all()["index"]
        favoured = ids[[3, 500, 998]]
        rb.update_priority(ids, torch.where(torch.isin(ids, favoured), 1.0, 0.0))
        batch = rb.sample(256)
        check_whole(batch)
        # the others hold no mass (eps=0): a tiny one (1e-12 ** alpha = 6e-8 each, 2e-5 of
        # the total) made 256 draws miss the favoured ~0.5% of runs
        assert torch.isin(batch["index"], favoured).all()
        assert set(batch["payload"][:, 0].tolist()) <= {0, 1}
    finally:
        rb.close()


def test_sigkill_mid_write_leaves_no_torn_row(caplog: pytest.LogCaptureFixture) -> None:
    """Kill writers at random moments until one dies between reserve and publish."""
    ctx = multiprocessing.get_context("fork")
    batch = 4096
    rb = ShmReplayBuffer(50_000, SPEC, num_writers=1, channel_rows=2 * batch, seed=0)
    gen = torch.Generator().manual_seed(0)
    try:
        mid_write, attempts = 0, 0
        while mid_write == 0:
            attempts += 1
            # usually a few attempts; a loaded machine (other processes on both cores)
            # once needed more than 60, each costing a fork and ~10 ms
            assert attempts <= 200, "no kill landed mid-write in 200 attempts"
            proc = ctx.Process(target=produce_forever, args=(rb.writer(0), 0, batch))
            before = rb.writers()[0].published
            proc.start()
            end = time.monotonic() + 30
            while rb.writers()[0].published == before:  # it has written at least once
                assert proc.is_alive() and time.monotonic() < end, f"writer failed: {proc.exitcode}"
                rb.pull()
                time.sleep(0.0005)
            wait_until = time.monotonic() + float(torch.rand((), generator=gen)) * 0.01
            while time.monotonic() < wait_until:  # keep the channel drained: the writer keeps writing
                rb.pull()
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
            proc.join(timeout=30)
            with caplog.at_level(logging.WARNING, logger="xpbank.distributed.shm"):
                rb.pull()
                status = rb.writers()[0]
            assert status.state == "crashed" and status.crashes == attempts
            mid_write = status.lost_rows
            check_whole(rb.sample_all())  # only published rows, whole
        assert "died without closing" in caplog.text
        assert mid_write % batch == 0 and mid_write > 0
        # a new writer takes the channel over; the buffer goes on
        got = len(rb)
        proc = ctx.Process(target=produce, args=(rb.writer(0), 7, 100, 100))
        proc.start()
        learn_while(rb, [proc])
        assert len(rb) == min(got + 100, rb.capacity)
        assert rb.writers()[0].state == "free"
        check_whole(rb.sample_all())
    finally:
        rb.close()


def test_bad_batch_is_refused_whole() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=16)
    try:
        w = rb.writer(0)
        bad = rows(0, 5, 0)
        bad["x"] = torch.zeros(5, 4)
        with pytest.raises(SpecError, match=r"'x'.*expected.*3"):
            w.extend(bad)
        assert rb.pull() == 0 and rb.writers()[0].published == 0
        stop = threading.Event()
        learner = threading.Thread(target=lambda: [rb.pull() for _ in iter(lambda: stop.wait(0.001), True)])
        learner.start()
        try:  # larger than the channel: published in whole channel-sized parts
            assert w.extend(rows(0, 0, 40)) == 40
        finally:
            stop.set()
            learner.join(timeout=10)
        rb.pull()
        check_streams(rb, {0: 40})
        w.close()
    finally:
        rb.close()


def test_full_channel_times_out_and_second_writer_is_refused() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=2, channel_rows=8)
    try:
        w = rb.writer(0, timeout=0.05)
        w.extend(rows(0, 0, 8))
        with pytest.raises(BufferTimeoutError, match=r"no room for 1 rows after 0.05 s.*8 rows waiting"):
            w.extend(rows(0, 8, 1))
        assert rb.pull() == 8
        w.extend(rows(0, 8, 1))
        assert rb.pull() == 1
        with pytest.raises(ChannelError, match="another live process is attached as this writer"):
            rb.writer(0, timeout=0.05).extend(rows(0, 9, 1))
        assert [s.state for s in rb.writers()] == ["attached", "free"]
        w.close()
        assert len(rb) == 9 and [s.state for s in rb.writers()] == ["free", "free"]
        with pytest.raises(SpecError, match="no spec yet"):
            ShmReplayBuffer(10, num_writers=1).writer(0)
    finally:
        rb.close()


def check_bank(path: Any) -> int:
    """The bank at ``path`` loads; its items are one writer's rows, whole and in order."""
    back = xpbank.load(path)
    if len(back) == 0:
        return 0
    got = back.sample_all()
    check_whole(got)
    ids, seq = got["index"], got["payload"][:, 1]
    assert torch.equal(ids, torch.arange(int(ids[0]), int(ids[0]) + len(back)))
    assert torch.equal(seq, torch.arange(int(seq[0]), int(seq[0]) + len(back)))
    return len(back)


def test_save_while_a_writer_publishes_between_its_steps(monkeypatch: Any, tmp_path: Any) -> None:
    """A writer publishes after save wrote the data files, before it reads the state:
    the bank holds what was published before the save began, and loads."""
    import xpbank.bank.bank as bank_module

    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=64)
    try:
        w = rb.writer(0)
        w.extend(rows(0, 0, 10))
        write_data = bank_module._write_data

        def publish_midway(buffer: Any, root: Any, *rest: Any) -> Any:
            out = write_data(buffer, root, *rest)
            w.extend(rows(0, 10, 5))  # lands between the data files and the state
            return out

        monkeypatch.setattr(bank_module, "_write_data", publish_midway)
        assert check_bank(xpbank.save(rb, tmp_path / "bank")) == 10
        assert len(rb) == 15  # taken at the next call
        monkeypatch.undo()
        assert check_bank(xpbank.save(rb, tmp_path / "bank")) == 15
        w.close()
    finally:
        rb.close()


@pytest.mark.slow  # ~5 s on a loaded machine
def test_saves_while_a_writer_process_publishes(tmp_path: Any) -> None:
    """Bounded stress: every bank saved while a writer process publishes loads, consistent."""
    ctx = multiprocessing.get_context("fork")
    rb = ShmReplayBuffer(300, SPEC, num_writers=1, channel_rows=128, seed=0)
    try:
        proc = ctx.Process(target=produce, args=(rb.writer(0), 0, 6000, 37))
        proc.start()
        saves, end = 0, time.monotonic() + 60
        while (proc.is_alive() or saves == 0) and saves < 60:
            assert time.monotonic() < end, "the writer did not finish in time"
            check_bank(xpbank.save(rb, tmp_path / "bank"))
            saves += 1
        proc.join(timeout=60)
        assert proc.exitcode == 0
        assert check_bank(xpbank.save(rb, tmp_path / "bank")) == len(rb)
    finally:
        rb.close()


def test_writers_fail_at_once_after_the_learner_closes() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=64)
    w = rb.writer(0)  # 60 s default timeout: a wait for room would not end in this test
    w.extend(rows(0, 0, 3))
    rb.close()
    assert len(rb) == 3  # published before close: taken
    for i in range(5):
        with pytest.raises(ChannelError, match="the learner closed the buffer; this call's 16 rows were not"):
            w.extend(rows(0, 3 + 16 * i, 16))
    w.close()


def test_close_while_a_writer_waits_for_room_fails_it_at_once() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=8)
    w = rb.writer(0)
    w.extend(rows(0, 0, 8))  # the channel is full until the learner pulls
    with rb.lock:  # the learner holds its lock, so nothing pulls the 8 rows
        for ch in rb._channels:
            ch.shut()
        with pytest.raises(ChannelError, match="closed the buffer"):
            w.extend(rows(0, 8, 1))  # would wait 60 s for room
    rb.close()
    w.close()


def test_a_publish_racing_close_raises() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=64)
    w = rb.writer(0)
    w.extend(rows(0, 0, 1))
    channel = w._channel
    assert channel is not None
    start = channel.reserve(4, 1.0)
    channel.write(start, {f"f{i}": v.numpy() for i, v in enumerate(rows(0, 1, 4).values())}, 0, 4)
    channel.header[SHUT] = 1  # the learner shuts the channel between write and publish
    with pytest.raises(ChannelError, match="4 rows may never be taken"):
        channel.publish(start, 4)
    rb.close()
    w.close()


def test_every_read_takes_published_rows_first() -> None:
    rb = ShmReplayBuffer(100, SPEC, num_writers=1, channel_rows=64, seed=0)
    try:
        w = rb.writer(0)
        w.extend(rows(0, 0, 3))
        assert rb.sample_all()["payload"].shape[0] == 3
        w.extend(rows(0, 3, 5))
        assert rb.sample_all()["payload"].shape[0] == 8
        reads = {
            "len": lambda: len(rb),
            "is_full": lambda: rb.is_full,
            "sample": lambda: rb.sample(1),
            "sample_by_index": lambda: rb.sample_by_index([0]),
            "epochs": lambda: rb.epochs(4),
            "state_dict": lambda: rb.state_dict(data=False),
            "repr": lambda: repr(rb),
            "writers": lambda: rb.writers(),
        }
        for i, (name, read) in enumerate(reads.items()):
            w.extend(rows(0, 8 + i, 1))
            read()
            assert rb._ring.next_id == 9 + i, f"{name} did not take the published row first"
        w.close()
    finally:
        rb.close()


def check_merged(merged: Any) -> int:
    """A merge of the learner's buffer (new ids ``0 ..``): one writer's rows, whole and in order."""
    if len(merged) == 0:
        return 0
    got = merged.sample_all()
    check_whole(got)
    seq = got["payload"][:, 1]
    assert torch.equal(got["index"], torch.arange(len(merged)))
    assert torch.equal(seq, torch.arange(int(seq[0]), int(seq[0]) + len(merged))), "rows of two states"
    return len(merged)


@pytest.mark.slow  # a few s on a loaded machine
def test_saves_and_merges_while_a_writer_process_publishes(tmp_path: Any) -> None:
    """Bounded stress: the learner saves and merges (with an empty buffer, both ways) while a
    writer process publishes: every bank loads and every merge is one state, consistent."""
    ctx = multiprocessing.get_context("fork")
    rb = ShmReplayBuffer(300, SPEC, num_writers=1, channel_rows=128, seed=0)
    empty = xpbank.ReplayBuffer(4, SPEC)
    try:
        proc = ctx.Process(target=produce, args=(rb.writer(0), 0, 4000, 37))
        proc.start()
        rounds, end = 0, time.monotonic() + 60
        while proc.is_alive() or rounds == 0:  # each round pulls, so the writer gets room
            assert time.monotonic() < end, "the writer did not finish in time"
            check_bank(xpbank.save(rb, tmp_path / "bank"))
            check_merged(xpbank.merge(rb, empty) if rounds % 2 else xpbank.merge(empty, rb))
            rounds += 1
        proc.join(timeout=60)
        assert proc.exitcode == 0
        assert check_merged(xpbank.merge(rb, empty)) == check_bank(xpbank.save(rb, tmp_path / "b")) == len(rb)
    finally:
        rb.close()


def at_each_boundary(call: Any, interrupt: Any, make: Any) -> list[Any]:
    """``call(rb)`` in a thread, with ``interrupt(rb)`` at each of its lock boundaries in
    turn (the deterministic scheduler of ``test_threads_interleave``); what it returned."""
    from test_threads_interleave import Interleave

    probe = make()
    counter = Interleave(probe, None, lambda: None)
    counter.thread = threading.current_thread()
    call(probe)
    boundaries = counter.count
    probe.close()
    got = []
    for at in range(1, boundaries + 1):
        rb = make()
        sched = Interleave(rb, at, lambda rb=rb: interrupt(rb))
        out: list[Any] = []
        sched.thread = threading.Thread(target=lambda rb=rb, out=out: out.append(_outcome(call, rb)))
        sched.thread.start()
        sched.thread.join(timeout=60)
        assert sched.fired and out, f"boundary {at} was not reached"
        got.append((out[0], rb))
    return got


def _outcome(call: Any, rb: Any) -> Any:
    try:
        return call(rb)
    except Exception as exc:  # handed to the test thread
        return exc


def test_writer_and_writers_see_the_channels_open_or_closed_when_close_races() -> None:
    """A ``close()`` landing at any lock boundary of ``writers()`` / ``writer(i)``: the
    status lists every channel, and the handle is of a channel (a closed one fails at its
    first call; a ``writer()`` after the close opens new ones). The old calls checked or
    read the channels outside the lock: ``[]``, or an ``IndexError``."""

    def make() -> ShmReplayBuffer:
        rb = ShmReplayBuffer(100, SPEC, num_writers=2, channel_rows=8)
        rb.writer(1).close()  # the channels exist
        return rb

    for status, rb in at_each_boundary(lambda rb: rb.writers(), lambda rb: rb.close(), make):
        assert not isinstance(status, Exception), status
        assert [s.index for s in status] == [0, 1] and {s.state for s in status} == {"free"}
        rb.close()
    closed = 0
    for w, rb in at_each_boundary(lambda rb: rb.writer(0, timeout=1.0), lambda rb: rb.close(), make):
        assert isinstance(w, ShmWriter), w
        try:
            w.extend(rows(0, 0, 1))
            assert len(rb) == 1  # closed before writer(): it opened new channels, and this is one
        except ChannelError:  # a handle of the channels close() removed: fails at once
            closed += 1
        w.close()
        rb.close()
    assert closed, "no close() landed after writer() named its channel"
