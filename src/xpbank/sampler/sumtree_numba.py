"""Optional compiled kernels (numba) for the sum-tree's batch descent and leaf updates.

:mod:`xpbank.sampler.sumtree` does a batch in a few NumPy calls per level; each call
costs a few µs whatever its size, which dominates at B=256. These kernels do the same
work in one compiled loop over the batch. They are used when numba is installed (the
``fast`` extra: ``pip install xpbank[fast]``) unless the environment variable
``XPBANK_NO_NUMBA=1`` is set (read once, when this module is imported). The NumPy
code stays the reference and runs unchanged without numba.

Same results as the NumPy path: a parent is its 16 children added pairwise
(``((c0 + c1) + (c2 + c3)) + ...``, the order of :func:`sumtree._reduce_rows`), so
trees are bit-identical whichever path wrote them. The descent's prefix sums over 16
children are sequential here; NumPy's come from a BLAS product whose order varies, so
the two can differ in the last bit of a prefix sum and pick a different leaf only when
a draw falls within rounding of a boundary (never with integer priorities, whose
partial sums are exact).

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

from types import SimpleNamespace

import numpy as np

from xpbank import _jit

__all__ = ["ENABLED", "descend", "load", "prefix", "set_leaves"]

#: False when ``XPBANK_NO_NUMBA`` was set when xpbank was imported (:mod:`xpbank._jit`).
ENABLED = _jit.ENABLED

_loaded: SimpleNamespace | None = None
_tried = False


def prefix(top: np.ndarray) -> np.ndarray:
    """``cums[i] = sum(top[:i])``, added in order (the kernel's source).

    :func:`sumtree.top_prefix`: the same sequential sums as torch's cumulative sum.
    """
    cums = np.empty(top.shape[0] + 1)
    acc = 0.0
    cums[0] = 0.0
    for i in range(top.shape[0]):
        acc += top[i]
        cums[i + 1] = acc
    return cums


def descend(levels: tuple[np.ndarray, ...], cums: np.ndarray, fractions: np.ndarray) -> np.ndarray:
    """The leaves at ``fractions`` of a sum-tree's total (the kernel's source).

    ``levels``: the tree's levels, leaves first; ``cums``: its :func:`sumtree.top_prefix`.
    :func:`sumtree.find_prefix_sum` of the same tree, one loop over the batch.
    """
    depth = len(levels)
    top = levels[depth - 1]
    ntop = top.shape[0]
    total = cums[ntop]
    b = fractions.shape[0]
    out = np.empty(b, dtype=np.int64)
    last_positive = ntop - 1  # the last top node with a positive sum, looked up if needed
    looked_up = False
    prefix = np.zeros(17)
    for i in range(b):
        u = fractions[i] * total
        node = np.searchsorted(cums[1:], u, side="right")
        if node >= ntop:
            if not looked_up:
                looked_up = True
                while last_positive > 0 and not top[last_positive] > 0:
                    last_positive -= 1
            node = last_positive
        u -= cums[node]
        for j in range(depth - 2, -1, -1):
            level = levels[j]
            base = node * 16
            child = 0
            for c in range(16):
                prefix[c + 1] = prefix[c] + level[base + c]
                if prefix[c + 1] <= u:
                    child += 1
            if child >= 16:  # rounding put u at or past the node's sum: the last positive child
                child = 15
                while child > 0 and not level[base + child] > 0:
                    child -= 1
            u -= prefix[child]
            node = base + child
        out[i] = node
    return out


def set_leaves(levels: tuple[np.ndarray, ...], slots: np.ndarray, values: np.ndarray) -> None:
    """Write ``values`` at leaves ``slots`` and recompute their ancestors (the kernel's source).

    :func:`sumtree.set_leaves` with ``np.add``: a repeated slot keeps its last value; a
    parent is its 16 children added pairwise, as :func:`sumtree._reduce_rows` does.
    """
    leaves = levels[0]
    n = slots.shape[0]
    for k in range(n):
        leaves[slots[k]] = values[k]
    width = 1
    for j in range(1, len(levels)):
        width *= 16
        child, parent = levels[j - 1], levels[j]
        for k in range(n):
            p = slots[k] // width
            x = child[p * 16 : p * 16 + 16]
            parent[p] = (((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]))) + (
                ((x[8] + x[9]) + (x[10] + x[11])) + ((x[12] + x[13]) + (x[14] + x[15]))
            )


def load() -> SimpleNamespace | None:
    """The compiled kernels (``.prefix``, ``.descend``, ``.set_leaves``), or None when numba is missing
    or ``XPBANK_NO_NUMBA=1``.

    Imports numba on the first call only; the kernels compile on first use and are
    cached on disk (numba's ``cache=True``).
    """
    global _loaded, _tried
    if not _tried:
        _tried = True
        kernels = _jit.compile_kernels(prefix, descend, set_leaves)
        if kernels is not None:
            _loaded = SimpleNamespace(prefix=kernels[0], descend=kernels[1], set_leaves=kernels[2])
    return _loaded
