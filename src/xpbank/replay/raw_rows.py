"""A batch of plain CPU torch tensors copied into the packed rows in one compiled call:
the write fast path's torch ``extend`` and ``add`` (:mod:`xpbank.replay.fast_write`).

Where every field of a signature is a torch tensor, the fast path's per-field cost is
the tensor's conversion (``numpy()``, ~0.55 µs, or ``tolist()``, ~0.2 µs) and then a
NumPy store into a strided column of the rows (~0.3 µs). A tensor that is dense in
memory needs neither: its bytes are the values to store, in order. :func:`pointers`
checks each field in Python (type, dtype, CPU, shape, contiguous, no negative bit;
a conjugate bit only exists for complex dtypes, which the fast path never stores; a
layout other than strided fails ``shape`` or ``data_ptr()``) and takes its
``data_ptr()``; one compiled call (:func:`copy_rows`) then copies every field's bytes
into its columns of the rows (aligned 8- or 4-byte words where it can). One ``[8]``
env step of six fields: the whole ``extend`` ~4.5 µs instead of ~8.2 µs
(``benchmarks/ab_small_writes.py``); the checks are most of what is left (~0.45 µs a
field: each torch attribute read is ~40-80 ns). An ``add`` of one transition is one row
(each tensor without the batch dim): six 0-d / 1-d fields, ~4.9 µs through ``tolist()``
and a record store, ~4 µs here. A field of one value skips ``is_contiguous()`` (a strided
tensor of one value always is), and a 0-d one reads ``dim()`` instead of ``shape``.

The kernel refuses, before it writes a byte, a null pointer (a tensor without storage)
and a source that overlaps the block (a view of the buffer's own rows: NumPy's store
copies such a source first, this copy would not). The caller then hands the batch to the
full path. A tensor that fails a check (non-contiguous, an offset view is fine, an
expanded or negative-bit view is not) sends the batch to the fast path's other readers.
Without numba (or with ``XPBANK_NO_NUMBA=1``) :func:`plan` says no and that path runs.

The bytes stored are those the full path stores: both copy the tensor's values in its
dtype, unchanged (a tensor that requires grad included: the full path stores its
``detach()``).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
import torch

from xpbank import _jit

__all__ = ["copy_rows", "plan", "pointers"]

log = logging.getLogger(__name__)


def _bytes(addr: int) -> Any:  # pragma: no cover - replaced by numba intrinsics
    """The memory at ``addr`` as a pointer to bytes (compiled code only)."""
    raise NotImplementedError("compiled code only")


def _words(addr: int) -> Any:  # pragma: no cover
    """The memory at ``addr`` as a pointer to 8-byte words (compiled code only)."""
    raise NotImplementedError("compiled code only")


def _halfwords(addr: int) -> Any:  # pragma: no cover
    """The memory at ``addr`` as a pointer to 4-byte words (compiled code only)."""
    raise NotImplementedError("compiled code only")


def copy_rows(layout: np.ndarray, slot: int, n: int, ptrs: tuple[int, ...]) -> bool:
    """Copy ``n`` rows of each field ``j`` from ``ptrs[j]`` (its ``[n, *shape]``
    C-contiguous bytes) into rows ``slot .. slot + n - 1`` of the block at bytes
    ``layout[j, 0] .. + layout[j, 1]`` of each row. ``layout``'s last two rows: the
    block's address and row bytes, its capacity (the block is an argument only as
    numbers: one array less to unbox, ~0.1 µs). Where every address and size is a
    multiple of 8 (or 4) the copy moves aligned words, else bytes. False, with nothing
    written, where a pointer is null or a source overlaps the block."""
    k = layout.shape[0] - 2
    lo = layout[k, 0]
    row_bytes = layout[k, 1]
    hi = lo + layout[k + 1, 0] * row_bytes
    for j in range(k):
        p = ptrs[j]
        if p == 0 or (p < hi and p + n * layout[j, 1] > lo):
            return False
    for j in range(k):
        p = ptrs[j]
        size = layout[j, 1]
        dst = lo + slot * row_bytes + layout[j, 0]
        every = size | p | dst | row_bytes
        if every & 7 == 0:
            w = size >> 3
            s8 = _words(p)
            for r in range(n):
                d8 = _words(dst + r * row_bytes)
                for b in range(w):
                    d8[b] = s8[r * w + b]
        elif every & 3 == 0:
            w = size >> 2
            s4 = _halfwords(p)
            for r in range(n):
                d4 = _halfwords(dst + r * row_bytes)
                for b in range(w):
                    d4[b] = s4[r * w + b]
        else:
            s1 = _bytes(p)
            for r in range(n):
                d1 = _bytes(dst + r * row_bytes)
                for b in range(size):
                    d1[b] = s1[r * size + b]
    return True


def _compile() -> Any:
    global _bytes, _words, _halfwords
    ptrs = _jit.pointers("uint8", "uint64", "uint32")
    if ptrs is None:
        return None
    _bytes, _words, _halfwords = ptrs  # the kernel's globals, resolved when it compiles
    kernels = _jit.compile_kernels(copy_rows)
    return None if kernels is None else kernels[0]


_kernel = _compile()


def plan(
    block: Any, entries: list[tuple[Any, ...]], n: int, tensor_kinds: tuple[int, ...]
) -> tuple[Any, ...] | None:
    """What :func:`pointers` and the copy take for a signature of ``n`` rows (an
    ``extend``) whose ``entries`` are all torch tensors (kinds in ``tensor_kinds``), or
    ``None``: no numba or a field of another kind. ``n == 0``: an ``add`` (one row, each
    tensor without the batch dim)."""
    data = block.np_data  # the block (kept by the signature) keeps its address valid
    if _kernel is None or data is None or any(e[1] not in tensor_kinds for e in entries):
        return None
    if data.ndim != 2 or data.dtype != np.uint8 or not data.flags.c_contiguous:
        return None  # the copy addresses rows as base + row * row_bytes
    members = {m.key: m for m in block.members}
    rows = [[members[e[0]].start, members[e[0]].nbytes] for e in entries]
    rows += [[data.ctypes.data, data.shape[1]], [data.shape[0], 0]]
    layout = np.array(rows, dtype=np.int64)
    # a tensor of one value is contiguous wherever it is strided: no is_contiguous() (~50 ns)
    checks = [(e[0], e[2], e[3], math.prod(e[3]) <= 1) for e in entries]
    from numba import typeof  # type: ignore[import-untyped, unused-ignore]

    args = (layout, 0, 0, tuple(0 for _ in entries))
    kernel: Any = _kernel
    try:  # the compiled function for these types: no type dispatch per call
        call = kernel.compile(tuple(typeof(x) for x in args))
    except Exception:  # not compiled: the fast path's other readers take the tensors
        log.debug("raw_rows: no compiled copy for %s", args[:2], exc_info=True)
        return None
    return call, layout, checks


def pointers(checks: list[tuple[Any, ...]], src: Any) -> tuple[int, ...] | None:
    """Each field's ``data_ptr()`` where every value of ``src`` (the batch's own dict)
    is a dense CPU tensor of the signature's dtype and shape, else ``None``."""
    out = []
    get = src.get
    tensor = torch.Tensor
    for key, want, shape, one in checks:
        v = get(key)
        if type(v) is not tensor or v.dtype is not want or not v.is_cpu:
            return None
        # no layout check (~40 ns a field): a strided nested tensor's shape raises (and
        # it has 2+ dims), data_ptr() of every other layout raises (sparse, mkldnn; a
        # jagged nested tensor is a subclass); tests/test_fast_write_raw*.py check each
        try:
            if one:  # one value (an add's 0-d field: dim(), ~30 ns less than shape)
                if (v.shape != shape if shape else v.dim()) or v.is_neg():
                    return None
            elif v.shape != shape or not v.is_contiguous() or v.is_neg():
                return None
            out.append(v.data_ptr())
        except (RuntimeError, TypeError, NotImplementedError):
            return None
    return tuple(out)
