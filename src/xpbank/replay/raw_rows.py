"""A batch of plain CPU torch tensors copied into the packed rows in one compiled call:
the write fast path's torch ``extend`` (:mod:`xpbank.replay.fast_write`).

Where every field of a signature is a torch tensor, the fast path's per-field cost is
the tensor's conversion (``numpy()``, ~0.55 µs, or ``tolist()``, ~0.2 µs) and then a
NumPy store into a strided column of the rows (~0.3 µs). A tensor that is dense in
memory needs neither: its bytes are the values to store, in order. :func:`pointers`
checks each field in Python (type, dtype, CPU, strided layout, shape, contiguous, no
negative bit; a conjugate bit only exists for complex dtypes, which the fast path never
stores) and takes its ``data_ptr()``; one compiled call (:func:`copy_rows`) then copies
every field's bytes into its columns of the rows. One ``[8]`` env step of six fields:
~2.7 µs instead of ~5.7 µs (``benchmarks/ab_small_writes.py``).

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
from typing import Any

import numpy as np
import torch

from xpbank import _jit

__all__ = ["copy_rows", "plan", "pointers"]

log = logging.getLogger(__name__)


def _address(addr: int) -> Any:  # pragma: no cover - replaced by a numba intrinsic
    """The byte at ``addr`` as an indexable pointer (compiled code only)."""
    raise NotImplementedError("compiled code only")


def copy_rows(block: np.ndarray, layout: np.ndarray, slot: int, n: int, ptrs: tuple[int, ...]) -> bool:
    """Copy ``n`` rows of each field from ``ptrs`` (its ``[n, *shape]`` C-contiguous
    bytes) into rows ``slot .. slot + n - 1`` of ``block`` (the storage's rows as bytes
    ``[capacity, row_bytes]``) at bytes ``layout[j, 0] .. + layout[j, 1]`` of each row.
    False, with nothing written, where a pointer is null or a source overlaps ``block``."""
    lo = block.ctypes.data
    hi = lo + block.shape[0] * block.shape[1]
    k = layout.shape[0]
    for j in range(k):
        p = ptrs[j]
        if p == 0 or (p < hi and p + n * layout[j, 1] > lo):
            return False
    for j in range(k):
        src = _address(ptrs[j])
        start = layout[j, 0]
        size = layout[j, 1]
        for r in range(n):
            row = slot + r
            at = r * size
            for b in range(size):
                block[row, start + b] = src[at + b]
    return True


def _compile() -> Any:
    global _address
    if not _jit.ENABLED:
        return None
    try:
        from numba import types  # type: ignore[import-untyped, unused-ignore]
        from numba.extending import intrinsic  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None

    @intrinsic  # type: ignore[misc, unused-ignore]
    def address(typingctx: Any, addr: Any) -> Any:
        sig = types.CPointer(types.uint8)(types.int64)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.uint8)))

        return sig, codegen

    _address = address  # type: ignore[assignment]  # the kernel's global, resolved when it compiles
    kernels = _jit.compile_kernels(copy_rows)
    return None if kernels is None else kernels[0]


_kernel = _compile()


def plan(
    block: Any, entries: list[tuple[Any, ...]], n: int, tensor_kinds: tuple[int, ...]
) -> tuple[Any, ...] | None:
    """What :func:`pointers` and the copy take for a signature of ``n`` rows (an
    ``extend``) whose ``entries`` are all torch tensors (kinds in ``tensor_kinds``), or
    ``None``: no numba, an ``add``, or a field of another kind."""
    if _kernel is None or n == 0 or block.np_data is None or any(e[1] not in tensor_kinds for e in entries):
        return None
    members = {m.key: m for m in block.members}
    layout = np.array([[members[e[0]].start, members[e[0]].nbytes] for e in entries], dtype=np.int64)
    checks = [(e[0], e[2], e[3]) for e in entries]
    from numba import typeof  # type: ignore[import-untyped, unused-ignore]

    args = (block.np_data, layout, 0, 0, tuple(0 for _ in entries))
    kernel: Any = _kernel
    try:  # the compiled function for these types: no type dispatch per call
        call = kernel.compile(tuple(typeof(x) for x in args))
    except Exception:  # not compiled: the fast path's other readers take the tensors
        log.debug("raw_rows: no compiled copy for %s", args[:2], exc_info=True)
        return None
    return call, block.np_data, layout, checks


def pointers(checks: list[tuple[Any, ...]], src: Any) -> tuple[int, ...] | None:
    """Each field's ``data_ptr()`` where every value of ``src`` (the batch's own dict)
    is a dense CPU tensor of the signature's dtype and shape, else ``None``."""
    out = []
    get = src.get
    tensor, strided = torch.Tensor, torch.strided
    for key, want, shape in checks:
        v = get(key)
        if type(v) is not tensor or v.dtype is not want or not v.is_cpu or v.layout is not strided:
            return None
        try:  # a nested tensor has no shape (raises)
            if v.shape != shape or not v.is_contiguous() or v.is_neg():
                return None
        except (RuntimeError, TypeError, NotImplementedError):
            return None
        out.append(v.data_ptr())
    return tuple(out)
