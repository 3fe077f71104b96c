"""Tables over shared memory: the same results as a local table (hypothesis, every selector
and remover that evicts), a full queue leaves rows in the writers' channels, a waiting
sample takes what writers publish, and a consume-once queue delivers every published item
exactly once across concurrent reader processes, also when a reader dies mid-batch.

"Delivered" is defined in :mod:`xpbank.distributed.shm_readers`: returned by a
``sample`` (the owner's, or a reader process's ``ShmReader.sample``). Rows are tagged
``(writer, seq)`` so that every item's fate is checked.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import threading
import time
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpbank import BufferTimeoutError, CapacityError, Field, RateLimitTimeout, ReplayBuffer, Spec, Table
from xpbank.distributed.channel import CONSUMED, PUBLISHED
from xpbank.distributed.shm import ShmReader, ShmReplayBuffer, ShmWriter

SPEC = Spec({"tag": Field((2,), torch.int64), "x": Field((4,))})
FORK = multiprocessing.get_context("fork")


def rows(writer: int, first: int, n: int) -> dict[str, torch.Tensor]:
    """``n`` rows tagged ``(writer, first ..)`` (NumPy only: safe in a forked child)."""
    tag = np.stack([np.full(n, writer), np.arange(first, first + n)], axis=1).astype(np.int64)
    return {"tag": torch.from_numpy(tag), "x": torch.from_numpy(tag[:, [1, 1, 1, 1]].astype(np.float32))}


def seqs(batch: Any) -> list[int]:
    return batch["tag"][:, 1].tolist()


def queue(capacity: int, **kw: Any) -> ShmReplayBuffer:
    kw.setdefault("num_writers", 1)
    kw.setdefault("channel_rows", 8)
    return ShmReplayBuffer(capacity, SPEC, sampler=Table.queue(timeout=kw.pop("timeout", 5.0)), seed=0, **kw)


def test_a_full_queue_leaves_rows_in_the_channel_and_its_writer_waits() -> None:
    rb = queue(4, channel_rows=8)
    w = rb.writer(0, timeout=0.2)
    try:
        w.extend(rows(0, 0, 8))  # 4 fit the table, 4 stay in the channel
        assert len(rb) == 4 and rb.insert_room() == 0
        w.extend(rows(0, 8, 4))  # the channel's other 4 rows
        with pytest.raises(BufferTimeoutError, match=r"no room for 1 rows after 0\.2 s"):
            w.extend(rows(0, 12, 1))  # channel full: the writer waits, then gives up
        assert seqs(rb.sample(3)) == [0, 1, 2]  # oldest first; the pull refills the table
        assert len(rb) == 4 and seqs(rb.sample(4)) == [3, 4, 5, 6]
        assert seqs(rb.sample(4)) + seqs(rb.sample(1)) == [7, 8, 9, 10, 11]  # none evicted or repeated
        assert len(rb) == 0
    finally:
        w.close()
        rb.close()


def test_a_waiting_sample_takes_what_writers_publish_and_times_out_unchanged() -> None:
    rb = queue(16, timeout=0.3)
    w = rb.writer(0)
    try:
        w.extend(rows(0, 0, 2))
        blocked = r"sample of 3 items still blocked after 0\.3 s \(2 of 16 slots live"
        with pytest.raises(RateLimitTimeout, match=blocked):
            rb.sample(3)
        assert len(rb) == 2  # the refused sample took nothing
        late = threading.Timer(0.2, lambda: w.extend(rows(0, 2, 5)))
        late.start()
        assert seqs(rb.sample(3, timeout=10.0)) == [0, 1, 2]  # waited for the late rows
        late.join()
        assert seqs(rb.sample(4)) == [3, 4, 5, 6]
    finally:
        w.close()
        rb.close()


def test_pulls_take_the_channels_in_turn() -> None:
    """A full table takes from each writer in turn: one busy writer does not starve another."""
    rb = queue(2, num_writers=2, channel_rows=8)
    w0, w1 = rb.writer(0), rb.writer(1)
    try:
        w0.extend(rows(0, 0, 8))
        w1.extend(rows(1, 0, 8))
        writers = []
        for _ in range(8):
            writers += rb.sample(2)["tag"][:, 0].tolist()
        assert sorted(writers) == [0] * 8 + [1] * 8
        assert 0 in writers[:6] and 1 in writers[:6]
    finally:
        w0.close()
        w1.close()
        rb.close()


# -- reader processes --------------------------------------------------------------------------
def produce(writer: ShmWriter, index: int, n: int, batch: int) -> None:
    with writer:
        for lo in range(0, n, batch):
            writer.extend(rows(index, lo, min(batch, n - lo)))


def consume(reader: ShmReader, out: Any, batch: int, idle: float) -> None:
    """Sample until nothing comes for ``idle`` s; send each batch's tags as it arrives."""
    with reader:
        while True:
            try:
                got = reader.sample(batch, timeout=idle)
            except BufferTimeoutError:
                break
            out.put(got["tag"].numpy().tolist())
    out.put(None)


