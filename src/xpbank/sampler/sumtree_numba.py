"""Optional compiled kernels (numba) for the sum-tree and the prioritized sampler's hot paths.

:mod:`xpbank.sampler.sumtree` does a batch in a few NumPy calls per level; each call
costs a few µs whatever its size, which dominates at B=256. These kernels do the same
work in compiled loops over the batch. They are used when numba is installed (the
``fast`` extra) unless the environment variable
``XPBANK_NO_NUMBA=1`` is set (read once, when this module is imported). The NumPy
code stays the reference and runs unchanged without numba.

- :func:`descend` (``sumtree.find_prefix_sum``) and :func:`draw_fresh` (a whole
  stratified prioritized draw: fractions, descent, importance weights, the items' ids;
  after a write the top's prefix sums too) walk the tree level by
  level for the whole batch: the top is searched for every item first, then each
  level's rows are read for every item. One item's reads depend on each other, those of
  different items do not, so the CPU overlaps the cache misses of many items (one item
  at a time, each item's misses came one after the other).
- :func:`set_leaves` and :func:`update` (a priority update: the stored priorities
  written, ancestors recomputed, and what :class:`~xpbank.sampler.lazymin.LazyMin` needs
  to know, in one call) recompute ancestors level by level too.
- :func:`live_slots` checks a priority update's ids and values in one pass (the usual,
  valid case); anything it does not accept goes through the NumPy checks, which raise.
  :func:`live_priorities` does the same and adds ``eps`` (the buffer's small-call
  update: :mod:`~xpbank.sampler.prioritized_fast`).

Same results as the NumPy path, on every CPU: a parent is its 16 children added
pairwise (``((c0 + c1) + (c2 + c3)) + ...``, the order of :func:`sumtree._reduce_rows`),
so trees are bit-identical whichever path wrote them; a descent sums a node's children
in order, as the NumPy path's cumulative sum does, so both pick the same leaf. No kernel
raises a power: ``(p + eps) ** alpha`` and the weights' ``** -beta`` are NumPy's array
power in both paths (:func:`~xpbank.sampler.priorities.power`). NumPy picks its power
routine by CPU (a vector routine on AVX-512 machines, the C library's ``pow``
elsewhere), and the two differ in the last bit of about one value in 20: a compiled
power matched NumPy's on some CPUs only.

``make test`` runs these kernels' tests under several ``NPY_DISABLE_CPU_FEATURES``
settings taken from the machine's NumPy and CPU (``tests/cpu_variants.py``).

Example:
    >>> import numpy as np
    >>> from xpbank.sampler import sumtree, sumtree_numba
    >>> kernels = sumtree_numba.load()
    >>> tree = sumtree.new_tree(40, np.add)
    >>> if kernels is not None:
    ...     kernels.set_leaves(tuple(tree), np.array([3, 39]), np.array([1.0, 3.0]))
    ... else:
    ...     sumtree.set_leaves(tree, np.array([3, 39]), np.array([1.0, 3.0]), np.add)
    >>> float(tree[-1].sum())
    4.0
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from xpbank import _jit

__all__ = [
    "ENABLED",
    "descend",
    "draw_fresh",
    "live_priorities",
    "live_slots",
    "load",
    "prefix",
    "set_leaves",
    "update",
]

#: False when ``XPBANK_NO_NUMBA`` was set when xpbank was imported (:mod:`xpbank._jit`).
ENABLED = _jit.ENABLED

_loaded: SimpleNamespace | None = None
_tried = False


# -- helpers, compiled into the kernels that call them --------------------------------
def search_right_all(cums: np.ndarray, n: int, u: np.ndarray, out: np.ndarray) -> None:
    """``np.searchsorted(cums[1 : n + 1], u[i], side="right")`` (``cums`` sorted) of every
    ``u[i]`` into ``out[i]``, the items in lockstep: each halving step is taken for the
    whole batch before the next. One item's steps depend on each other's loads, and
    compiled one item at a time the step became a branch, mispredicted half the time on
    random ``u`` (~1.2 µs of a 32-item draw over a 391-node top); in lockstep the items'
    loads overlap and the step is a product."""
    b = u.shape[0]
    for i in range(b):
        out[i] = 0
    if n == 0:
        return
    size = n  # every answer lies in [out[i], out[i] + size]
    while size > 1:
        half = size >> 1
        for i in range(b):
            base = out[i]
            out[i] = base + half * (cums[base + half] <= u[i])
        size -= half
    for i in range(b):
        base = out[i]
        out[i] = base + (cums[base + 1] <= u[i])


def search_top(top: np.ndarray, cums: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """The top node at each prefix sum ``u`` (``cums``: the top's :func:`prefix`), into
    ``out``; ``u`` becomes the remainder below that node."""
    ntop = top.shape[0]
    search_right_all(cums, ntop, u, out)
    last_positive = -1  # the last top node with a positive sum, looked up if needed
    for i in range(u.shape[0]):
        node = out[i]
        if node >= ntop:
            if last_positive < 0:
                last_positive = ntop - 1
                while last_positive > 0 and not top[last_positive] > 0:
                    last_positive -= 1
            node = last_positive
        u[i] -= cums[node]
        out[i] = node


def descend_level(level: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """One level down: each node ``out[i]``'s child of ``level`` at remainder ``u[i]``
    (both overwritten: the child, the remainder below it)."""
    b = u.shape[0]
    touched = 0.0  # first touch both cache lines of every row (rows are 128-byte aligned,
    # sumtree.new_tree): short independent loads,
    for i in range(b):  # many in flight, where the descent below has few
        touched += level[out[i] * 16] + level[out[i] * 16 + 8]
    if touched < 0.0:  # never (priorities are >= 0): a use the compiler cannot drop
        u[0] = touched
    for i in range(b):
        base = out[i] * 16
        v = u[i]
        acc = 0.0
        before = 0.0  # the sum of the children before the one taken
        child = 0
        for c in range(16):
            acc += level[base + c]
            if acc <= v:
                child += 1
                before = acc
        if child >= 16:  # rounding put u at or past the node's sum: the last positive child
            child = 15
            while child > 0 and not level[base + child] > 0:
                child -= 1
            before = 0.0
            for c in range(child):
                before += level[base + c]
        u[i] = v - before
        out[i] = base + child


def descend_into(levels: tuple[np.ndarray, ...], cums: np.ndarray, u: np.ndarray, out: np.ndarray) -> None:
    """Leaves at prefix sums ``u`` (overwritten: the remainders), into ``out``, level by
    level: the top is searched for every item first, then each level's rows are read."""
    depth = len(levels)
    search_top(levels[depth - 1], cums, u, out)
    for j in range(depth - 2, -1, -1):
        descend_level(levels[j], u, out)


def prefix_into(top: np.ndarray, cums: np.ndarray) -> None:
    """``cums[i] = sum(top[:i])`` for ``i`` in ``[0, len(top)]``, added in order."""
    acc = 0.0
    cums[0] = 0.0
    for i in range(top.shape[0]):
        acc += top[i]
        cums[i + 1] = acc


def draw_body(
    levels: tuple[np.ndarray, ...],
    cums: np.ndarray,
    draws: np.ndarray,
    scale: float,
    divisor: float,
    slots: np.ndarray,
    ratios: np.ndarray,
) -> None:
    """:func:`draw_fresh`'s draw (``ratios`` holds the points descended until it gets the ratios)."""
    b = draws.shape[0]
    total = cums[levels[-1].shape[0]]
    for i in range(b):
        ratios[i] = ((i + draws[i]) / b) * total
    descend_into(levels, cums, ratios, slots)
    leaves = levels[0]
    for i in range(b):
        ratios[i] = (scale * leaves[slots[i]]) / divisor


def refresh_level(child: np.ndarray, parent: np.ndarray, shift: int, slots: np.ndarray) -> None:
    """Recompute the nodes of ``parent`` above leaves ``slots`` (``2 ** shift``: leaves per
    node of ``parent``) from their 16 children in ``child``, added pairwise."""
    for k in range(slots.shape[0]):
        p = slots[k] >> shift  # slots >= 0: their // 16**j, without a division (~0.4 µs at 32)
        x = child[p * 16 : p * 16 + 16]
        parent[p] = (((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))) + (
            ((x[8] + x[9]) + (x[10] + x[11])) + ((x[12] + x[13]) + (x[14] + x[15]))
        )


def refresh(levels: tuple[np.ndarray, ...], slots: np.ndarray) -> None:
    """Recompute the ancestors of leaves ``slots``, level by level."""
    shift = 0
    for j in range(1, len(levels)):
        shift += 4
        refresh_level(levels[j - 1], levels[j], shift, slots)


# -- kernels (their sources: plain Python, compiled by load()) ------------------------
def prefix(top: np.ndarray) -> np.ndarray:
    """``cums[i] = sum(top[:i])``, added in order.

    :func:`sumtree.top_prefix`: the same sequential sums as torch's cumulative sum.
    """
    cums = np.empty(top.shape[0] + 1)
    prefix_into(top, cums)
    return cums


def descend(levels: tuple[np.ndarray, ...], cums: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """The leaves at ``fractions`` of a sum-tree's total.

    ``levels``: the tree's levels, leaves first; ``cums``: its :func:`sumtree.top_prefix`.
    :func:`sumtree.find_prefix_sum` of the same tree.
    """
    out = np.empty(fractions.shape[0], dtype=np.int64)
    descend_into(levels, cums, fractions * cums[levels[-1].shape[0]], out)
    return out


def draw_fresh(
    levels: tuple[np.ndarray, ...],
    cums: np.ndarray,
    fresh: bool,
    draws: np.ndarray,
    scale: float,
    divisor: float,
    slots: np.ndarray,
    ratios: np.ndarray,
    ids: np.ndarray,
    first: int,
    capacity: int,
) -> None:
    """One stratified prioritized draw of ``B = len(draws)`` items into ``slots``, the
    base of each one's importance weight into ``ratios`` (float64), and their ids into
    ``ids``.

    Item ``i`` is the leaf at fraction ``(i + draws[i]) / B`` of the total; its ratio is
    ``scale * leaf / divisor``: ``scale = 1, divisor = smallest`` for normalized weights,
    ``scale = N, divisor = total`` for the unnormalized ones. The weight is
    ``ratio ** -beta``, raised by the caller with NumPy
    (:func:`~xpbank.sampler.priorities.importance_weights`): a power is not computed here.
    ``fresh``: the top's prefix sums are first rewritten in place into ``cums`` (its
    length, :func:`prefix`'s sums), sparing a sample after a write a separate
    :func:`prefix` call and its array. Ids: live ids ``[first, first + n)`` in a ring of
    ``capacity`` slots, ``first + (slot - first mod capacity) mod capacity``, as
    ``fast_read.ids_of_rows`` gives them."""
    if fresh:
        prefix_into(levels[-1], cums)
    draw_body(levels, cums, draws, scale, divisor, slots, ratios)
    offset = first % capacity
    for i in range(slots.shape[0]):
        ids[i] = first + (slots[i] - offset) % capacity


def set_leaves(levels: tuple[np.ndarray, ...], slots: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` at leaves ``slots`` and recompute their ancestors.

    :func:`sumtree.set_leaves` with ``np.add``: a repeated slot keeps its last value; a
    parent is its 16 children added pairwise, as :func:`sumtree._reduce_rows` does.
    """
    leaves = levels[0]
    for k in range(slots.shape[0]):
        leaves[slots[k]] = values[k]
    refresh(levels, slots)


def write_leaves(
    leaves: np.ndarray, slots: np.ndarray, priorities: np.ndarray, stored: np.ndarray, smallest: float
) -> tuple[float, bool]:
    """Store ``stored`` at ``leaves[slots]`` (a repeated slot keeps its last); returns
    ``(the largest of priorities, whether a leaf held smallest before the write)``.
    Shared by :func:`update` and :func:`xpbank.sampler.prioritized_calls.write`."""
    n = slots.shape[0]
    largest = -math.inf
    hit = False
    for k in range(n):
        hit = hit or leaves[slots[k]] == smallest
    for k in range(n):
        largest = max(largest, priorities[k])
        leaves[slots[k]] = stored[k]
    return largest, hit


def update(
    levels: tuple[np.ndarray, ...],
    slots: np.ndarray,
    priorities: np.ndarray,
    stored: np.ndarray,
    smallest: float,
) -> tuple[float, float, bool]:
    """Store ``stored`` at leaves ``slots`` (a repeated slot keeps its last) and recompute
    their ancestors; ``priorities`` (``p + eps``) and ``stored`` (``(p + eps) ** alpha``,
    raised by the caller with NumPy: a power is not computed here) are float64.

    Returns:
        ``(largest, low, hit)``: the largest of ``priorities``; the smallest positive
        leaf written, as read back after the write (``inf`` if none); whether a leaf
        held ``smallest`` before the write (what ``LazyMin.noted`` takes).
    """
    leaves = levels[0]
    n = slots.shape[0]
    largest, hit = write_leaves(leaves, slots, priorities, stored, smallest)
    refresh(levels, slots)
    low = math.inf
    for k in range(n):
        x = leaves[slots[k]]
        if x > 0 and x < low:
            low = x
    return largest, low, hit


def live_slots(
    ids: np.ndarray, values: np.ndarray, first: int, stop: int, capacity: int, out: np.ndarray
) -> bool:
    """Whether every id is live (``first <= id < stop``) and every value finite and ``>= 0``;
    then ``out`` holds the ids' slots (``id % capacity``)."""
    for k in range(ids.shape[0]):
        i = ids[k]
        v = values[k]
        if not (i >= first and i < stop and v >= 0 and v < math.inf):  # NaN fails too
            return False
        out[k] = i % capacity
    return True


def live_priorities(
    ids: np.ndarray,
    values: np.ndarray,
    first: int,
    stop: int,
    capacity: int,
    eps: float,
    slots: np.ndarray,
    shifted: np.ndarray,
) -> bool:
    """:func:`live_slots`, also writing ``shifted[k] = values[k] + eps`` (float64): a
    priority update's checks and its first step in one pass (``False``: nothing decided,
    the NumPy checks then name what is wrong)."""
    for k in range(ids.shape[0]):
        i = ids[k]
        v = values[k]
        if not (i >= first and i < stop and v >= 0 and v < math.inf):  # NaN fails too
            return False
        slots[k] = i % capacity
        shifted[k] = np.float64(v) + eps
    return True


def load() -> SimpleNamespace | None:
    """The compiled kernels (``.prefix``, ``.descend``, ``.set_leaves``,
    ``.draw_fresh``, ``.update``, ``.live_slots``, ``.live_priorities``), or None when numba is missing
    or ``XPBANK_NO_NUMBA=1``.

    Imports numba on the first call only; the kernels compile on first use and are
    cached on disk (numba's ``cache=True``).
    """
    global _loaded, _tried
    if not _tried:
        _tried = True
        fns = (prefix, descend, draw_fresh, set_leaves, update, live_slots, live_priorities)
        inline = (search_top, descend_level, refresh_level, write_leaves)  # also called by prioritized_calls
        helpers = (search_right_all, *inline, descend_into, prefix_into, draw_body, refresh)
        kernels = _jit.compile_kernels(*fns, helpers=helpers, inline=inline)
        if kernels is not None:
            _loaded = SimpleNamespace(**{fn.__name__: k for fn, k in zip(fns, kernels, strict=True)})
    return _loaded
