"""A batch of plain CPU torch tensors copied into the packed rows in one compiled call:
the write fast path's torch ``extend`` and ``add`` (:mod:`xpbank.replay.fast_write`).

Where every field of a signature is a torch tensor, the fast path's per-field cost is
the tensor's conversion (``numpy()``, ~0.55 µs, or ``tolist()``, ~0.2 µs) and then a
NumPy store into a strided column of the rows (~0.3 µs). A tensor that is dense in
memory needs neither: its bytes are the values to store, in order. :func:`checker`
makes, once per signature, the function that checks each field in Python (type, dtype,
CPU, shape, contiguous, no negative bit; a conjugate bit only exists for complex dtypes,
which the fast path never stores; a layout other than strided fails ``shape`` or
``data_ptr()``) and takes its ``data_ptr()``; one compiled call (:func:`copy_rows`)
then copies every field's bytes into its columns of the rows (aligned 8- or 4-byte words
where it can). One ``[8]`` env step of six fields: the whole ``extend`` ~4.5 µs instead
of ~8.2 µs (``benchmarks/ab_small_writes.py``); the checks are most of what is left (~0.35 µs a
field: each torch attribute read is ~40-80 ns; ~0.45 µs as a loop over the fields). An
``add`` of one transition is one row (each tensor without the batch dim): six 0-d / 1-d
fields, ~4.9 µs through ``tolist()`` and a record store, ~3.9 µs here (SB3's ``add``:
~3.2 µs in the same process). A field of one value skips ``is_contiguous()`` (a strided
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
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from xpbank import _jit
from xpbank.replay.fast_values import made

__all__ = ["checker", "copy_arrays", "copy_rows", "plan", "plan_arrays"]

log = logging.getLogger(__name__)


# the memory at an address as a pointer to bytes, 8-byte and 4-byte words (set by _compile)
_bytes: Any = _jit.compiled_only
_words: Any = _jit.compiled_only
_halfwords: Any = _jit.compiled_only


def _clear(p: int, nbytes: int, lo: int, hi: int) -> bool:
    """Whether a source of ``nbytes`` at ``p`` may be copied: not null, and not within the
    block's bytes ``lo .. hi`` (NumPy's store copies such a source first; this copy would
    not)."""
    return p != 0 and not (p < hi and p + nbytes > lo)


def _copy_field(p: int, size: int, dst: int, row_bytes: int, n: int) -> None:
    """``n`` rows of ``size`` bytes each, C-contiguous at ``p``, into the rows from
    address ``dst`` (``row_bytes`` apart): aligned 8- or 4-byte words where every
    address and size allows, else bytes."""
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
        if not _clear(ptrs[j], n * layout[j, 1], lo, hi):
            return False
    base = lo + slot * row_bytes
    for j in range(k):
        _copy_field(ptrs[j], layout[j, 1], base + layout[j, 0], row_bytes, n)
    return True


def copy_arrays(layout: np.ndarray, slot: int, n: int, arrays: tuple[np.ndarray, ...]) -> bool:
    """:func:`copy_rows` for NumPy arrays (``arrays[j]``: field ``j``'s ``[n, *shape]``
    values, of its dtype and shape, which the caller checked: numba's unboxing trusts
    both), their addresses read here. False, with nothing written, where an array is
    not C-contiguous, or as :func:`copy_rows`."""
    k = layout.shape[0] - 2
    lo = layout[k, 0]
    row_bytes = layout[k, 1]
    hi = lo + layout[k + 1, 0] * row_bytes
    j = 0
    for a in literal_unroll(arrays):
        if not a.flags.c_contiguous or not _clear(a.ctypes.data, n * layout[j, 1], lo, hi):
            return False
        j += 1  # noqa: SIM113 - numba unrolls no enumerate() of literal_unroll
    base = lo + slot * row_bytes
    j = 0
    for a in literal_unroll(arrays):
        _copy_field(a.ctypes.data, layout[j, 1], base + layout[j, 0], row_bytes, n)
        j += 1  # noqa: SIM113
    return True


def literal_unroll(items: Any) -> Any:  # pragma: no cover - numba's, once compiled
    """A heterogeneous tuple's items, one loop body each (numba's ``literal_unroll``)."""
    return items


def _compile() -> tuple[Any, ...] | None:
    global _bytes, _words, _halfwords, literal_unroll
    ptrs = _jit.pointers("uint8", "uint64", "uint32")
    if ptrs is None:
        return None
    _bytes, _words, _halfwords = ptrs  # the kernels' globals, resolved when they compile
    from numba import literal_unroll as unroll  # type: ignore[import-untyped, unused-ignore]

    literal_unroll = unroll  # type: ignore[assignment]
    # _clear takes only ints: LLVM inlines it anyway (numba's own inlining of it into a
    # literal_unroll loop warns of its IR)
    return _jit.compile_kernels(copy_rows, copy_arrays, helpers=(_clear, _copy_field), inline=(_copy_field,))


_kernels = _compile()
_kernel, _array_kernel = (None, None) if _kernels is None else _kernels


def _layout(block: Any, entries: list[tuple[Any, ...]]) -> np.ndarray | None:
    """The copy's ``layout`` for ``entries`` (each field's start and bytes in a row, then
    the block's address and row bytes, its capacity), or ``None``: the block is not
    one C-contiguous 2-D array of bytes (the copy addresses rows as base + row * row_bytes)."""
    data = block.np_data  # the block (kept by the signature) keeps its address valid
    if data is None or data.ndim != 2 or data.dtype != np.uint8 or not data.flags.c_contiguous:
        return None
    members = {m.key: m for m in block.members}
    rows = [[members[e[0]].start, members[e[0]].nbytes] for e in entries]
    rows += [[data.ctypes.data, data.shape[1]], [data.shape[0], 0]]
    return np.array(rows, dtype=np.int64)


def _compiled(kernel: Any, types: tuple[Any, ...]) -> Any:
    """``kernel``'s compiled function for argument ``types`` (called without numba's type
    dispatch), or ``None``: it does not compile (the caller's other path runs)."""
    try:
        return kernel.compile(types)
    except Exception:
        log.debug("raw_rows: no compiled copy for %s", types, exc_info=True)
        return None


def plan(
    block: Any, entries: list[tuple[Any, ...]], n: int, tensor_kinds: tuple[int, ...]
) -> tuple[Any, ...] | None:
    """What the copy takes (and the :func:`checker` of its pointers) for a signature of ``n`` rows (an
    ``extend``) whose ``entries`` are all torch tensors (kinds in ``tensor_kinds``), or
    ``None``: no numba or a field of another kind. ``n == 0``: an ``add`` (one row, each
    tensor without the batch dim)."""
    if _kernel is None or any(e[1] not in tensor_kinds for e in entries):
        return None
    layout = _layout(block, entries)
    if layout is None:
        return None
    # a tensor of one value is contiguous wherever it is strided: no is_contiguous() (~50 ns)
    check = checker([(e[0], e[2], e[3], math.prod(e[3]) <= 1) for e in entries])
    from numba import typeof  # type: ignore[import-untyped, unused-ignore]

    call = _compiled(_kernel, tuple(typeof(x) for x in (layout, 0, 0, tuple(0 for _ in entries))))
    return None if call is None else (call, layout, check)


def plan_arrays(block: Any, entries: list[tuple[Any, ...]], array_kind: int) -> tuple[Any, ...] | None:
    """``(call, layout)`` for :func:`copy_arrays` where every one of ``entries`` (an
    ``extend``'s) is a NumPy array of the field's dtype (kind ``array_kind``), else
    ``None`` (no numba, another kind, an item size other than 1, 2, 4 or 8). ``call(layout,
    slot, n, arrays)`` takes the arrays as the signature checked them: dtype and shape
    (numba's unboxing trusts both), any strides (a non-C-contiguous one: False)."""
    if _array_kernel is None or any(e[1] != array_kind for e in entries):
        return None
    layout = _layout(block, entries)
    if layout is None:
        return None
    from numba import typeof, types  # type: ignore[import-untyped, unused-ignore]

    # the copy reads only an array's address, shape and strides: each is typed as
    # unsigned words of its item size (float16 has no numba type; fewer compilations)
    words = {1: types.uint8, 2: types.uint16, 4: types.uint32, 8: types.uint64}
    if any(np.dtype(e[2]).itemsize not in words for e in entries):
        return None
    arrays = types.Tuple(tuple(types.Array(words[np.dtype(e[2]).itemsize], len(e[3]), "A") for e in entries))
    call = _compiled(_array_kernel, (typeof(layout), types.int64, types.int64, arrays))
    return None if call is None else (call, layout)


def checker(checks: list[tuple[Any, ...]]) -> Callable[[Any], tuple[int, ...] | None]:
    """``pointers(src)`` for one signature: each field's ``data_ptr()`` where every value of
    ``src`` (the batch's own dict) is a dense CPU tensor of its dtype and shape, else ``None``.

    ``checks`` holds ``(key, dtype, shape, one)`` per field (``one``: a field of one value).
    The checks are written out field by field in one function, made once per signature:
    a loop over the fields cost ~0.1 µs a field more (a tuple unpacked, an append, a
    ``try`` entered each time), a third of an ``add`` of six torch fields. Only names
    appear in the generated text (``k0``, ``d0``, ...); the keys, dtypes and shapes are the
    function's globals, never text, so a key is never code.

    Each field is checked in the order a per-field loop would: type, dtype and CPU first,
    then its shape (a nested tensor's raises), its contiguity, its negative bit; its
    ``data_ptr()`` (raises for a sparse or mkldnn tensor) only after all of them passed.
    """
    names: dict[str, Any] = {"T": torch.Tensor}
    heads, tails, ptrs = [], [], []
    for i, (key, want, shape, one) in enumerate(checks):
        names[f"k{i}"], names[f"d{i}"], names[f"s{i}"] = key, want, shape
        heads.append(f"type(v{i}) is not T or v{i}.dtype is not d{i} or not v{i}.is_cpu")
        if one:  # one value: always contiguous; a 0-d one reads dim() (~30 ns less than shape)
            tails.append(f"v{i}.shape != s{i} or v{i}.is_neg()" if shape else f"v{i}.dim() or v{i}.is_neg()")
        else:
            tails.append(f"v{i}.shape != s{i} or not v{i}.is_contiguous() or v{i}.is_neg()")
        ptrs.append(f"v{i}.data_ptr(), ")
    fetch = "".join(f"    v{i} = get(k{i})\n" for i in range(len(checks)))
    text = (
        "def pointers(src):\n"
        "    get = src.get\n"
        f"{fetch}"
        f"    if {' or '.join(heads) or 'False'}:\n"
        "        return None\n"
        "    try:\n"
        f"        if {' or '.join(tails) or 'False'}:\n"
        "            return None\n"
        f"        return ({''.join(ptrs)})\n"
        "    except (RuntimeError, TypeError, NotImplementedError):\n"
        "        return None\n"
    )
    return made(text, f"<raw_rows.checker of {len(checks)} fields>", "pointers", names)
