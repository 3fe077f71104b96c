"""Reader processes of a :class:`~xpbank.distributed.shm.ShmReplayBuffer`: samples served
by the learner's process through shared-memory channels, each item delivered once.

The table lives in one process (the one that made the buffer: it owns the ring, ids,
selector and remover). A reader process gets a picklable :class:`ShmReader` from
``rb.reader(i)``; its ``sample(n)`` asks through its own channel (the same
:class:`~xpbank.distributed.channel.Channel` as a writer's, run the other way: the
owner produces, the reader consumes) and waits for the rows. A thread in the owner
(:class:`ReaderPool`, started by the first ``rb.reader``) serves the requests: under
``rb.lock`` (which first pulls the writers' rows) it samples what each reader asked for
and can get now, writes the rows with their ids into the reader's channel and publishes
them. The protocol, with the channel's counters (each written by one side only):

1. the reader raises ``REQUESTED`` to ``CONSUMED + n`` (what it asks for in all);
2. the owner samples ``k <= REQUESTED - PUBLISHED`` items (as many as the table gives now:
   with a queue, a sample removes them), writes them and raises ``PUBLISHED``;
3. once ``PUBLISHED - CONSUMED >= n`` the reader copies ``n`` rows out, then raises
   ``CONSUMED``, then returns them. A reader's timeout leaves its request standing: rows
   that arrive later are the first of its next ``sample``.

**Delivered** means returned by ``ShmReader.sample``: the rows were copied out and
``CONSUMED`` moved past them before the call returned. A reader that dies (even
SIGKILL) or closes with rows in its channel that it had not consumed -- asked for,
taken from the table, never returned to its caller: the rows of a batch it was
waiting on or copying ("mid-batch") -- gives them back: the owner finds it (the dead
process's file lock is free), and with ``max_times_sampled=1`` (a queue) puts the rows
back into the table (as new items: new ids, behind the items there now), so another
reader gets each of them once; other tables keep the item anyway and drop the extra
copy. Rows a reader had consumed are delivered, whatever it did with them afterwards
(no acknowledgement after processing: at most once for the caller's work, as in Reverb).
So for a queue: every item published by a writer is delivered exactly once over all
readers, dead or alive, and the owner's own ``sample`` calls (tested in
``tests/test_table_shm.py``).

A reader row carries the spec's fields and ``"index"`` (the item's id in the owner's
table); a sampler's other per-item entries (importance weights) are not sent.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Any

import numpy as np
import torch

from xpbank.distributed.channel import (
    CLOSED,
    CONSUMED,
    PID,
    PUBLISHED,
    REQUESTED,
    RESERVED,
    Channel,
    record_dtype,
)
from xpbank.distributed.shm_writer import ChannelHandle
from xpbank.errors import BufferTimeoutError, CapacityError, ChannelError, check_positive_int
from xpbank.spec.batch import to_tensordict
from xpbank.spec.spec import Spec
from xpbank.storage.dtypes import as_torch, to_numpy

__all__ = ["ReaderPool", "ShmReader", "reader_record"]

log = logging.getLogger(__name__)

_INDEX = [("index", np.dtype(np.int64))]


def reader_record(spec: Spec) -> np.dtype:
    """A reader channel's record: the spec's fields, then the item's id."""
    return record_dtype(spec, _INDEX)


class ShmReader(ChannelHandle):
    """A reader process's handle on one reader channel of a :class:`ShmReplayBuffer`.

    Picklable; maps its channel on first use, in the process that uses it. One live
    process per channel at a time.

    Args:
        timeout: seconds ``sample`` waits for its rows (and for the channel) by default.
    """

    ROLE = "reader"

    def _record(self) -> np.dtype:
        return reader_record(self._spec)

    def sample(self, batch_size: int, timeout: float | None = None) -> Any:
        """``batch_size`` items sampled by the owner's table for this reader (see the module).

        Args:
            batch_size: items to take; at most the channel's rows.
            timeout: seconds to wait for them (default: the handle's ``timeout``).

        Returns:
            A TensorDict of ``[batch_size]`` with the spec's fields and ``"index"``.

        Raises:
            CapacityError: ``batch_size`` is not a positive int or exceeds the channel.
            BufferTimeoutError: the rows did not all arrive in time (the request stands:
                rows arriving later open the next call's batch).
            ChannelError: the owner closed the buffer.

        Threads/processes: one reader process (or thread) per handle; the owner draws
        each part of the batch in one step under its ``rb.lock``.
        """
        n = check_positive_int("batch_size", batch_size)
        if n > self._rows:
            raise CapacityError(f"batch_size: expected at most the channel's {self._rows} rows, got {n}")
        channel = self._open()
        h = channel.header
        channel.check_open(n)
        consumed = int(h[CONSUMED])
        if int(h[REQUESTED]) < consumed + n:
            h[REQUESTED] = consumed + n
        wait = self.timeout if timeout is None else float(timeout)
        deadline, pause = time.monotonic() + wait, 1e-5
        while int(h[PUBLISHED]) - consumed < n:
            channel.check_open(n)
            if time.monotonic() > deadline:
                got = int(h[PUBLISHED]) - consumed
                raise BufferTimeoutError(
                    f"reader {self._path.name}: {got} of {n} items arrived in {wait:g} s (is the "
                    "table empty, and its owner alive?); the request stands for the next sample"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)
        runs = channel.runs(consumed, consumed + n)
        rows = runs[0].copy() if len(runs) == 1 else np.concatenate(runs)
        h[CONSUMED] = consumed + n  # delivered: from here on the rows are this caller's
        flat = {k: as_torch(rows[f"f{i}"], self._spec[k].dtype) for i, k in enumerate(self._keys)}
        flat["index"] = torch.from_numpy(rows["index"])
        return to_tensordict(flat, (n,))

    def close(self) -> None:
        """Detach (rows asked for and not taken go back to the owner's table).
        Threads/processes: the handle's own process; the owner reclaims at its next round."""
        super().close()


