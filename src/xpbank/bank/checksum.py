"""Checksums of bank files: xxh3-64 (with the ``xxhash`` package) or CRC-32 (stdlib).

A checksum covers the data bytes of a ``.npy`` file (after its header) for ``bytes``
bytes: the counted rows. New banks use ``xxh3_64`` when ``xxhash`` is installed
(the ``bank`` extra; measured ~8 GB/s here against ~2-3 GB/s for
``zlib.crc32``, which is as slow as the disk and so would halve save and load), else
``crc32``. Both are read; each is computed in chunks, overlapped with the file I/O.

Example:
    >>> h = hasher_for("crc32")
    >>> h.update(b"hello")
    >>> h.value()
    907060870
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import zlib
from collections.abc import Iterator
from typing import Any, BinaryIO

import numpy as np

from xpbank.bank.manifest_check import ALGORITHMS
from xpbank.errors import CorruptBankError, require

__all__ = [
    "ALGORITHMS",
    "ChecksumWriter",
    "ChunkReader",
    "checksum_entry",
    "checksum_file",
    "covered_bytes",
    "hasher_for",
    "new_hasher",
]

CHUNK_BYTES = 16 << 20  # checksums and copies go chunk by chunk, never a whole file at once


class _Crc32:
    name = "crc32"

    def __init__(self) -> None:
        self._crc = 0

    def update(self, data: Any) -> None:
        self._crc = zlib.crc32(data, self._crc)

    def value(self) -> int:
        return self._crc


class _Xxh3:
    name = "xxh3_64"

    def __init__(self, xxhash: Any) -> None:
        self._h = xxhash.xxh3_64()

    def update(self, data: Any) -> None:
        self._h.update(data)

    def value(self) -> int:
        return int(self._h.intdigest())


class _NoHash:
    name = "none"

    def update(self, data: Any) -> None:
        pass

    def value(self) -> int:
        return 0


def hasher_for(algorithm: str | None) -> Any:
    """A fresh hasher (``update(bytes)``, ``value() -> int``) for ``algorithm``
    (``None``: one that hashes nothing, for unchecked reads).

    Raises:
        MissingExtraError: ``xxh3_64`` and the ``xxhash`` package is not installed.
    """
    if algorithm is None:
        return _NoHash()
    if algorithm == "crc32":
        return _Crc32()
    return _Xxh3(require("xxhash", "bank"))


def new_hasher() -> Any:
    """The hasher new banks use: ``xxh3_64`` where ``xxhash`` imports, else ``crc32``."""
    try:
        import xxhash
    except ImportError:
        return _Crc32()
    return _Xxh3(xxhash)


def covered_bytes(shape: tuple[int, ...], itemsize: int, size: int) -> int:
    """The bytes a data file's checksum covers: rows ``0 .. size-1`` (``size`` from the
    manifest's ring) of a ``[capacity, *field_shape]`` array of ``itemsize``-byte items.

    The one rule every reader applies (``load``, ``open_bank(verify=True)``, ``xpbank
    verify``). It is derived from the ring and the file's shape, never from the checksum
    entry: an entry whose ``bytes`` differs is a mismatch, not a smaller range to check.
    (A state file's checksum covers its whole array.)

    Example:
        >>> covered_bytes((10, 3), 4, 6)
        72
    """
    return size * int(np.prod(shape[1:], dtype=np.int64)) * itemsize


def checksum_entry(algorithm: str, value: int, nbytes: int) -> dict[str, Any]:
    """The manifest form of a checksum of the first ``nbytes`` data bytes of a file."""
    return {"algorithm": algorithm, "bytes": nbytes, "value": value}


class ChunkReader:
    """The next ``nbytes`` of ``f`` as chunks of ``chunk_bytes`` (the last may be
    shorter), read and hashed one chunk ahead by a helper thread (file reads and both
    hashes release the GIL). Iterate it, then :meth:`value` is the checksum.

    A chunk is a NumPy ``uint8`` array that is reused two chunks later: copy it out
    before then. Always :meth:`close` it (or use it in a ``with`` block).

    Raises:
        CorruptBankError: (while iterating) the file ends before ``nbytes``.
        MissingExtraError: ``xxh3_64`` without the ``xxhash`` package.
    """

    def __init__(self, f: BinaryIO, nbytes: int, algorithm: str | None, chunk_bytes: int = CHUNK_BYTES):
        self._hasher = hasher_for(algorithm)
        self._f, self._nbytes = f, nbytes
        # np.empty: a bytearray would zero-fill 3 x 16 MB per file (measured: a third of a load)
        self._buffers = [np.empty(max(1, min(chunk_bytes, nbytes)), np.uint8) for _ in range(3)]
        self._full: queue.Queue[tuple[np.ndarray | None, BaseException | None]] = queue.Queue(maxsize=1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        left, i, size = self._nbytes, 0, len(self._buffers[0])
        try:
            while left > 0 and not self._stop.is_set():
                want = min(left, size)
                chunk = self._buffers[i % 3][:want]  # 3 buffers: one read, one queued, one in use
                view, got = chunk.data, 0
                while got < want:
                    n = self._f.readinto(view[got:])  # type: ignore[attr-defined]
                    if not n:
                        name = getattr(self._f, "name", "file")
                        raise CorruptBankError(f"{name}: ends {left - got} bytes early")
                    got += n
                self._hasher.update(view)
                self._full.put((chunk, None))
                left, i = left - want, i + 1
            self._full.put((None, None))
        except BaseException as exc:  # handed to the consumer
            self._full.put((None, exc))

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            chunk, error = self._full.get()
            if error is not None:
                raise error
            if chunk is None:
                return
            yield chunk

    def value(self) -> int:
        return int(self._hasher.value())

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._full.get(timeout=0.01)
        self._thread.join()

    def __enter__(self) -> ChunkReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def checksum_file(
    f: BinaryIO, nbytes: int, algorithm: str | None, into: Any = None, chunk_bytes: int = CHUNK_BYTES
) -> int:
    """The ``algorithm`` checksum of the next ``nbytes`` bytes of ``f``, read in chunks;
    ``into(offset, chunk)`` gets each chunk (see :class:`ChunkReader`)."""
    done = 0
    with ChunkReader(f, nbytes, algorithm, chunk_bytes) as reader:
        for chunk in reader:
            if into is not None:
                into(done, chunk)
            done += len(chunk)
        return reader.value()


class ChecksumWriter:
    """Write chunks to a file in a helper thread while the caller checksums the next.

    ``write(array)`` queues a contiguous NumPy array (not modified until written:
    pass a fresh one per call) and folds it into the checksum (:meth:`entry`). ``close()`` waits for the
    writes, fsyncs and closes the file, re-raising a write error (e.g. ``ENOSPC``).
    """

    def __init__(self, f: BinaryIO):
        self.f = f
        self.hasher = new_hasher()
        self.nbytes = 0
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=2)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self.f.write(item.data.cast("B"))
                except BaseException as exc:  # re-raised by write()/close()
                    self._error = exc

    def write(self, array: np.ndarray) -> None:
        if self._error is not None:
            self.close()
        data = np.ascontiguousarray(array)
        self._queue.put(data)
        self.hasher.update(data.data.cast("B"))
        self.nbytes += data.nbytes

    def entry(self) -> dict[str, Any]:
        """The manifest's checksum entry for everything written."""
        return checksum_entry(self.hasher.name, self.hasher.value(), self.nbytes)

    def close(self, sync: bool = True) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        try:
            if self._error is None:
                self.f.flush()
                if sync:
                    os.fsync(self.f.fileno())
        finally:
            self.f.close()
        if self._error is not None:
            raise self._error
