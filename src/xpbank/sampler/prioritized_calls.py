"""The prioritized small calls' compiled kernels, called with addresses instead of arrays.

A ``sample(32)`` draw and an update of 32 priorities are each ~0.5 µs of tree work,
and numba's dispatcher cost more than that: it types every argument, and each array is
unboxed (a draw's tuple of levels and six arrays: ~0.95 µs of call for ~0.5 µs of
work). These kernels take only ints and floats: the addresses of the trees' levels and
of the sampler's kept arrays (one int64 context per tree, :class:`TreeCalls`), and of
the batch's own arrays (a tensor's ``data_ptr()``, ~0.1 µs; a NumPy array's
``ctypes.data`` costs ~0.9 µs, so kept arrays' addresses are read once). Each is
compiled for its one signature, which skips the dispatcher's typing (~0.25-0.4 µs a
call). In compiled code an address becomes a pointer (:func:`xpbank._jit.pointers`)
and a level an array over it (``numba.carray``), and the same helpers as
:mod:`~xpbank.sampler.sumtree_numba`'s kernels do the work (``search_top``,
``descend_level``, ``refresh_level``, ``prefix_into``): the same slots, weights' bases,
ids and trees, bit for bit.

- :func:`draw`: a stratified draw (after a write, the top's prefix sums first), the
  weights' bases and the items' ids (:func:`~xpbank.sampler.prioritized_fast.draw_into`);
- :func:`check`: a priority update's ids live and values finite and ``>= 0``, the slots
  and ``p + eps`` written (nothing decided where it says no: the NumPy checks then
  name what is wrong);
- :func:`write`: ``(p + eps) ** alpha`` (raised by NumPy, see
  :func:`~xpbank.sampler.priorities.power`) stored at the slots, their ancestors
  recomputed, and what :class:`~xpbank.sampler.lazymin.LazyMin` needs to know;
- :func:`min_refresh` and :func:`min_rebuild`: a :class:`LazyMin` flush (its min-tree
  brought up to date for pending leaves, or rebuilt), compiled (the NumPy flush of a
  few hundred leaves cost ~100 µs; it runs about once in 60 steps of a DQN loop).

The caller keeps every array alive and every index in bounds; without numba
:func:`load` gives ``None`` and the callers keep their paths. These kernels compile
``sumtree_numba``'s helpers in, and numba's disk cache is keyed on this file's source
only: after editing those helpers, delete ``src/xpbank/**/__pycache__/*.nb[ic]``
(:mod:`xpbank._jit`), or the cached kernels here keep the old code.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank._jit.prefetch import prefetch_l2
from xpbank.sampler import sumtree_numba
from xpbank.sampler.sumtree_numba import descend_level, prefix_into, refresh_level, search_top, write_leaves

__all__ = ["TreeCalls", "check", "draw", "load", "min_rebuild", "min_refresh", "write"]

log = logging.getLogger(__name__)


# the memory at an address as a pointer to float64, float32, int64; numba.carray (set by _compile)
_f64s: Any = _jit.compiled_only
_f32s: Any = _jit.compiled_only
_i64s: Any = _jit.compiled_only
_carray: Any = _jit.compiled_only


def level(c: np.ndarray, j: int) -> np.ndarray:
    """Level ``j`` (0: the leaves) of the tree whose context is ``c``."""
    return _carray(_f64s(c[1 + 2 * j]), (c[2 + 2 * j],))


def min_level(c: np.ndarray, j: int) -> np.ndarray:
    """Level ``j`` of the min-tree (:class:`~xpbank.sampler.lazymin.LazyMin`'s)."""
    k = 2 + 2 * c[0] + 2 * j
    return _carray(_f64s(c[k]), (c[k + 1],))


def context(ctx: int) -> np.ndarray:
    """The int64 context at ``ctx``: ``[depth, (address, length) per level, cums,
    (address, length) per min-tree level]``."""
    depth = _i64s(ctx)[0]
    return _carray(_i64s(ctx), (2 + 4 * depth,))


# -- kernels --------------------------------------------------------------------------
def draw(
    ctx: int,
    draws: int,
    ratios: int,
    rows: int,
    ids: int,
    b: int,
    fresh: int,
    scale: float,
    divisor: float,
    first: int,
    capacity: int,
    records: int,
    row_bytes: int,
) -> None:
    """:func:`~xpbank.sampler.sumtree_numba.draw_fresh` at addresses: ``b`` uniforms at
    ``draws`` (float64), the slots into ``rows`` and ids into ``ids`` (int64), the
    weights' bases ``scale * leaf / divisor`` into ``ratios`` (float64); ``fresh``: the
    top's prefix sums written first.

    Then hints: each drawn item's record (``records``: the address of the storage's
    rows of ``row_bytes``, 0: none) is prefetched into L2 for the read that follows
    (its misses overlap the ~3 µs of Python before it), and so is its min-tree leaf,
    which the usual priority update of the batch writes next."""
    c = context(ctx)
    depth = c[0]
    top = level(c, depth - 1)
    ntop = top.shape[0]
    cums = _carray(_f64s(c[1 + 2 * depth]), (ntop + 1,))
    if fresh:
        prefix_into(top, cums)
    total = cums[ntop]
    u = _carray(_f64s(draws), (b,))
    r = _carray(_f64s(ratios), (b,))
    out = _carray(_i64s(rows), (b,))
    for i in range(b):
        r[i] = ((i + u[i]) / b) * total
    search_top(top, cums, r, out)
    for j in range(depth - 2, -1, -1):
        descend_level(level(c, j), r, out)
    leaves = level(c, 0)
    for i in range(b):
        r[i] = (scale * leaves[out[i]]) / divisor
    idv = _carray(_i64s(ids), (b,))
    offset = first % capacity  # the oldest item's slot
    for i in range(b):
        d = out[i] - offset  # (out[i] - offset) % capacity, without a division per item
        idv[i] = first + (d + capacity if d < 0 else d)
    low = c[2 + 2 * depth]  # the min-tree's leaves
    for i in range(b):
        prefetch_l2(low + out[i] * 8)
        if records != 0:
            at = records + out[i] * row_bytes
            prefetch_l2(at)
            prefetch_l2(at + row_bytes - 1)


def check(
    ids: int,
    values: int,
    single: int,
    n: int,
    first: int,
    stop: int,
    capacity: int,
    eps: float,
    slots: int,
    shifted: int,
) -> bool:
    """:func:`~xpbank.sampler.sumtree_numba.live_priorities` at addresses: ``n`` int64
    ids and values (float32 where ``single``, else float64); the slots and ``p + eps``
    written to ``slots`` / ``shifted`` where every id is live and every value finite and
    ``>= 0`` (``False``: stop, nothing decided)."""
    idp = _i64s(ids)
    vf = _f32s(values)
    vd = _f64s(values)
    sp = _i64s(slots)
    hp = _f64s(shifted)
    offset = first % capacity  # the oldest item's slot
    for k in range(n):
        i = idp[k]
        v = np.float64(vf[k]) if single else vd[k]
        if not (i >= first and i < stop and v >= 0 and v < math.inf):  # NaN fails too
            return False
        d = i - first + offset  # i % capacity (live ids span at most capacity), no division
        sp[k] = d - capacity if d >= capacity else d
        hp[k] = v + eps
    return True


def write(
    ctx: int, slots: int, shifted: int, stored: int, n: int, smallest: float, in_sync: int
) -> tuple[float, float, bool, float]:
    """:func:`~xpbank.sampler.sumtree_numba.update` at addresses: ``stored`` at the ``n``
    leaves ``slots``, their ancestors recomputed, and the min-tree's leaves there (0 as
    ``inf``) and their ancestors too (:meth:`LazyMin.kept_up
    <xpbank.sampler.lazymin.LazyMin.kept_up>`: ~32 minima of 16 per level, where a
    lazy flush of the leaves gathered over ~50 updates cost ~40-90 µs). Returns
    ``(largest of shifted, the smallest positive leaf written, whether a written leaf
    held smallest before, the minimum)``: the minimum is read off the min-tree's top
    where ``in_sync`` (no other leaf pending) and ``hit`` (the old minimum's leaf may have
    been raised), else ``nan``."""
    c = context(ctx)
    depth = c[0]
    leaves = level(c, 0)
    low_leaves = min_level(c, 0)
    sl = _carray(_i64s(slots), (n,))
    sh = _carray(_f64s(shifted), (n,))
    st = _carray(_f64s(stored), (n,))
    largest, hit = write_leaves(leaves, sl, sh, st, smallest)
    shift = 0
    for j in range(1, depth):
        shift += 4
        refresh_level(level(c, j - 1), level(c, j), shift, sl)
    low = math.inf
    for k in range(n):
        x = leaves[sl[k]]
        low_leaves[sl[k]] = x if x > 0 else math.inf
        if x > 0 and x < low:
            low = x
    shift = 0
    for j in range(1, depth):
        shift += 4
        min_refresh_level(min_level(c, j - 1), min_level(c, j), shift, sl)
    exact = math.nan
    if in_sync and hit and low > smallest:
        exact = smallest_of(min_level(c, depth - 1))
    return largest, low, hit, exact


def min_refresh_level(child: np.ndarray, parent: np.ndarray, shift: int, slots: np.ndarray) -> None:
    """Recompute the nodes of the min-tree level ``parent`` above leaves ``slots``
    (``2 ** shift``: leaves per node) as the minimum of their 16 children in ``child``."""
    for k in range(slots.shape[0]):
        p = slots[k] >> shift  # slots >= 0: their // 16**j, without a division
        parent[p] = smallest_of_16(child, p * 16)


def smallest_of(x: np.ndarray) -> float:
    """The smallest of ``x`` (no NaN there; ``inf`` if empty), in four running minima (a
    1M-leaf tree's top is 4,096 nodes: one chain of minima would be 4,096 steps long)."""
    m0 = m1 = m2 = m3 = math.inf
    n = x.shape[0]
    i = 0
    while i + 4 <= n:
        m0 = x[i] if x[i] < m0 else m0
        m1 = x[i + 1] if x[i + 1] < m1 else m1
        m2 = x[i + 2] if x[i + 2] < m2 else m2
        m3 = x[i + 3] if x[i + 3] < m3 else m3
        i += 4
    while i < n:
        m0 = x[i] if x[i] < m0 else m0
        i += 1
    m0 = m0 if m0 < m1 else m1
    m2 = m2 if m2 < m3 else m3
    return m0 if m0 < m2 else m2


def smallest_of_16(x: np.ndarray, at: int) -> float:
    """The smallest of ``x[at : at + 16]`` (no NaN there), in a tree of pairs: 4 steps
    deep instead of 15 (a minimum is exact: any order gives the same value)."""
    a0 = x[at] if x[at] < x[at + 1] else x[at + 1]
    a1 = x[at + 2] if x[at + 2] < x[at + 3] else x[at + 3]
    a2 = x[at + 4] if x[at + 4] < x[at + 5] else x[at + 5]
    a3 = x[at + 6] if x[at + 6] < x[at + 7] else x[at + 7]
    a4 = x[at + 8] if x[at + 8] < x[at + 9] else x[at + 9]
    a5 = x[at + 10] if x[at + 10] < x[at + 11] else x[at + 11]
    a6 = x[at + 12] if x[at + 12] < x[at + 13] else x[at + 13]
    a7 = x[at + 14] if x[at + 14] < x[at + 15] else x[at + 15]
    b0 = a0 if a0 < a1 else a1
    b1 = a2 if a2 < a3 else a3
    b2 = a4 if a4 < a5 else a5
    b3 = a6 if a6 < a7 else a7
    c0 = b0 if b0 < b1 else b1
    c1 = b2 if b2 < b3 else b3
    return c0 if c0 < c1 else c1


def min_refresh(tree: tuple[np.ndarray, ...], leaves: np.ndarray, slots: np.ndarray) -> None:
    """The min-tree ``tree``'s leaves at ``slots`` set from the sum-tree's ``leaves`` (0
    as ``inf``: it cannot be drawn), their ancestors recomputed (a minimum of the 16
    children, in any order: the same node as NumPy's)."""
    low = tree[0]
    for k in range(slots.shape[0]):
        x = leaves[slots[k]]
        low[slots[k]] = x if x > 0 else math.inf
    shift = 0
    for j in range(1, len(tree)):
        shift += 4
        min_refresh_level(tree[j - 1], tree[j], shift, slots)


def min_rebuild(tree: tuple[np.ndarray, ...], leaves: np.ndarray) -> None:
    """The min-tree ``tree`` rebuilt from the sum-tree's ``leaves`` (0 as ``inf``; the
    padding past them stays ``inf``)."""
    low = tree[0]
    for k in range(leaves.shape[0]):
        x = leaves[k]
        low[k] = x if x > 0 else math.inf
    for j in range(1, len(tree)):
        child, parent = tree[j - 1], tree[j]
        for p in range(parent.shape[0]):
            parent[p] = smallest_of_16(child, p * 16)


# -- loading --------------------------------------------------------------------------
_loaded: list[Any] = []


def load() -> Any:
    """The compiled kernels (``.draw``, ``.check``, ``.write``: entry points for their
    one signature; ``.min_refresh``, ``.min_rebuild``), or ``None`` (no numba, a compile
    failed, or :func:`sumtree_numba.load <xpbank.sampler.sumtree_numba.load>` gives
    ``None``: the callers keep their paths)."""
    if not _loaded:
        _loaded.append(_compile())
    if sumtree_numba.load() is None:  # the one switch (tests turn the kernels off there)
        return None
    return _loaded[0]


def _compile() -> Any:
    global _f64s, _f32s, _i64s, _carray
    if sumtree_numba.load() is None:  # also registers the helpers these kernels call
        return None
    ptrs = _jit.pointers("float64", "float32", "int64")
    if ptrs is None:
        return None
    try:
        from types import SimpleNamespace

        import numba  # type: ignore[import-untyped, unused-ignore]
        from numba import types  # type: ignore[import-untyped, unused-ignore]

        _f64s, _f32s, _i64s = ptrs  # the kernels' globals, resolved when they compile
        _carray = numba.carray
        fns = (draw, check, write, min_refresh, min_rebuild)
        helpers = (level, min_level, context, min_refresh_level, smallest_of, smallest_of_16)
        kernels: Any = _jit.compile_kernels(*fns, helpers=helpers, inline=helpers)
        if kernels is None:
            return None
        i8, f8 = types.int64, types.float64
        return SimpleNamespace(
            draw=kernels[0].compile((i8,) * 7 + (f8, f8, i8, i8, i8, i8)),
            check=kernels[1].compile((i8,) * 7 + (f8, i8, i8)),
            write=kernels[2].compile((i8,) * 5 + (f8, i8)),
            min_refresh=kernels[3],
            min_rebuild=kernels[4],
        )
    except Exception:
        log.debug("prioritized_calls: no compiled small calls", exc_info=True)
        return None


class TreeCalls:
    """A NumPy sum-tree's context for the kernels above: the addresses and lengths of
    its levels, of its kept prefix sums (``cums``) and of its
    :class:`~xpbank.sampler.lazymin.LazyMin`'s min-tree levels, in one int64 array,
    made once per tree (the sampler makes another when it allocates new trees), and
    the kernels' entry points (``None`` where they are not compiled). Never pickled
    (rebuilt on use: the addresses are this process's)."""

    def __init__(self, levels: tuple[np.ndarray, ...] = (), smallest: Any = None) -> None:
        kernels = load() if levels else None
        self.levels, self.smallest = levels, smallest  # the trees these calls are for
        self.cums = np.empty(levels[-1].shape[0] + 1 if levels else 0)
        low = tuple(smallest._tree) if smallest is not None else ()
        words = [len(levels)]
        for lv in levels:
            words += [lv.ctypes.data, lv.shape[0]]
        words.append(self.cums.ctypes.data)
        for lv in low:
            words += [lv.ctypes.data, lv.shape[0]]
        self.ctx = np.array(words, dtype=np.int64)
        self.address = int(self.ctx.ctypes.data)
        self.size = -1  # the kept update arrays' length
        self.shifted = self.stored = np.empty(0)
        self.slots = np.empty(0, dtype=np.int64)
        self.shifted_at = self.stored_at = self.slots_at = 0
        self.draw: Any = None  # the kernels' entry points, where they compiled
        self.check: Any = None
        self.write: Any = None
        same = [lv.shape for lv in levels] == [lv.shape for lv in low]
        if kernels is not None and same:
            self.draw, self.check, self.write = kernels.draw, kernels.check, kernels.write

    def update_arrays(self, n: int) -> TreeCalls:
        """These calls with kept update arrays of length ``n`` (slots, ``p + eps``, its
        power), reallocated only when ``n`` changes."""
        if self.size != n:
            self.shifted, self.stored = np.empty(n), np.empty(n)
            self.slots = np.empty(n, dtype=np.int64)
            self.shifted_at, self.stored_at = int(self.shifted.ctypes.data), int(self.stored.ctypes.data)
            self.slots_at = int(self.slots.ctypes.data)
            self.size = n
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (TreeCalls, ())
