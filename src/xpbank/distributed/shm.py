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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank.distributed.channel import CLOSED, CRASHES, LOST, PID, PUBLISHED, Channel
from xpbank.distributed.pull_lock import PullingLock, weak_take
from xpbank.errors import CapacityError, ChannelError, SpecError, check_positive_int
from xpbank.replay.buffer import ReplayBuffer
from xpbank.spec.batch import flatten
from xpbank.spec.spec import NestedKey, Spec
from xpbank.storage.dtypes import as_torch, numpy_dtype, to_numpy

__all__ = ["ShmReplayBuffer", "ShmWriter", "WriterStatus"]

log = logging.getLogger(__name__)


def record_dtype(spec: Spec) -> np.dtype:
    """One NumPy record per item: field ``i`` of the spec is ``f{i}`` (aligned)."""
    formats = []
    for i, field in enumerate(spec.values()):
        base = numpy_dtype(field.dtype)
        formats.append((f"f{i}", base, field.shape) if field.shape else (f"f{i}", base))
    return np.dtype(formats, align=True)


def _root() -> Path:
    shm = Path("/dev/shm")
    return shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())


@dataclass(frozen=True)
class WriterStatus:
    """What the learner knows of one channel.

    ``state``: ``"free"`` (no writer yet, or the last one closed), ``"attached"`` (a
    live process holds it) or ``"crashed"`` (its writer died without closing; the
    channel is free again). ``crashes`` and ``lost_rows`` count every writer of this
    channel that died and the reserved rows it never published.
    """

    index: int
    state: str
    pid: int
    published: int
    crashes: int
    lost_rows: int


class ShmWriter:
    """A collector process's handle on one channel of a :class:`ShmReplayBuffer`.

    Picklable (it holds the channel's path, spec and size); it maps the channel on
    first use, in the process that uses it. One live process per channel at a time.

    Args:
        timeout: seconds ``extend`` waits for room when the learner falls behind
            before raising :class:`~xpbank.BufferTimeoutError`.
    """

    def __init__(self, path: Path, spec: Spec, rows: int, timeout: float = 60.0):
        self._path, self._spec, self._rows, self.timeout = path, spec, rows, timeout
        self._keys = list(spec)
        self._channel: Channel | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {
            "path": str(self._path),
            "spec": self._spec.to_dict(),
            "rows": self._rows,
            "timeout": self.timeout,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(Path(state["path"]), Spec.from_dict(state["spec"]), state["rows"], state["timeout"])  # type: ignore[misc]

    def _open(self) -> Channel:
        if self._channel is None:
            if not self._path.exists():
                raise ChannelError(f"writer: channel {self._path} is gone (was the buffer closed?)")
            channel = Channel(self._path, record_dtype(self._spec), self._rows)
            channel.attach_writer(timeout=self.timeout)
            self._channel = channel
        return self._channel

    def extend(self, batch: Any) -> int:
        """Check ``batch`` (leading dim = items) against the spec and publish it; returns its rows.

        The whole batch is checked before anything is written. A batch larger than the
        channel is published in channel-sized parts, each part whole.

        Raises:
            SpecError: as :meth:`ReplayBuffer.extend`.
            BufferTimeoutError: no room in the channel for ``timeout`` seconds.
            ChannelError: the learner closed the buffer (at once, every call after its
                ``close``); rows of a part published as it closed may not be taken.
        """
        (n,), flat = self._spec.conform(flatten(batch, self._spec), 1)
        channel = self._open()
        columns = {f"f{i}": to_numpy(flat[k].detach().cpu()) for i, k in enumerate(self._keys)}
        done = 0
        while done < n:
            k = min(n - done, self._rows)
            start = channel.reserve(k, self.timeout)
            channel.write(start, columns, done, k)
            channel.publish(start, k)
            done += k
        return n

    def add(self, item: Any) -> int:
        """Publish one item (no batch dim)."""
        return self.extend({k: torch.as_tensor(v).unsqueeze(0) for k, v in flatten(item).items()})

    def close(self) -> None:
        """Detach (marks a clean exit: the learner will not count a crash)."""
        if self._channel is not None:
            self._channel.close_writer()
            self._channel.close()
            self._channel = None

    def __enter__(self) -> ShmWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class ShmReplayBuffer(ReplayBuffer):
    """A :class:`~xpbank.ReplayBuffer` that collector processes write into through shared memory.

    Args:
        capacity, spec, **options: as :class:`~xpbank.ReplayBuffer` (``spec=None`` lays
            it out at the first local ``extend``; writers need it known).
        num_writers: how many channels (one per collector process).
        channel_rows: rows a channel holds between two pulls; a writer waits (up to its
            timeout) while its channel is full.

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

    def __init__(
        self,
        capacity: int,
        spec: Spec | None = None,
        *,
        num_writers: int,
        channel_rows: int = 65536,
        **options: Any,
    ):
        self._num_writers = check_positive_int("num_writers", num_writers)
        self._channel_rows = check_positive_int("channel_rows", channel_rows)
        super().__init__(capacity, spec, **options)
        self._lock = PullingLock(weak_take(self, "_take"))
        self._channels: list[Channel] = []
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
        moved = 0
        for channel in self._channels:
            first, last = channel.waiting()
            for run in channel.runs(first, last):
                moved += len(super().extend(self._columns(run)))
            if last > first:
                channel.consumed(last)
        if time.monotonic() >= self._next_check:
            self._check_writers()
        return moved

    def _columns(self, run: np.ndarray) -> dict[NestedKey, torch.Tensor]:
        spec = self.spec
        assert spec is not None  # channels exist only once the spec is known
        return {k: as_torch(run[f"f{i}"], spec[k].dtype) for i, k in enumerate(spec)}

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
        with self._lock:  # the outermost acquire pulls
            for channel in self._channels:
                channel.shut()
            self._take()  # rows published before a writer could see the flag
            for channel in self._channels:
                channel.close()
            self._channels = []
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
