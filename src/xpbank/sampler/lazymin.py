"""The smallest positive leaf of a sum-tree, exact, without a min-tree update per write.

Importance weights are normalized by the largest weight of any stored item, that of the
smallest positive stored priority. Keeping a min-tree up to date on every priority
update cost about as much as the sum-tree's own update, yet the minimum itself seldom
changes in a way that needs a tree. For a write of ``new`` over ``old`` leaf values:

- if the smallest positive new value is at or below the minimum, it *is* the new minimum;
- else, if no old value equals the minimum, the minimum is unchanged;
- else a leaf holding the minimum was raised (or overwritten), and the minimum is unknown.

So the minimum is kept as a number, and the min-tree (leaves: the sum-tree's leaves, 0
as ``inf``) is brought up to date only when the minimum is unknown and asked for: the
leaves written since the last flush (a list of slot arrays and ranges) are refreshed
from the sum-tree's leaves in ``O(k log N)`` for ``k`` pending leaves, or, once more than
``N / 64`` leaves are pending, the whole tree is rebuilt in ``O(N)`` (a contiguous pass,
about as costly as refreshing ``N / 64`` scattered leaves one by one here), which is
then paid for by the ``N / 64`` leaves written since the last flush. At worst (the
minimum's leaf raised every few calls) a flush costs what eager min-tree updates would
have; when the minimum's leaf is seldom raised (the usual case: it is the item least
likely to be drawn and updated) the min-tree costs next to nothing. Every leaf is exactly the
value it would hold under eager updates, and a minimum does not depend on the order of
its operands, so a flushed tree is bit-identical to one rebuilt from the leaves.

A compiled update (:func:`xpbank.sampler.prioritized_calls.write`, the buffer's small
calls) keeps the min-tree up to date for the leaves it writes (~32 minima of 16 per
level, next to the sum-tree's own upkeep) and reports them with :meth:`kept_up`: none
becomes pending, and where the tree was up to date before (:attr:`in_sync`) and the
minimum's leaf may have been raised, the call reads the new minimum off the top. In a
DQN loop the lazy flush cost ~40-90 µs about every 60 steps (~1-1.5 µs a step); the
eager upkeep costs less than that. Writes of new items (``changed``) stay lazy.

Example:
    >>> import numpy as np
    >>> leaves = np.zeros(100)
    >>> smallest = LazyMin(leaves)
    >>> old = leaves[:3].copy()
    >>> leaves[:3] = [2.0, 5.0, 0.0]
    >>> smallest.changed(np.arange(3), old, leaves[:3])
    >>> smallest.value
    2.0
    >>> old = leaves[[0]].copy()
    >>> leaves[0] = 9.0  # the minimum's leaf is raised: unknown until asked for
    >>> smallest.changed(np.array([0]), old, leaves[[0]])
    >>> smallest.value
    5.0
"""

from __future__ import annotations

import math

import numpy as np

from xpbank.sampler import prioritized_calls, sumtree

__all__ = ["LazyMin"]

Slots = np.ndarray | slice


def _count(slots: Slots) -> int:
    return slots.stop - slots.start if isinstance(slots, slice) else int(slots.shape[0])


def _positive(values: np.ndarray) -> np.ndarray:
    """``values`` with every leaf that cannot be drawn (0) as ``inf``."""
    return np.where(values > 0, values, np.inf)