def test_a_queue_delivers_every_item_once_across_reader_processes_and_the_owner() -> None:
    """Bounded stress: 2 writer processes, 2 reader processes and the owner's own samples."""
    n, writers, readers = 1500, 2, 2
    rb = queue(64, num_writers=writers, channel_rows=32, num_readers=readers, reader_rows=64)
    out = FORK.Queue()
    try:
        procs = [FORK.Process(target=produce, args=(rb.writer(w), w, n, 25)) for w in range(writers)]
        procs += [FORK.Process(target=consume, args=(rb.reader(r), out, 16, 1.0)) for r in range(readers)]
        for p in procs:
            p.start()
        delivered: list[list[int]] = []
        done, deadline = 0, time.monotonic() + 120
        while done < readers:
            assert time.monotonic() < deadline, "readers did not finish"
            with contextlib.suppress(RateLimitTimeout):
                delivered += rb.sample(8, timeout=0.0)["tag"].tolist()  # the owner reads too
            while not out.empty():
                got = out.get()
                if got is None:
                    done += 1
                else:
                    delivered += got
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        channels = rb._reader_channels  # rows served after a reader's last timeout come back
        settled = lambda: all(int(c.header[PUBLISHED]) == int(c.header[CONSUMED]) for c in channels)  # noqa: E731
        wait_for(settled, "the readers' last rows did not come back")
        delivered += rb.sample(len(rb))["tag"].tolist() if len(rb) else []
        tags = sorted(map(tuple, delivered))
        assert tags == [(w, s) for w in range(writers) for s in range(n)], "an item lost or repeated"
    finally:
        rb.close()


