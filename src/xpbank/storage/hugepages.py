"""Transparent huge pages for large host blocks: advice to the kernel, nothing more.

A sample reads rows scattered over a whole storage block. Past a few MB, with 4 KB
pages, each row costs a TLB miss (a page-table walk) besides its cache miss; with 2 MB
pages the TLB covers the block. Measured (``benchmarks/bench_sequence.py`` rows, 2M
items, 416 MB block, B=32 windows of 80 steps): 350 -> 308 us CPU per sample, where
10k items (a 2 MB block) do not change. Pages are still only mapped when first written,
2 MB at a time. Where ``madvise`` or huge pages are missing nothing happens.

Example:
    >>> import torch
    >>> block = torch.empty(8 << 20, dtype=torch.uint8)
    >>> advise_huge_pages(block) in (True, False)  # False where the system says no
    True
    >>> advise_huge_pages(torch.empty(16))  # small blocks are left alone
    False
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Any

import torch

__all__ = ["advise_huge_pages", "madvise_function", "MADV_HUGEPAGE"]

MADV_HUGEPAGE = 14
_MIN_BYTES = 4 << 20  # smaller blocks fit the TLB's reach with 4 KB pages


@functools.cache
def madvise_function() -> Any | None:
    """libc's ``madvise(addr, length, advice)`` through ctypes, or ``None`` where missing."""
    if not hasattr(os, "sysconf"):
        return None
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for huge pages over a CPU tensor's memory (4 MB or more, not yet written).

    Returns whether the advice was given and accepted. Only whole pages inside the
    tensor's memory are advised.
    """
    nbytes = tensor.numel() * tensor.element_size()
    madvise = madvise_function()
    if tensor.device.type != "cpu" or nbytes < _MIN_BYTES or madvise is None:
        return False
    page = os.sysconf("SC_PAGE_SIZE")
    start = -(-tensor.data_ptr() // page) * page
    end = tensor.data_ptr() + nbytes
    return bool(madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0)
