"""Sum-trees and min-trees as plain NumPy arrays, updated and descended for a whole batch.

A tree is a list of levels: ``levels[0]`` holds the leaves (one per slot, padded with
the reduction's identity), ``levels[j]`` holds the reduction of each group of
:data:`FANOUT` nodes of ``levels[j - 1]``, and ``levels[-1]``, the top, has at most
:data:`TOP` nodes (levels are added until it does). Every node is always exactly the
reduction of its children, so a rebuild from the leaves gives bit-identical trees.

Why this shape: a batch update or descent costs a few NumPy calls per level whatever
the fan-out, so few levels are cheap; 16 float64 children are 128 contiguous bytes (two
cache lines). The top is searched in one go: a cumulative sum of at most ``TOP`` values
and a ``searchsorted``. For 1M slots that is two levels of 16 below a top of 4,096.
Each call is O(B log N) plus the top's bounded constant; nothing loops over items in
Python. With numba installed (the ``fast`` extra), :func:`set_leaves` of a sum-tree and
:func:`find_prefix_sum` run compiled loops over the batch instead
(:mod:`~xpbank.sampler.sumtree_numba`; ``XPBANK_NO_NUMBA=1`` turns it off). Every level
starts on a 128-byte boundary, so a node's 16 children are two whole cache lines.
The top's prefix sums (:func:`top_prefix`) can be computed once and reused by every
descent until the next write (``find_prefix_sum(..., cums=...)``).

Exactness: the trees are float64. A node's sum is its 16 children added pairwise
(``((c0 + c1) + (c2 + c3)) + ...``: four vectorized halvings, the order the optional
compiled kernels of :mod:`~xpbank.sampler.sumtree_numba` repeat), the top's prefix sums
are torch's sequential cumulative sum; a rebuild from the leaves repeats the same
operations and so gives bit-identical trees. A descent compares a draw with each
visited node's children summed in order (a sequential cumulative sum, as the compiled
kernels do), so both paths pick the same leaf on every CPU, and since such sums never
decrease and a zero leaf adds exactly 0, a descent never lands on a zero leaf. Integer
priorities (below 2**53 in total) make every partial sum exact, so a descent then
returns exactly the naive inverse CDF's leaf. No step goes through BLAS, whose order
varies with the CPU.

Example:
    >>> import numpy as np
    >>> tree = new_tree(5, np.add)
    >>> set_leaves(tree, np.array([0, 3]), np.array([1.0, 3.0]), np.add)
    >>> float(top_reduce(tree, np.add))
    4.0
    >>> slots, total = find_prefix_sum(tree, np.array([0.5, 1.0, 3.9]) / 4.0)
    >>> slots.tolist(), total
    ([0, 3, 3], 4.0)
"""

from __future__ import annotations

import numpy as np
import torch

from xpbank.sampler import sumtree_numba

__all__ = [
    "FANOUT",
    "TOP",
    "find_prefix_sum",
    "level_sizes",
    "new_tree",
    "rebuild",
    "refresh_leaves",
    "refresh_range",
    "set_leaves",
    "set_range",
    "top_prefix",
    "top_reduce",
]

FANOUT = 16
TOP = 4096

Tree = list[np.ndarray]

_ALIGN = 128  # bytes: FANOUT float64 children


def _identity(op: np.ufunc) -> float:
    return float(np.inf) if op is np.minimum else 0.0


