"""Fresh host memory about to be filled by a load: huge pages, faulted in ahead.

First touch of fresh memory costs a page fault per page, taken by whoever writes
first. Profiled on a 1 GB load (``load`` in a fresh process): the copies into the new
storage spent ~1.4 s of ~2 s in those faults, the read-ahead threads left the second
core mostly idle. :func:`prefault` asks for transparent huge pages and faults the
region in from a helper thread (``MADV_POPULATE_WRITE``, Linux 5.14+), ahead of the
copies, so the faults overlap the reads instead of stalling the copy loop. Only
advice: where the system lacks ``madvise`` it does nothing, and the copies then take
the faults themselves. The contents are not changed (the memory is fresh either way).

Measured again later (fresh processes, ``benchmarks/bench_bank.py --faults``): touching
1 GB of new memory took 0.10-0.39 s in one hour and 0.57 s (1.12 s with
``MADV_HUGEPAGE``) in another, so the cost depends on the VM's state. Interleaved A/B
loads of a 1 GB bank with and without the huge-page advice (medians of 5, loaded
machine): packed 1.53 s / 1.00 s CPU with it, 1.78 s / 1.56 s without.

Example:
    >>> import torch
    >>> from xpbank.storage import TensorStorage
    >>> from xpbank.spec.spec import Spec, Field
    >>> storage = TensorStorage(8192, Spec({"x": Field((256,))}))  # 8 MB
    >>> filler = prefault(storage, storage.spec)  # None where madvise is missing
    >>> if filler is not None:
    ...     filler.join()
    >>> storage.host_view("x").shape
    (8192, 256)
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

from xpbank.storage.hugepages import MADV_HUGEPAGE, madvise_function

__all__ = ["prefault", "Prefault"]

_MADV_POPULATE_WRITE = 23
_STEP = 32 << 20  # populated in steps, in the order the copies go (largest region)
_ALIGN = 2 << 20  # a huge page: a multiple of the page size


class Prefault:
    """The helper thread faulting regions in; :meth:`join` waits for it (idempotent)."""

    def __init__(self, madvise: Any, regions: list[tuple[int, int]]):
        self._madvise, self._regions = madvise, regions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for start, size in _steps(self._regions, _STEP, _ALIGN):
            if self._stop.is_set():
                return
            # an error (EINVAL on an old kernel, ENOMEM) just leaves the faults to the copies
            if self._madvise(ctypes.c_void_p(start), ctypes.c_size_t(size), _MADV_POPULATE_WRITE):
                return

    def join(self) -> None:
        """Stop faulting in (the copies take over) and wait for the thread."""
        self._stop.set()
        self._thread.join()


def _steps(regions: list[tuple[int, int]], step: int, align: int) -> list[tuple[int, int]]:
    """``(start, size)`` pieces of ``regions`` in the order a load fills them: all
    regions advance together (row ``i`` of every field is written at about the same
    time), the largest in pieces of ``step`` bytes, the others in proportion. Pieces
    start at multiples of ``align`` from their region's (page-aligned) start.

    Example:
        >>> _steps([(0, 400), (1000, 1200)], 200, 100)
        [(0, 200), (1000, 100), (200, 200), (1100, 100)]
    """
    longest = max((end - start for start, end in regions), default=0)
    rounds = -(-longest // step)
    out = []
    for r in range(rounds):
        for start, end in regions:
            piece = -(-(end - start) // rounds // align) * align
            lo, hi = start + r * piece, min(end, start + (r + 1) * piece)
            if lo < hi:
                out.append((lo, hi - lo))
    return out


def _regions(storage: Any, spec: Any, page: int) -> list[tuple[int, int]]:
    """The page-aligned host regions holding every field, each once."""
    host_view = getattr(storage, "host_view", None)
    if host_view is None:
        return []
    regions = set()
    for key in spec:
        view = host_view(key)
        if view is None or view.size == 0:
            continue
        start = view.ctypes.data
        regions.add((start - start % page, start + view.strides[0] * view.shape[0]))
    return sorted(regions)


def prefault(storage: Any, spec: Any) -> Prefault | None:
    """Advise huge pages for ``storage``'s host memory and start faulting it in.

    Returns the running :class:`Prefault` (``join()`` it once the copies are done), or
    ``None`` where there is nothing to do (CUDA storage, no ``madvise``).
    """
    madvise = madvise_function()
    if madvise is None:
        return None
    regions = [r for r in _regions(storage, spec, os.sysconf("SC_PAGE_SIZE")) if r[1] - r[0] >= 4 << 20]
    if not regions:
        return None
    for start, end in regions:  # with THP: 2 MB pages, 512x fewer faults (0.9 -> 4 GB/s first touch)
        madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)
    return Prefault(madvise, regions)
