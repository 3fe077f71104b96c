"""Many writer processes, one learner: a ReplayBuffer fed through shared memory.

:class:`ShmReplayBuffer` is a :class:`~xpbank.ReplayBuffer` (every method, sampler,
n-step, bank) that also owns ``num_writers`` channels in shared memory
(:mod:`xpbank.distributed.channel`). ``rb.writer(i)`` is a small picklable handle: send
it to a collector process (``multiprocessing`` or ``torch.multiprocessing``, spawn or
fork); there ``writer.extend(batch)`` checks the batch against the spec, reserves room
in its channel, writes the rows and publishes them. Every public call of the learner's
buffer (``sample()``, ``sample_all()``, ``len()``, ``state_dict()``, ``xpbank.save`` ...)
first moves every published row into the ring, one ``extend`` per channel; so ids,
cursor, sizes and priorities are the learner's alone and stay consistent, and a sample
never sees an unpublished row. The move happens when a thread first takes ``rb.lock``
(:class:`~xpbank.distributed.pull_lock.PullingLock`), never inside a call nested in a
hold: a save, a merge or a ``with rb.lock:`` group sees one state from start to end.

A writer killed mid-write loses only its unpublished rows; the learner notices (the
kernel drops the dead writer's file lock), logs a warning, counts it in
:meth:`ShmReplayBuffer.writers`, and a new process may take the channel over.

Cost: each row is copied twice (writer -> channel, channel -> ring), and the learner
does the second copy, which is what bounds throughput
(``benchmarks/bench_shm.py``). Rows become sampleable at the learner's next ``pull``.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank.distributed.channel import CLOSED, CRASHES, LOST, PID, PUBLISHED, Channel, record_dtype
from xpbank.distributed.pull_lock import PullingLock, weak_take
from xpbank.distributed.shm_readers import ReaderPool, ShmReader, reader_record
from xpbank.distributed.shm_writer import ShmWriter, WriterStatus
from xpbank.distributed.table_room import draws_now, room_now, table_of
from xpbank.errors import CapacityError, SpecError, check_positive_int
from xpbank.replay.buffer import ReplayBuffer
from xpbank.spec.spec import NestedKey, Spec
from xpbank.storage.dtypes import as_torch

__all__ = ["ShmReplayBuffer", "ShmReader", "ShmWriter", "WriterStatus"]

log = logging.getLogger(__name__)


def _root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


class ShmReplayBuffer(ReplayBuffer):
    """A :class:`~xpbank.ReplayBuffer` that collector processes write into through shared memory.

    Args:
        capacity, spec, **options: as :class:`~xpbank.ReplayBuffer` (``spec=None`` lays
            it out at the first local ``extend``; writers need it known).
        num_writers: how many channels (one per collector process).
        channel_rows: rows a channel holds between two pulls; a writer waits (up to its
            timeout) while its channel is full.
        num_readers: reader channels, one per reader process (:meth:`reader`; a thread
            of this process serves them: :mod:`xpbank.distributed.shm_readers`).
        reader_rows: rows a reader channel holds (the largest batch a reader may ask for).

    Tables: a pull moves only as many rows as the table admits without evicting
    (:meth:`insert_room`: all of them for a FIFO ring; a queue's free room): the rest
    stay in their channels, whose writers then wait for room (up to their timeout)
    instead of the table dropping data. Channels are pulled in turn, starting one
    further each pull, so no writer starves the others. A table's waits (a sample from
    an empty queue, a write into a full one) pull every ``POLL_SECONDS`` while they wait
    (the table's ``on_wait`` hook), so they end as soon as writers publish or readers
    free room. Rows still in the channels when the buffer closes are dropped (logged).

    Threads/processes: as a :class:`~xpbank.ReplayBuffer` (every call one step under
    ``rb.lock``), and the first time a thread takes ``rb.lock`` it moves the rows writers
    published into the ring: a call (or a ``with rb.lock:`` group, or ``xpbank.save``)
    sees every row published before it began and none published while it runs.

    Example:
        >>> import torch
        >>> from xpbank import Field, Spec
        >>> from xpbank.distributed.shm import ShmReplayBuffer
        >>> rb = ShmReplayBuffer(100, Spec({"obs": Field((2,))}), num_writers=1, seed=0)
        >>> w = rb.writer(0)  # send it to a collector process; here, used in place
        >>> w.extend({"obs": torch.ones(3, 2)})
        3
        >>> rb.sample(2)["obs"].shape, len(rb)
        (torch.Size([2, 2]), 3)
        >>> w.close(); rb.close()
    """

    POLL_SECONDS = 1e-3  # how often a table's wait looks for rows writers published

    def __init__(
        self,
        capacity: int,
        spec: Spec | None = None,
        *,
        num_writers: int,
        channel_rows: int = 65536,
        num_readers: int = 0,
        reader_rows: int = 4096,
        **options: Any,
    ):
        self._num_writers = check_positive_int("num_writers", num_writers)
        self._channel_rows = check_positive_int("channel_rows", channel_rows)
        if isinstance(num_readers, bool) or not isinstance(num_readers, int) or num_readers < 0:
            raise CapacityError(f"num_readers: expected an int >= 0, got {num_readers!r}")
        self._num_readers = num_readers
        self._reader_rows = check_positive_int("reader_rows", reader_rows)
        super().__init__(capacity, spec, **options)
        self._lock = PullingLock(weak_take(self, "_take"))
        table = table_of(self)
        if table is not None:  # a table's waits (an empty queue, a full one) take what writers publish
            table.poll_interval, table.on_wait = self.POLL_SECONDS, weak_take(self, "_take")
        self._channels: list[Channel] = []
        self._reader_channels: list[Channel] = []
        self._readers: ReaderPool | None = None
        self._returned: list[dict[NestedKey, torch.Tensor]] = []  # readers' rows, back to the table
        self._first_channel = 0  # where the next pull starts (round robin)
        self._fields: tuple[Spec, list[tuple[NestedKey, str, torch.dtype]]] | None = None  # see _columns
        self._dir: Path | None = None
        self._seen_crashes = [0] * self._num_writers
        self._next_check = 0.0

    def _open_channels(self) -> None:
        if self._channels:
            return
        if self.spec is None:
            raise SpecError("writer: the buffer has no spec yet; give spec= or extend it once first")
        record = record_dtype(self.spec)
        self._dir = _root() / f"xpbank-shm-{os.getpid()}-{secrets.token_hex(6)}"
        self._dir.mkdir(mode=0o700)
        self._finalizer = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._channels = [
            Channel(self._dir / f"writer{i}", record, self._channel_rows, create=True)
            for i in range(self._num_writers)
        ]
        self._reader_channels = [
            Channel(self._dir / f"reader{i}", reader_record(self.spec), self._reader_rows, create=True)
            for i in range(self._num_readers)
        ]

    def writer(self, index: int, timeout: float = 60.0) -> ShmWriter:
        """The handle for channel ``index`` (``0 <= index < num_writers``); see :class:`ShmWriter`.

        Threads: one step under rb.lock (the channels are made once, the handle names the
        one open then); a writer made just before another thread's :meth:`close` fails at
        its first call, as every attached writer does."""
        if not isinstance(index, int) or not 0 <= index < self._num_writers:
            raise CapacityError(f"writer: index expected 0 .. {self._num_writers - 1}, got {index!r}")
        with self._lock:  # not while another thread pulls or closes
            self._open_channels()
            path, spec = self._channels[index].path, self.spec
        return ShmWriter(path, spec, self._channel_rows, timeout)  # type: ignore[arg-type]

    def reader(self, index: int, timeout: float = 60.0) -> ShmReader:
        """The handle for reader channel ``index`` (``0 <= index < num_readers``): send it
        to a reader process; see :class:`~xpbank.distributed.shm_readers.ShmReader`.

        The first call starts this process's thread that serves the readers.
        Threads: one step under rb.lock.

        Raises:
            CapacityError: ``index`` out of range.
        """
        if not self._num_readers:
            raise CapacityError("reader: this buffer has no reader channels; build it with num_readers=R")
        if not isinstance(index, int) or not 0 <= index < self._num_readers:
            raise CapacityError(f"reader: index expected 0 .. {self._num_readers - 1}, got {index!r}")
        with self._lock:
            self._open_channels()
            if self._readers is None:
                self._readers = ReaderPool(self, self._reader_channels)
            path, spec = self._reader_channels[index].path, self.spec
        return ShmReader(path, spec, self._reader_rows, timeout)  # type: ignore[arg-type]

    def _serve_readers(self) -> int:
        """One round of the reader pool's thread: answer what readers asked for."""
        with self._lock:
            if self._readers is None:
                return 0
            return self._readers.serve(self, self._draws())

    def _give_back(self, flat: dict[NestedKey, torch.Tensor]) -> None:
        """Rows a reader took from the table and left: back in, ahead of the channels'
        (consume-once tables only: elsewhere the items are still stored)."""
        if self.max_times_sampled() == 1:
            self._returned.append(flat)

    @property
    def _table(self) -> Any:
        """The buffer's :class:`~xpbank.Table`, or ``None`` (a plain sampler)."""
        return table_of(self)

    def insert_room(self) -> int | None:
        """How many items the table admits now without a writer waiting (``None``: any
        number: the ring or the table's remover makes room). Threads: one step under
        rb.lock (after the pull)."""
        with self._lock:
            return self._room()

    def sampleable(self) -> int:
        """How many draws a sample can take now without waiting (``1 << 40``: any number,
        with replacement and no ``max_times_sampled``). Threads: one step under rb.lock
        (after the pull)."""
        with self._lock:
            return self._draws()

    def _room(self) -> int | None:
        return room_now(self)

    def _draws(self) -> int:
        return draws_now(self)

    def max_times_sampled(self) -> int | None:
        """How often an item may be sampled before it leaves (``None``: no limit).
        Threads: reads a setting fixed at construction; no lock needed."""
        table = self._table
        return None if table is None else table.max_times_sampled

    def pull(self) -> int:
        """Move every published row into the ring (in channel order); returns how many.

        Every outermost public call already does this first; call it to take rows
        inside a ``with rb.lock:`` group. Threads: one step under ``rb.lock``.
        """
        with self._lock.plain():  # type: ignore[attr-defined]
            return self._take()

    def _take(self) -> int:
        """:meth:`pull`'s work (called holding the lock, by the lock's outermost acquire)."""
        if not self._channels:
            return 0
        room = self._room()
        moved = 0
        while self._returned and (room is None or room > moved):
            flat = self._returned.pop(0)
            n = len(next(iter(flat.values())))
            k = n if room is None else min(n, room - moved)
            moved += len(super().extend({key: v[:k] for key, v in flat.items()}))
            if k < n:
                self._returned.insert(0, {key: v[k:] for key, v in flat.items()})
        channels, table = self._channels, self._table
        count = len(channels)
        left = None if room is None else room - moved  # rows the table admits still
        runs: list[np.ndarray] = []  # a table's pull: one extend (its write path costs per call)
        taken: list[tuple[Channel, int]] = []
        for j in range(count):
            if left is not None and left <= 0:
                break  # no room: the other channels wait for the next pull
            channel = channels[(self._first_channel + j) % count]
            first, last = channel.waiting()
            if left is not None:
                last = min(last, first + left)
            if last <= first:
                continue  # nothing waiting: no empty run
            for run in channel.runs(first, last):
                if table is not None:
                    runs.append(run)
                else:
                    moved += len(super().extend(self._columns(run)))
            if left is not None:
                left -= last - first
            taken.append((channel, last))
        if runs:
            moved += len(super().extend(self._columns(runs[0] if len(runs) == 1 else np.concatenate(runs))))
        for channel, last in taken:
            channel.consumed(last)
        self._first_channel = (self._first_channel + 1) % count
        if moved and table is not None:
            table.notify()  # wake local threads waiting on the table
        if time.monotonic() >= self._next_check:
            self._check_writers()
        return moved

    def _columns(self, run: np.ndarray) -> dict[NestedKey, torch.Tensor]:
        spec = self.spec
        assert spec is not None  # channels exist only once the spec is known
        fields = self._fields
        if fields is None or fields[0] is not spec:  # (key, record field, dtype) made once per spec
            fields = self._fields = (spec, [(k, f"f{i}", spec[k].dtype) for i, k in enumerate(spec)])
        return {k: as_torch(run[name], dtype) for k, name, dtype in fields[1]}

    def _check_writers(self) -> None:
        """Reap writers that died holding a channel; log each crash once."""
        self._next_check = time.monotonic() + 0.05
        for i, channel in enumerate(self._channels):
            h = channel.header
            if h[PID] != 0 and h[CLOSED] == 0 and channel.try_lock():
                try:
                    channel.reap()
                finally:
                    channel.unlock()
            if int(h[CRASHES]) > self._seen_crashes[i]:
                self._seen_crashes[i] = int(h[CRASHES])
                log.warning(
                    "shm writer %d died without closing (%d crash(es), %d unpublished rows dropped); "
                    "the buffer is intact and the channel is free for a new writer",
                    i,
                    int(h[CRASHES]),
                    int(h[LOST]),
                )

    def writers(self) -> list[WriterStatus]:
        """The state of every channel (checks for crashed writers first). Threads: one step under rb.lock."""
        with self._lock:  # the channels as they are now: not emptied by a close() after a check
            if not self._channels:
                return [WriterStatus(i, "free", 0, 0, 0, 0) for i in range(self._num_writers)]
            self._check_writers()
            out = []
            for i, channel in enumerate(self._channels):
                h = channel.header
                crashed = h[CRASHES] and h[CLOSED] == 0  # the last writer died; none since
                state = "attached" if h[PID] != 0 else ("crashed" if crashed else "free")
                out.append(
                    WriterStatus(i, state, int(h[PID]), int(h[PUBLISHED]), int(h[CRASHES]), int(h[LOST]))
                )
            return out

    def close(self) -> None:
        """Take the rows published so far, then unmap and delete the channels.

        Writers still attached raise :class:`~xpbank.ChannelError` at their next call (at
        once, before writing). The buffer keeps its items and stays usable as a plain
        replay buffer. Threads: one step under ``rb.lock``.
        """
        if self._readers is not None:
            self._readers.stop()  # outside the lock: its thread takes the lock to serve
        with self._lock:  # the outermost acquire pulls
            for channel in [*self._channels, *self._reader_channels]:
                channel.shut()
            self._take()  # rows published before a writer could see the flag
            left = sum(last - first for first, last in (c.waiting() for c in self._channels))
            if left:
                log.warning(
                    "shm buffer closed with %d published row(s) the table had no room for: dropped", left
                )
            for channel in [*self._channels, *self._reader_channels]:
                channel.close()
            self._channels, self._reader_channels, self._readers = [], [], None
            if self._dir is not None:
                self._finalizer()
                self._dir = None

    def __len__(self) -> int:
        """Items stored, after taking what writers published. Threads: one step under ``rb.lock``."""
        with self._lock:
            return super().__len__()

    @property
    def is_full(self) -> bool:
        """Threads: one step under ``rb.lock`` (pulls first)."""
        with self._lock:
            return super().is_full

    def __repr__(self) -> str:
        return "Shm" + super().__repr__() + f"[num_writers={self._num_writers}]"
