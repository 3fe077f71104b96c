"""The one switch for xpbank's optional compiled kernels (numba, the ``fast`` extra).

Kernels are plain Python functions over NumPy arrays (their NumPy twins stay the
reference); :func:`compile_kernels` compiles them with ``numba.njit(cache=True,
nogil=True)``, or returns ``None`` where numba is missing or the environment variable
``XPBANK_NO_NUMBA`` was set to anything but ``""``/``"0"`` when this module was imported.
Callers then take their NumPy path.

Numba's disk cache is keyed on each kernel's own source file only: after editing a module
a kernel calls into (:mod:`xpbank._jit.prefetch`, a helper kept elsewhere), delete
``src/xpbank/**/__pycache__/*.nb[ic]``, or the kernel keeps running the old code.

Example:
    >>> import numpy as np
    >>> from xpbank import _jit
    >>> from xpbank.sampler.sumtree_numba import prefix  # a kernel's source: plain Python
    >>> kernels = _jit.compile_kernels(prefix)
    >>> (prefix if kernels is None else kernels[0])(np.array([1.0, 2.0])).tolist()
    [0.0, 1.0, 3.0]
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from xpbank.errors import install_hint

__all__ = ["ENABLED", "compile_kernels", "compiled_only", "pointers", "streaming"]

log = logging.getLogger(__name__)

#: False when ``XPBANK_NO_NUMBA`` was set (to anything but ``""`` or ``"0"``) at import.
ENABLED = os.environ.get("XPBANK_NO_NUMBA", "") in ("", "0")


def compile_kernels(
    *fns: Callable[..., Any],
    helpers: tuple[Callable[..., Any], ...] = (),
    inline: tuple[Callable[..., Any], ...] = (),
) -> tuple[Callable[..., Any], ...] | None:
    """``fns`` compiled (lazily, on first call; cached on disk), or ``None`` without numba.

    ``helpers``: plain functions the kernels call, compiled into them where called (they
    stay plain Python functions; keep them in the kernels' own module, whose source
    numba's disk cache checks). :func:`xpbank._jit.prefetch.prefetch` is always available
    to kernels (registered here before the first compile). ``inline``: helpers
    inlined by numba where called (``inline="always"``) rather than left to LLVM: a call
    LLVM keeps passes every array by value and counts its references (atomic increments
    and decrements per array per call, ~50-100 ns for a helper taking 9 arrays).
    """
    if not ENABLED:
        return None
    try:
        import numba  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        log.debug("numba is not installed: xpbank runs its NumPy paths (for numba: %s)", install_hint("fast"))
        return None
    from numba.extending import register_jitable  # type: ignore[import-untyped, unused-ignore]

    from xpbank._jit import prefetch as _prefetch

    _prefetch.register(numba)  # any kernel may call prefetch(); registered once
    for helper in helpers:
        register_jitable(inline="always")(helper) if helper in inline else register_jitable(helper)
    jit = numba.njit(cache=True, nogil=True)
    return tuple(jit(fn) for fn in fns)


def compiled_only(*args: Any) -> Any:  # pragma: no cover - never called
    """What a kernel module's pointer and ``numba.carray`` globals hold until its kernels
    compile (it then sets them to :func:`pointers`' intrinsics and ``numba.carray``):
    kernels run compiled only, so a call of it in Python is a bug."""
    raise NotImplementedError("compiled code only")


def pointers(*items: str) -> tuple[Callable[..., Any], ...] | None:
    """For each NumPy scalar type name in ``items`` (``"uint8"``, ``"int64"`` ...), a numba
    intrinsic that takes an address (an int64) and returns it as a pointer to that type,
    to index in compiled code; ``None`` without numba. A kernel that takes addresses
    instead of arrays saves numba's unboxing of each array argument (~60 ns); the caller
    keeps the memory alive and the indices in bounds."""
    if not ENABLED:
        return None
    try:
        from numba import types  # type: ignore[import-untyped, unused-ignore]
        from numba.extending import intrinsic  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None

    def pointer(item: Any) -> Any:
        @intrinsic  # type: ignore[misc, unused-ignore]
        def address(typingctx: Any, addr: Any) -> Any:
            sig = types.CPointer(item)(types.int64)

            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                return builder.inttoptr(args[0], context.get_value_type(types.CPointer(item)))

            return sig, codegen

        return address

    return tuple(pointer(getattr(types, name)) for name in items)


def streaming() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """Two numba intrinsics for writes nothing reads soon: ``store(pointer, index, value)``
    (``pointer[index] = value`` as a non-temporal store, ``movnti`` on x86-64: the line is
    written to memory without being read into the caches first, and evicts nothing) and
    ``fence()`` (a full fence, a locked instruction or ``mfence`` on x86-64, which
    orders those stores before any later memory access; call it once after them);
    ``None`` without numba. A ~28 KB copy into memory out of cache takes ~60% of a
    cached copy's time."""
    if not ENABLED:
        return None
    try:
        from llvmlite import ir  # type: ignore[import-untyped, unused-ignore]
        from numba import types  # type: ignore[import-untyped, unused-ignore]
        from numba.extending import intrinsic  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return None

    @intrinsic  # type: ignore[misc, unused-ignore]
    def store(typingctx: Any, pointer: Any, index: Any, value: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            ptr, i, v = args
            at = builder.gep(ptr, [i])
            inst = builder.store(context.cast(builder, v, signature.args[2], pointer.dtype), at)
            inst.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)]))
            return context.get_dummy_value()

        return types.void(pointer, index, value), codegen

    @intrinsic  # type: ignore[misc, unused-ignore]
    def fence(typingctx: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            builder.fence("seq_cst")  # mfence on x86-64: orders every store before it, streamed too
            return context.get_dummy_value()

        return types.void(), codegen

    return store, fence