class ReaderPool:
    """The owner's side: serves every reader channel from a thread (see the module).

    Args:
        rb: the owning :class:`~xpbank.distributed.shm.ShmReplayBuffer` (held weakly).
        channels: its reader channels (created by it).
    """

    def __init__(self, rb: Any, channels: list[Channel]):
        self._rb = weakref.ref(rb)
        self.channels = channels
        self.keys = list(rb.spec)
        self.returned = [0] * len(channels)  # per channel: rows its readers left, given back
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xpbank-shm-readers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pause = 1e-5
        while not self._stop.is_set():
            rb = self._rb()
            if rb is None:
                return
            try:
                served = rb._serve_readers()
            except ChannelError:
                return  # closed under us
            except Exception:  # never let the thread die silently: log, back off, go on
                log.exception("shm reader pool: serving failed")
                served = 0
            del rb
            pause = 1e-5 if served else min(pause * 2, 1e-3)
            self._stop.wait(pause)

    def serve(self, rb: Any, available: int) -> int:
        """One round (``rb.lock`` held): reclaim gone readers' rows, then answer requests
        with up to ``available`` items in all; returns the rows published."""
        served = 0
        for i, channel in enumerate(self.channels):
            h = channel.header
            attached = int(h[PID]) != 0 and int(h[CLOSED]) == 0
            if not attached or channel.try_lock():  # no reader, or its lock is free: it died
                if channel.locked or channel.try_lock():  # not while a new reader attaches
                    try:
                        self._reclaim(rb, channel, i)
                    finally:
                        channel.unlock()
                continue
            want = int(h[REQUESTED]) - int(h[PUBLISHED])
            room = channel.rows - (int(h[PUBLISHED]) - int(h[CONSUMED]))
            k = min(want, room, available - served)
            if k <= 0:
                continue
            batch = rb.sample(k)
            columns = {f"f{i}": to_numpy(batch.get(key).contiguous()) for i, key in enumerate(self.keys)}
            columns["index"] = to_numpy(batch.get("index"))
            start = int(h[PUBLISHED])
            h[RESERVED] = start + k
            channel.write(start, columns, 0, k)
            h[PUBLISHED] = start + k
            served += k
        return served

    def _reclaim(self, rb: Any, channel: Channel, index: int) -> None:
        """Give a gone reader's unconsumed rows back to the table; reset its counters."""
        h = channel.header
        first, last = int(h[CONSUMED]), int(h[PUBLISHED])
        if last == first and int(h[REQUESTED]) == last and int(h[PID]) == 0:
            return  # nothing to do: a free channel
        if last > first:
            runs = channel.runs(first, last)
            rows = runs[0].copy() if len(runs) == 1 else np.concatenate(runs)
            spec = rb.spec
            rb._give_back({k: as_torch(rows[f"f{i}"], spec[k].dtype) for i, k in enumerate(self.keys)})
            self.returned[index] += last - first
            log.warning(
                "shm reader %s left %d row(s) it had not taken; they went back to the table",
                channel.path.name,
                last - first,
            )
        h[CONSUMED] = h[REQUESTED] = h[RESERVED] = last
        h[PID], h[CLOSED] = 0, 0  # free for a new reader

    def delivered(self) -> list[int]:
        """Rows each reader channel's readers have taken (returned by their ``sample``), in all."""
        return [int(c.header[CONSUMED]) - r for c, r in zip(self.channels, self.returned, strict=True)]

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
