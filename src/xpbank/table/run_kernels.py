"""Compiled kernels for :mod:`xpbank.table.runs` (numba, the ``fast`` extra): a queue's
run of slots entered and taken in one loop each, instead of ~15 NumPy calls of a few
hundred elements (each ~1-2 µs of call overhead on cold slices of the slots' arrays).

Each kernel does what the NumPy path of :mod:`xpbank.table.runs` does to the arrays,
element by element, in the same order of effects; the callers keep the counters.
Without numba (or with ``XPBANK_NO_NUMBA`` set) :func:`load` returns ``None`` and the
NumPy path runs; the tests compare the two through the buffer's fast and full paths.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from xpbank import _jit

__all__ = ["enter_run", "load", "take_run"]


def enter_run(
    ids: np.ndarray,
    live: np.ndarray,
    seq: np.ndarray,
    stamp: np.ndarray,
    times: np.ndarray,
    priority: np.ndarray,
    version: np.ndarray,
    log_slots: np.ndarray,
    log_seqs: np.ndarray,
    start: int,
    n: int,
    capacity: int,
    inserted: int,
    stamps: int,
    default_priority: float,
    writer_version: int,
    tail: int,
) -> int:
    """Enter the free slots ``start .. start + n - 1`` as new items (``TableRing.insert_run``,
    then ``ops.entered`` for a table whose only order is its insertion log, the log's
    room made by the caller); returns the first new id."""
    for i in range(n):
        s = start + i
        ids[s] += capacity
        live[s] = True
        seq[s] = inserted + i
        stamp[s] = stamps + i
        times[s] = 0
        priority[s] = default_priority
        version[s] = writer_version
        log_slots[tail + i] = s
        log_seqs[tail + i] = inserted + i
    return ids[start]


def take_run(
    ids: np.ndarray,
    live: np.ndarray,
    seq: np.ndarray,
    times: np.ndarray,
    log_seqs: np.ndarray,
    start: int,
    b: int,
    head: int,
    out: np.ndarray,
) -> bool:
    """If slot ``start + i`` holds the live item of log entry ``head + i`` for every
    ``i < b``: mark them sampled once and free (``runs.take_run``'s checks and
    removal), their ids into ``out``, and return ``True``; else change nothing."""
    for i in range(b):
        s = start + i
        if not live[s] or seq[s] != log_seqs[head + i]:
            return False
    for i in range(b):
        s = start + i
        times[s] = 1
        live[s] = False
        out[i] = ids[s]
    return True


_KERNELS: SimpleNamespace | None = None
_LOADED = False


def load() -> SimpleNamespace | None:
    """The compiled kernels (compiled on first use), or ``None`` without numba."""
    global _KERNELS, _LOADED
    if not _LOADED:
        fns = _jit.compile_kernels(enter_run, take_run)
        _KERNELS = None if fns is None else SimpleNamespace(enter_run=fns[0], take_run=fns[1])
        _LOADED = True
    return _KERNELS