def level_sizes(capacity: int) -> list[int]:
    """The sizes of a tree's levels over ``capacity`` leaves, leaves first: each level
    ``FANOUT`` times smaller, down to a top of at most ``TOP`` nodes (every level a
    multiple of ``FANOUT`` times the top, so the leaves are padded).

    Example:
        >>> level_sizes(10), level_sizes(70_000)
        ([16, 1], [70144, 4384, 274])
    """
    depth = 1
    while -(-capacity // FANOUT**depth) > TOP:
        depth += 1
    top = -(-capacity // FANOUT**depth)
    return [top * FANOUT ** (depth - j) for j in range(depth + 1)]


def new_tree(capacity: int, op: np.ufunc) -> Tree:
    """An empty tree over ``capacity`` leaves for ``op`` (``np.add`` or ``np.minimum``)."""
    return [_aligned_full(n, _identity(op)) for n in level_sizes(capacity)]


def _aligned_full(n: int, value: float) -> np.ndarray:
    """``np.full(n, value)`` starting on a 128-byte boundary: a node's 16 float64 children
    are then exactly two cache lines (NumPy's own alignment, 16 bytes, spreads them over
    three), the pair a CPU's adjacent-line prefetch fetches together."""
    buf = np.full(n + _ALIGN // 8, value)
    skip = (-buf.ctypes.data % _ALIGN) // 8
    return buf[skip : skip + n]


def top_reduce(tree: Tree, op: np.ufunc) -> float:
    """The reduction of every leaf (the total of a sum-tree, the minimum of a min-tree)."""
    return float(op.reduce(tree[-1]))


def _reduce_rows(rows: np.ndarray, op: np.ufunc) -> np.ndarray:
    # pairwise halving over the flat rows: 4 long vectorized passes, 2x (a batch) to 6x (a
    # rebuild) faster than minimum.reduce(axis=1), whose per-row loops are 16 long; for sums
    # a fixed order (a BLAS dot product's order varies) that the compiled kernels repeat
    flat = rows.reshape(-1)
    while flat.shape[0] > rows.shape[0]:
        flat = op(flat[0::2], flat[1::2])
    return flat


def set_leaves(tree: Tree, slots: np.ndarray, values: np.ndarray, op: np.ufunc) -> None:
    """Write ``values`` at leaves ``slots`` and update their ancestors, level by level.

    A slot given twice keeps its last value (NumPy assigns repeated indices in order).
    """
    kernels = sumtree_numba.load()
    if kernels is not None and op is np.add and values.shape == slots.shape:
        kernels.set_leaves(
            tuple(tree), slots.astype(np.int64, copy=False), values.astype(np.float64, copy=False)
        )
        return
    tree[0][slots] = values
    refresh_leaves(tree, slots, op)


def refresh_leaves(tree: Tree, slots: np.ndarray, op: np.ufunc) -> None:
    """Recompute the ancestors of leaves ``slots`` (after the leaves were written)."""
    idx = slots
    for j in range(1, len(tree)):
        idx = idx // FANOUT
        tree[j][idx] = _reduce_rows(np.take(tree[j - 1].reshape(-1, FANOUT), idx, axis=0), op)


def set_range(tree: Tree, start: int, stop: int, value: float, op: np.ufunc) -> None:
    """Write ``value`` at leaves ``[start, stop)`` and update their ancestors (slices only)."""
    if stop <= start:
        return
    tree[0][start:stop] = value
    refresh_range(tree, start, stop, op)


def refresh_range(tree: Tree, start: int, stop: int, op: np.ufunc) -> None:
    """Recompute the ancestors of leaves ``[start, stop)`` (after the leaves were written)."""
    if stop <= start:
        return
    lo, hi = start, stop
    for j in range(1, len(tree)):
        lo, hi = lo // FANOUT, (hi - 1) // FANOUT + 1
        tree[j][lo:hi] = _reduce_rows(tree[j - 1].reshape(-1, FANOUT)[lo:hi], op)


def rebuild(tree: Tree, op: np.ufunc) -> None:
    """Recompute every inner node from the leaves."""
    for j in range(1, len(tree)):
        tree[j][:] = _reduce_rows(tree[j - 1].reshape(-1, FANOUT), op)


def top_prefix(tree: Tree) -> np.ndarray:
    """The top's prefix sums: ``cums[i] = sum(top[:i])``, ``cums[-1]`` the total.

    Valid until the tree's next write; pass it to :func:`find_prefix_sum` to share it.
    """
    top = tree[-1]
    kernels = sumtree_numba.load()
    if kernels is not None:
        return kernels.prefix(top)
    cums = np.zeros(top.shape[0] + 1)
    # torch's cumsum: the same sequential sums, bit for bit, at about a third of NumPy's cost
    torch.cumsum(torch.from_numpy(top), 0, out=torch.from_numpy(cums[1:]))
    return cums


def find_prefix_sum(
    tree: Tree, fractions: np.ndarray, cums: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """The leaves at ``fractions`` (in ``[0, 1)``) of a sum-tree's total, and that total.

    For ``u = fraction * total`` the leaf ``i`` with ``sum(leaves[:i]) <= u <
    sum(leaves[:i + 1])``: leaf ``i`` is drawn with probability ``leaves[i] / total`` when
    the fraction is uniform. Never returns a zero leaf while the total is positive: the
    children's sums are taken in order, so they never decrease and a zero child adds
    exactly 0; when rounding puts ``u`` at or past a node's sum, the last positive child
    is taken.
    ``cums``: the tree's :func:`top_prefix`, if already computed since its last write.
    """
    b, top = fractions.shape[0], tree[-1]
    if cums is None:
        cums = top_prefix(tree)
    total = float(cums[-1])
    kernels = sumtree_numba.load()
    if kernels is not None:
        return kernels.descend(tuple(tree), cums, fractions.astype(np.float64, copy=False)), total
    u = np.multiply(fractions, total, dtype=np.float64)  # float64, as the kernel's
    node = np.searchsorted(cums[1:], u, side="right")
    if node.size and node.max() >= top.shape[0]:
        node = np.minimum(node, int(np.flatnonzero(top > 0)[-1]))
    u -= cums[node]
    # each row: a 0, then the node's FANOUT children, summed in place in order (torch's
    # CPU cumsum: np.cumsum's sums, bit for bit, at a fraction of its cost on short rows;
    # the compiled kernel's order). The sums never decrease and a zero child adds exactly
    # 0, so the first sum past u is a positive child's: a binary search per row finds it
    sums = np.empty((b, FANOUT + 1))
    sums[:, 0] = 0.0
    rows = np.arange(b) * (FANOUT + 1)
    found = np.empty((b, 1), dtype=np.int64)
    sums_t, u_t, found_t = torch.from_numpy(sums), torch.from_numpy(u.reshape(b, 1)), torch.from_numpy(found)
    for j in range(len(tree) - 2, -1, -1):
        np.take(tree[j].reshape(-1, FANOUT), node, axis=0, out=sums[:, 1:])
        sums_t.cumsum_(1)
        torch.searchsorted(sums_t, u_t, right=True, out=found_t)
        child = found.reshape(b) - 1  # the leading 0 is always <= u
        if b and child.max() >= FANOUT:  # rounding put u at or past the node's sum
            over = np.flatnonzero(child >= FANOUT)
            leaves = np.take(tree[j].reshape(-1, FANOUT), node[over], axis=0)
            child[over] = FANOUT - 1 - np.argmax(leaves[:, ::-1] > 0, axis=1)
        u -= sums.ravel()[rows + child]
        node *= FANOUT
        node += child
    return node, total
