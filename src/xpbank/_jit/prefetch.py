"""A memory prefetch hint for xpbank's compiled kernels: ``prefetch(address)``.

A kernel that reads scattered rows (n-step sampling: each item's row, its window's
rewards and links, the last row's next fields) waits on one cache miss after another
when it reads them in order. Asking for the lines of the items a few iterations ahead
keeps many misses in flight, which is what NumPy's ``take`` gets from the hardware for
free on whole rows.

In plain Python :func:`prefetch` does nothing (kernels stay runnable, and testable,
without numba). :func:`register` teaches numba to compile it to LLVM's
``llvm.prefetch`` (read, keep in all cache levels): one ``prefetcht0`` instruction,
which never faults, so any address may be passed. Call it before compiling a kernel
that uses it; it needs numba, and runs once.

Example:
    >>> import numpy as np
    >>> from xpbank._jit.prefetch import prefetch
    >>> a = np.zeros(4)
    >>> prefetch(a.ctypes.data)  # a hint: no effect on results, in Python or compiled
"""

from __future__ import annotations

from typing import Any

__all__ = ["prefetch", "prefetch_l2", "prefetch_once", "register"]

_registered: list[bool] = []


def prefetch(address: Any) -> None:
    """Hint that the cache line holding byte ``address`` (an int) is read soon (no-op in Python)."""


def prefetch_once(address: Any) -> None:
    """:func:`prefetch` for a line read once: non-temporal (``prefetchnta``), so it displaces
    little of what the caller keeps in the outer caches (no-op in Python)."""


def prefetch_l2(address: Any) -> None:
    """:func:`prefetch` into the L2 and outer caches only (``prefetcht1``): for lines read
    many iterations later. The L1's few fill buffers are not held for the whole miss, so
    more misses overlap: ~2 µs less of ~17 for a hindsight sample's scattered records and
    goal rows (:mod:`xpbank.her.records`; no-op in Python)."""


def register(numba: Any) -> None:
    """Make :func:`prefetch` compile to ``llvm.prefetch`` inside numba kernels (once)."""
    if _registered:
        return
    from llvmlite import ir  # type: ignore[import-untyped, unused-ignore]
    from numba.core import cgutils  # type: ignore[import-untyped, unused-ignore]
    from numba.extending import intrinsic, overload  # type: ignore[import-untyped, unused-ignore]

    def hint(locality: int) -> Any:
        @intrinsic
        def _hint(typingctx: Any, address: Any) -> Any:
            def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
                i8p, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
                fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
                fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
                ptr = builder.inttoptr(args[0], i8p)
                # read (0), locality (3: keep in every level, 2: L2 and out, 0: non-temporal), data (1)
                builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])
                return context.get_dummy_value()

            return numba.types.void(numba.types.int64), codegen

        return _hint

    def typed(_hint: Any) -> Any:
        def typing(address: Any) -> Any:
            def impl(address: Any) -> Any:  # the same signature as the typing one, as numba asks
                return _hint(address)  # numba passes typingctx

            return impl

        return typing

    overload(prefetch)(typed(hint(3)))
    overload(prefetch_once)(typed(hint(0)))
    overload(prefetch_l2)(typed(hint(2)))

    _registered.append(True)