class LazyMin:
    """The smallest positive value of ``leaves`` (``inf`` if none), kept exactly.

    ``leaves`` is the sum-tree's leaf array, shared, not copied. Every later write to it
    must be reported with :meth:`changed` (or be followed by :meth:`reset`).

    Args:
        leaves: the leaves watched (padded leaves stay 0).
    """

    def __init__(self, leaves: np.ndarray) -> None:
        self._leaves = leaves
        self._tree = sumtree.new_tree(leaves.shape[0], np.minimum)
        self._limit = max(1, leaves.shape[0] // 64)
        self._value = math.inf
        self._known = True  # self._value is the minimum
        self._pending: list[Slots] = []  # leaves written since the tree was last brought up to date
        self._count = 0  # how many
        self._rebuild = False  # too many: rebuild the whole tree instead
        if leaves.any():
            self.reset()

    def reset(self) -> None:
        """Forget what is known: the next read rebuilds the tree from the leaves."""
        self._pending, self._count, self._rebuild, self._known = [], 0, True, False

    def changed(self, slots: Slots, old: np.ndarray, new: np.ndarray) -> None:
        """Record that the leaves at ``slots`` went from ``old`` to ``new``.

        Args:
            slots: the leaves written (int64 array or slice).
            old: their values before the write (a view is fine if read before writing).
            new: their values after the write, or one value broadcast to all of them.
        """
        if not _count(slots):
            return
        low, hit = math.inf, False
        if self._known:
            low = float(new.min())
            if not low > 0:  # 0 can never be drawn: the smallest positive one
                low = float(_positive(new).min())
            hit = low > self._value and bool((old == self._value).any())
        self.noted(slots, low, hit)

    @property
    def kept(self) -> float:
        """The number kept as the minimum (the minimum itself only while it is known)."""
        return self._value

    def noted(self, slots: Slots, low: float, hit: bool) -> None:
        """:meth:`changed`, given what it computes from the values.

        Args:
            slots: the leaves written (int64 array or slice).
            low: the smallest positive value now at ``slots`` (``inf`` if none).
            hit: whether a leaf at ``slots`` held :attr:`kept` before the write.
        """
        count = _count(slots)
        if count <= 0:
            return
        if self._known:
            if low <= self._value:
                self._value = low
            elif hit:
                self._known = False
        if self._rebuild:
            return
        self._count += count
        if self._count > self._limit:
            self._pending, self._rebuild = [], True
        else:
            self._pending.append(slots)

    @property
    def in_sync(self) -> bool:
        """Whether the min-tree is up to date (no leaf pending): its top then holds the minimum."""
        return self._count == 0 and not self._rebuild

    def kept_up(self, low: float, hit: bool, exact: float) -> None:
        """:meth:`noted` for leaves whose min-tree entries (and their ancestors) the caller
        brought up to date itself (:func:`xpbank.sampler.prioritized_calls.write`), so
        none is pending. ``exact``: the minimum read off the tree's top after that
        (``nan``: not read; only an up-to-date tree's top is the minimum)."""
        if exact == exact:
            self._value, self._known = exact, True
        elif self._known:
            if low <= self._value:
                self._value = low
            elif hit:
                self._known = False

    @property
    def value(self) -> float:
        """The smallest positive leaf (``inf`` if none); the tree is used only if unknown."""
        if not self._known:
            self._flush()
            self._value, self._known = sumtree.top_reduce(self._tree, np.minimum), True
        return self._value

    @property
    def tree(self) -> sumtree.Tree:
        """The min-tree, brought up to date (leaves that cannot be drawn are ``inf``)."""
        self._flush()
        return self._tree

    def _flush(self) -> None:
        tree, leaves = self._tree, self._leaves
        kernels = prioritized_calls.load()
        if self._rebuild:
            if kernels is not None:  # the same nodes (a minimum is exact), ~10x sooner
                kernels.min_rebuild(tuple(tree), leaves)
            else:
                tree[0][: leaves.shape[0]] = _positive(leaves)  # the padding stays inf
                sumtree.rebuild(tree, np.minimum)
        else:
            arrays = [s for s in self._pending if not isinstance(s, slice)]
            for s in self._pending:
                if isinstance(s, slice) and s.stop > s.start:
                    tree[0][s] = _positive(leaves[s])
                    sumtree.refresh_range(tree, s.start, s.stop, np.minimum)
            if arrays:
                slots = np.concatenate(arrays)
                if kernels is not None:
                    kernels.min_refresh(tuple(tree), leaves, slots)
                else:
                    sumtree.set_leaves(tree, slots, _positive(leaves[slots]), np.minimum)
        self._pending, self._count, self._rebuild = [], 0, False