def wait_for(check: Any, what: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def sample_then_hang(reader: ShmReader, out: Any, first: int, second: int) -> None:
    """Take a batch of ``first`` (delivered, reported), then wait on a batch of ``second``."""
    got = reader.sample(first, timeout=30.0)
    out.put(seqs(got))
    reader.sample(second, timeout=60.0)  # killed while it waits: its channel holds a part


def test_a_reader_killed_mid_batch_gives_its_untaken_rows_to_another_reader() -> None:
    rb = queue(16, num_readers=2, reader_rows=16)
    w = rb.writer(0)
    out = FORK.Queue()
    try:
        w.extend(rows(0, 0, 8))
        proc = FORK.Process(target=sample_then_hang, args=(rb.reader(0), out, 3, 10))
        proc.start()
        assert out.get(timeout=30) == [0, 1, 2]  # delivered to the reader before it died
        channel = rb._reader_channels[0]
        wait_for(lambda: int(channel.header[PUBLISHED]) == 8, "the 5 rows of its next batch were not served")
        assert len(rb) == 0  # they left the table for the reader's channel
        os.kill(proc.pid, signal.SIGKILL)  # mid-batch: 5 of the 10 rows it waits for are there
        proc.join(timeout=30)
        wait_for(lambda: len(rb) == 5, "the dead reader's rows did not come back")
        with rb.reader(1) as other:
            assert seqs(other.sample(5, timeout=10.0)) == [3, 4, 5, 6, 7]  # once each, none lost
        assert len(rb) == 0 and rb._readers is not None and rb._readers.returned == [5, 0]
        assert rb._readers.delivered() == [3, 5]  # the dead reader's first batch, the other's
    finally:
        w.close()
        rb.close()


def test_reader_handles_are_checked() -> None:
    rb = queue(8)
    with pytest.raises(CapacityError, match="no reader channels; build it with num_readers=R"):
        rb.reader(0)
    rb.close()
    rb = queue(8, num_readers=1, reader_rows=4)
    with pytest.raises(CapacityError, match=r"index expected 0 \.\. 0, got 1"):
        rb.reader(1)
    with rb.reader(0) as reader, pytest.raises(CapacityError, match="at most the channel's 4 rows, got 5"):
        reader.sample(5)
    rb.close()


def test_a_reader_that_times_out_and_closes_gives_its_rows_back() -> None:
    rb = queue(16, num_readers=1, reader_rows=16)
    w = rb.writer(0)
    try:
        w.extend(rows(0, 0, 3))
        reader = rb.reader(0)
        with pytest.raises(BufferTimeoutError, match="3 of 5 items arrived"):
            reader.sample(5, timeout=0.3)
        w.extend(rows(0, 3, 2))
        assert seqs(reader.sample(2, timeout=10.0)) == [0, 1]  # the standing request's rows
        reader.close()  # 3 rows served and not taken: back to the table
        wait_for(lambda: len(rb) == 3, "the closed reader's rows did not come back")
        assert sorted(seqs(rb.sample(3))) == [2, 3, 4]
    finally:
        w.close()
        rb.close()


def test_the_impala_example_runs_from_a_queue() -> None:
    """``examples/impala_cartpole.py --quick``: actor processes, the queue, V-trace; every
    trajectory reaches the learner once (its ``(actor, seq)`` tags)."""
    pytest.importorskip("gymnasium")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "examples" / "impala_cartpole.py"
    spec = importlib.util.spec_from_file_location("impala_cartpole", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = example.main(["--quick", "--timeout", "30"])
    assert out["env_steps"] >= 4000 and out["updates"] >= 12 and out["duplicates"] == 0
    assert out["episodes"] > 0 and 8.0 <= out["eval_return"] <= 500.0


def consume_until(reader: ShmReader, conn: Any, stop: Any, batch: int) -> None:
    """Sample and report each batch down a pipe until ``stop`` (or until killed)."""
    with reader:
        while not stop.is_set():
            try:
                conn.send(reader.sample(batch, timeout=0.2)["tag"].numpy().tolist())
            except BufferTimeoutError:
                continue


def drain(conn: Any) -> list[list[int]]:
    """Every whole message in a pipe (a reader killed mid-send leaves a torn last one)."""
    got: list[list[int]] = []
    try:
        while conn.poll(0.05):
            got += conn.recv()
    except Exception:  # EOF, or a torn message: unreported
        pass
    return got


@pytest.mark.slow  # ~10-20 s
def test_reader_processes_killed_at_random_lose_only_what_they_had_taken() -> None:
    """Bounded stress: readers are SIGKILLed at random moments and replaced. No item is
    delivered twice, and the items never reported are exactly as many as the dead readers
    had taken (delivered to them: at most once), per the reader channels' counters."""
    n, writers, readers = 4000, 3, 2
    rb = queue(128, num_writers=writers, channel_rows=64, num_readers=readers, reader_rows=64)
    stop, rng = FORK.Event(), np.random.default_rng(0)
    live: dict[int, Any] = {}
    reported: list[list[int]] = []

    def start(i: int) -> None:
        ours, theirs = FORK.Pipe(duplex=False)
        proc = FORK.Process(target=consume_until, args=(rb.reader(i), theirs, stop, 16))
        proc.start()
        theirs.close()
        live[i] = (proc, ours)

    try:
        procs = [FORK.Process(target=produce, args=(rb.writer(w), w, n, 40)) for w in range(writers)]
        for p in procs:
            p.start()
        for i in range(readers):
            start(i)
        for _ in range(8):  # kill and replace a reader at random moments
            time.sleep(float(rng.uniform(0.05, 0.3)))
            i = int(rng.integers(readers))
            proc, conn = live[i]
            os.kill(proc.pid, signal.SIGKILL)
            proc.join(timeout=30)
            reported += drain(conn)
            start(i)
        for p in procs:
            p.join(timeout=60)
            assert p.exitcode == 0
        pool = rb._readers
        assert pool is not None
        wait_for(lambda: sum(pool.delivered()) == writers * n and len(rb) == 0, "not all delivered", 60)
        stop.set()
        for proc, conn in live.values():
            proc.join(timeout=30)
            assert proc.exitcode == 0
            reported += drain(conn)
        tags = [tuple(t) for t in reported]
        assert len(tags) == len(set(tags)), "an item delivered twice"
        missing = {(w, s) for w in range(writers) for s in range(n)} - set(tags)
        assert len(missing) == sum(pool.delivered()) - len(tags)  # taken by readers that died
    finally:
        stop.set()
        rb.close()


SEED = 3  # both buffers' (a different one makes the random selectors' draws differ)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.integers(1, 6)),
        st.tuples(st.just("sample"), st.integers(1, 5), st.booleans()),
        st.tuples(st.just("priority"), st.integers(0, 2**16)),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    selector=st.sampled_from(["uniform", "prioritized", "fifo", "lifo", "min_heap", "max_heap"]),
    remover=st.sampled_from(["fifo", "lifo", "min_heap", "max_heap", "uniform"]),
    times=st.sampled_from([None, 1, 2]),
    ops=OPS,
)
def test_a_table_over_shared_memory_behaves_as_a_local_one(
    selector: str, remover: str, times: int | None, ops: list[Any]
) -> None:
    """The same calls, rows written through a writer's channel or by a local ``extend``:
    the same samples, ids and sizes, or the same error (tables that evict: no waits)."""

    def table() -> Table:
        return Table(selector, remover, max_times_sampled=times)

    local = ReplayBuffer(8, SPEC, sampler=table(), seed=3)
    shm = ShmReplayBuffer(8, SPEC, num_writers=1, channel_rows=64, sampler=table(), seed=SEED)
    w = shm.writer(0)
    written, last = 0, None
    try:
        for op in ops:
            if op[0] == "write":
                local.extend(rows(0, written, op[1]))
                w.extend(rows(0, written, op[1]))  # taken at the shm buffer's next call
                written += op[1]
            elif op[0] == "sample":
                got = []
                for rb in (local, shm):
                    try:
                        got.append(rb.sample(op[1], replace=op[2] or selector == "prioritized"))
                    except Exception as exc:  # the same refusal on both
                        got.append(type(exc))
                if isinstance(got[0], type):
                    assert got[1] is got[0]
                else:
                    assert not isinstance(got[1], type)
                    assert torch.equal(got[0]["index"], got[1]["index"]) and seqs(got[0]) == seqs(got[1])
                    last = got[0]["index"]
            elif last is not None:
                prio = torch.from_numpy(np.random.default_rng(op[1]).random(len(last)))
                for rb in (local, shm):
                    rb.update_priority(last, prio, stale="skip")
            assert len(local) == len(shm)
        if len(local):
            assert seqs(local.sample_all()) == seqs(shm.sample_all())
    finally:
        w.close()
        shm.close()
