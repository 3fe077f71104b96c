"""One writer's channel into a learner: a single-producer ring of rows in shared memory.

A channel is one file in ``/dev/shm`` (a RAM file system; the temp dir elsewhere),
mapped by the writer process and by the learner process:

``[header: 8 int64][rows x record]``, where ``record`` is a NumPy record dtype holding
one item (every field of the spec at a fixed offset).

The header's counters only grow: ``reserved >= published >= consumed``. The protocol:

1. **reserve** (writer): wait until ``rows - (published - consumed)`` slots are free,
   then set ``reserved = published + k``;
2. **write** the ``k`` records at ``published % rows`` (split at the wrap);
3. **publish**: ``published += k``. Only then can the learner see them.

The learner copies out ``[consumed, published)`` and only then sets ``consumed``, so a
writer never writes where the learner reads. A writer killed (even SIGKILL) while it
writes leaves ``reserved > published``: those records are never read, so no torn row
is ever delivered. Each store is one aligned 8-byte write after the data it announces;
x86-64 keeps stores in program order (on weakly ordered CPUs such as ARM a fence would
be needed: not measured here).

Who writes: a writer holds an exclusive ``flock`` on the channel file while attached.
The kernel drops it when the process dies, so "the lock is free but the header names a
writer that never closed" means that writer crashed; whoever sees that first (the
learner, or a new writer taking the channel over) counts the crash and the records it
lost, and the channel is usable again.

Closing: the learner's ``close`` sets ``shut`` (the header's last counter) after its
last pull and before it unmaps. A writer checks it before it reserves, while it waits
for room, and after it publishes, so once the learner has closed every writer call
raises :class:`~xpbank.ChannelError` at once: no row is reported stored that the learner
will never take.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from xpbank.errors import BufferTimeoutError, ChannelError
from xpbank.spec.spec import Spec
from xpbank.storage.dtypes import numpy_dtype

__all__ = [
    "Channel", "RESERVED", "PUBLISHED", "CONSUMED", "PID", "CLOSED", "CRASHES", "LOST", "SHUT", "REQUESTED",
    "record_dtype",
]  # fmt: skip

# CLOSED: the last writer detached cleanly; SHUT: the learner closed the buffer;
# REQUESTED: a reader channel's items asked for (xpbank.distributed.shm_readers)
RESERVED, PUBLISHED, CONSUMED, PID, CLOSED, CRASHES, LOST, SHUT, REQUESTED = range(9)
HEADER_BYTES = 128
# a writer waiting for room sleeps MIN_PAUSE, doubling up to MAX_PAUSE; its next wait
# starts near where the last one ended (a learner that frees room every ~ms, as a full
# queue does, is not polled every 10 us: each wake-up is CPU the learner lacks)
MIN_PAUSE, MAX_PAUSE = 1e-5, 1e-3


def record_dtype(spec: Spec, extra: list[tuple[str, np.dtype]] | None = None) -> np.dtype:
    """One NumPy record per item: field ``i`` of the spec is ``f{i}`` (aligned), then
    ``extra`` scalar columns (a reader channel's ``"index"``)."""
    formats: list[tuple[Any, ...]] = []
    for i, field in enumerate(spec.values()):
        base = numpy_dtype(field.dtype)
        formats.append((f"f{i}", base, field.shape) if field.shape else (f"f{i}", base))
    formats += extra or []
    return np.dtype(formats, align=True)


class Channel:
    """A mapped channel file: ``header`` (int64 counters) and ``records`` (``rows`` items)."""

    def __init__(self, path: Path, record: np.dtype, rows: int, create: bool = False):
        self.path, self.rows = path, rows
        size = HEADER_BYTES + rows * record.itemsize
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o600)
        if create:
            os.ftruncate(self.fd, size)
        elif os.fstat(self.fd).st_size != size:
            os.close(self.fd)
            raise ChannelError(f"channel {path}: expected {size} bytes, found {os.fstat(self.fd).st_size}")
        self.map = mmap.mmap(self.fd, size)
        self.header = np.frombuffer(self.map, dtype=np.int64, count=HEADER_BYTES // 8)
        self.records = np.frombuffer(self.map, dtype=record, count=rows, offset=HEADER_BYTES)
        self.locked = False
        self.pause = MIN_PAUSE  # a writer's first sleep when it waits for room (see reserve)

    # -- ownership ---------------------------------------------------------------
    def try_lock(self) -> bool:
        """Take the channel's writer lock without waiting; ``False`` if a live process holds it."""
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self.locked = True
        return True

    def unlock(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        self.locked = False

    def reap(self) -> bool:
        """With the lock held: count a writer that died without closing; ``True`` if one did."""
        h = self.header
        crashed = bool(h[PID] != 0 and h[CLOSED] == 0)
        if crashed:
            h[LOST] += h[RESERVED] - h[PUBLISHED]
            h[CRASHES] += 1
        h[RESERVED] = h[PUBLISHED]
        h[PID], h[CLOSED] = 0, 0
        return crashed

    def attach_writer(self, timeout: float, role: str = "writer") -> None:
        """Claim the channel for this process (waits up to ``timeout`` s for a learner's check);
        ``role``: ``"writer"`` or ``"reader"`` (a reader channel's consumer), for the message."""
        deadline = time.monotonic() + timeout
        while not self.try_lock():
            if time.monotonic() > deadline:
                raise ChannelError(
                    f"channel {self.path.name}: another live process is attached as this {role}; "
                    f"use one {role} handle per process (rb.{role}(i) with a distinct i)"
                )
            time.sleep(0.001)
        self.reap()
        self.header[PID] = os.getpid()

    def close_writer(self) -> None:
        if self.locked:
            self.header[CLOSED] = 1
            self.header[PID] = 0
            self.unlock()

    # -- the writer's side ---------------------------------------------------------
    def check_open(self, k: int, published: bool = False) -> None:
        """Raise :class:`~xpbank.ChannelError` if the learner has closed the buffer."""
        if self.header[SHUT]:
            fate = "may never be taken" if published else "were not written"
            raise ChannelError(
                f"channel {self.path.name}: the learner closed the buffer; this call's {k} rows {fate}"
            )

    def reserve(self, k: int, timeout: float) -> int:
        """Wait for ``k`` free records; mark them reserved and return the first's position.

        Raises:
            ChannelError: the learner closed the buffer (checked while waiting too).
            BufferTimeoutError: no room for ``timeout`` seconds.
        """
        h, deadline, pause = self.header, None, self.pause
        self.check_open(k)
        if self.rows - (int(h[PUBLISHED]) - int(h[CONSUMED])) >= k:
            self.pause = max(MIN_PAUSE, self.pause / 2)  # room at once: the learner keeps up
        while self.rows - (int(h[PUBLISHED]) - int(h[CONSUMED])) < k:
            self.check_open(k)
            now = time.monotonic()
            deadline = deadline if deadline is not None else now + timeout
            if now > deadline:
                raise BufferTimeoutError(
                    f"channel {self.path.name}: no room for {k} rows after {timeout} s (the learner "
                    f"has not taken the {int(h[PUBLISHED]) - int(h[CONSUMED])} rows waiting; is it "
                    "calling sample() or pull()?)"
                )
            time.sleep(pause)
            pause = min(pause * 2, MAX_PAUSE)
            self.pause = max(MIN_PAUSE, pause / 4)  # the next wait starts near where this one ended
        start = int(h[PUBLISHED])
        h[RESERVED] = start + k
        return start

    def write(self, start: int, columns: dict[str, np.ndarray], lo: int, k: int) -> None:
        """Copy rows ``lo .. lo + k`` of ``columns`` to positions ``start ..`` (wrapping)."""
        for a, b, src in _runs(start, k, self.rows):
            view = self.records[a:b]
            for name, values in columns.items():
                view[name] = values[lo + src : lo + src + (b - a)]

    def publish(self, start: int, k: int) -> None:
        """Make ``k`` written records visible; raise if the learner closed meanwhile."""
        self.header[PUBLISHED] = start + k
        self.check_open(k, published=True)  # after the store: a close before it took them, or we raise

    # -- the learner's side -------------------------------------------------------------
    def waiting(self) -> tuple[int, int]:
        """``(consumed, published)``: the records ready to be taken."""
        return int(self.header[CONSUMED]), int(self.header[PUBLISHED])

    def runs(self, first: int, last: int) -> list[np.ndarray]:
        """Record views of positions ``[first, last)``, split at the wrap (no copies)."""
        return [self.records[a:b] for a, b, _ in _runs(first, last - first, self.rows)]

    def consumed(self, last: int) -> None:
        self.header[CONSUMED] = last

    def shut(self) -> None:
        """Tell writers the learner is gone (their next reserve or publish raises)."""
        self.header[SHUT] = 1

    def close(self) -> None:
        self.header = self.records = None  # type: ignore[assignment]
        with contextlib.suppress(BufferError):  # a view still alive keeps the mapping
            self.map.close()
        os.close(self.fd)

    def __getstate__(self) -> Any:
        raise ChannelError("a Channel is mapped in one process; pass the ShmWriter handle instead")


def _runs(start: int, k: int, rows: int) -> list[tuple[int, int, int]]:
    """``(a, b, offset)``: the contiguous position runs of ``k`` records from ``start``."""
    a = start % rows
    first = min(k, rows - a)
    out = [(a, a + first, 0)]
    if first < k:
        out.append((0, k - first, first))
    return out
