"""Sum-trees and min-trees as torch tensors on one device (CUDA), updated and descended
for a whole batch.

The torch twin of :mod:`~xpbank.sampler.sumtree`, for priorities kept beside data on a
CUDA device: a tree is a list of 1-D float64 tensors with the same levels as
:func:`xpbank.sampler.sumtree.new_tree` (``levels[0]`` the leaves padded to a multiple
of :data:`~xpbank.sampler.sumtree.FANOUT` ** depth with the identity, each level the
reduction of groups of ``FANOUT`` nodes below, a top of at most
:data:`~xpbank.sampler.sumtree.TOP` nodes), so the two can be compared level by level.
``op`` is ``"sum"`` (identity 0) or ``"min"`` (identity ``inf``). Every call is a few
tensor ops per level, vectorized over the batch: no Python loop over items, O(B log N).

Exactness: a parent is its ``FANOUT`` children reduced pairwise
(``((c0 + c1) + (c2 + c3)) + ...``), the order NumPy's tree uses, and float64 additions
are correctly rounded on every device, so a tree written with the same values is
bit-identical to the NumPy one. A descent takes each item's row of children, its
cumulative sum and a count, as :mod:`~xpbank.sampler.sumtree` does: on the CPU the
two descents are bit-identical (both sums are sequential). A CUDA scan may add in
another order, so there the two agree exactly on integer priorities and may differ by
one positive leaf only where a draw falls within rounding of a boundary between two
leaves; a zero leaf is never returned on either (:func:`_ordered_sums`).

A slot written twice in one call keeps its LAST value (as NumPy's assignment does):
``index_put_`` with repeated indices is undefined on CUDA, so the slots are
deduplicated first (a stable sort, keeping the last of each run).

Example:
    >>> import torch
    >>> tree = new_tree(5, "sum", "cpu")
    >>> set_leaves(tree, torch.tensor([0, 3, 3]), torch.tensor([1.0, 9.0, 3.0], dtype=torch.float64), "sum")
    >>> float(total(tree))
    4.0
    >>> slots, tot = find_prefix_sum(tree, torch.tensor([0.5, 1.0, 3.9], dtype=torch.float64) / 4.0)
    >>> slots.tolist(), float(tot)
    ([0, 3, 3], 4.0)
"""

from __future__ import annotations

from typing import Any, Literal

import torch

from xpbank.sampler.sumtree import FANOUT, level_sizes

__all__ = [
    "find_prefix_sum",
    "last_of_each",
    "new_tree",
    "positive",
    "rebuild",
    "refresh_leaves",
    "refresh_range",
    "set_leaves",
    "set_range",
    "top_prefix",
    "total",
]

Tree = list[torch.Tensor]
Op = Literal["sum", "min"]


def _identity(op: Op) -> float:
    return float("inf") if op == "min" else 0.0


def new_tree(capacity: int, op: Op, device: Any) -> Tree:
    """An empty tree over ``capacity`` leaves (the levels of ``sumtree.new_tree``)."""
    fill = _identity(op)
    return [torch.full((n,), fill, dtype=torch.float64, device=device) for n in level_sizes(capacity)]


def positive(values: torch.Tensor) -> torch.Tensor:
    """``values`` with every value that cannot be drawn (0) as ``inf``: a min-tree's leaves."""
    return torch.where(values > 0, values, torch.full_like(values, float("inf")))


def _reduce_rows(rows: torch.Tensor, op: Op) -> torch.Tensor:
    """Each ``[FANOUT]`` row reduced pairwise, in the order of ``sumtree._reduce_rows``."""
    flat = rows.reshape(-1)
    while flat.shape[0] > rows.shape[0]:
        a, b = flat[0::2], flat[1::2]
        flat = a + b if op == "sum" else torch.minimum(a, b)
    return flat


def last_of_each(slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(unique, where)``: the distinct ``slots`` (sorted) and, for each, the position of
    its last occurrence in ``slots``."""
    order = torch.sort(slots, stable=True).indices
    ordered = slots[order]
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    return ordered[last], order[last]


def set_leaves(tree: Tree, slots: torch.Tensor, values: torch.Tensor, op: Op) -> None:
    """Write ``values`` at leaves ``slots`` (a repeated slot keeps its last value) and
    update their ancestors, level by level. Both on the tree's device."""
    if slots.numel() == 0:
        return
    unique, where = last_of_each(slots)
    tree[0][unique] = values[where]
    refresh_leaves(tree, unique, op)


def refresh_leaves(tree: Tree, slots: torch.Tensor, op: Op) -> None:
    """Recompute the ancestors of the distinct, sorted leaves ``slots`` (after a write):
    only the parents touched, level by level."""
    idx = slots
    for j in range(1, len(tree)):
        idx = torch.unique_consecutive(idx // FANOUT)
        tree[j][idx] = _reduce_rows(tree[j - 1].view(-1, FANOUT)[idx], op)


def set_range(tree: Tree, start: int, stop: int, value: float, op: Op) -> None:
    """Write ``value`` at leaves ``[start, stop)`` and update their ancestors."""
    if stop <= start:
        return
    tree[0][start:stop] = value
    refresh_range(tree, start, stop, op)


def refresh_range(tree: Tree, start: int, stop: int, op: Op) -> None:
    """Recompute the ancestors of leaves ``[start, stop)`` (after the leaves were written)."""
    if stop <= start:
        return
    lo, hi = start, stop
    for j in range(1, len(tree)):
        lo, hi = lo // FANOUT, (hi - 1) // FANOUT + 1
        tree[j][lo:hi] = _reduce_rows(tree[j - 1].view(-1, FANOUT)[lo:hi], op)


def rebuild(tree: Tree, op: Op) -> None:
    """Recompute every inner node from the leaves."""
    for j in range(1, len(tree)):
        tree[j].copy_(_reduce_rows(tree[j - 1].view(-1, FANOUT), op))


def total(tree: Tree, op: Op = "sum") -> torch.Tensor:
    """The reduction of every leaf, a 0-d tensor on the tree's device (no host sync)."""
    return tree[-1].sum() if op == "sum" else tree[-1].min()


def top_prefix(tree: Tree) -> torch.Tensor:
    """The top's prefix sums: ``cums[i] = sum(top[:i])``, ``cums[-1]`` the total (as
    ``sumtree.top_prefix``: a sequential cumulative sum). Valid until the next write."""
    top = tree[-1]
    cums = torch.zeros(top.shape[0] + 1, dtype=torch.float64, device=top.device)
    torch.cumsum(top, 0, out=cums[1:])
    return cums


def _last_positive(rows: torch.Tensor) -> torch.Tensor:
    """The index of each row's last positive entry (0 if none)."""
    n = rows.shape[-1]
    return n - 1 - torch.argmax((rows.flip(-1) > 0).to(torch.int8), dim=-1)


def _ordered_sums(children: torch.Tensor) -> torch.Tensor:
    """Each row's cumulative sums, made non-decreasing and flat across zero children.

    On the CPU ``torch.cumsum`` adds in order (NumPy's and the kernels' sums, bit for
    bit), and this changes nothing. A parallel scan (CUDA) may associate the sums
    differently for each position, so a sum can round below the one before it or step up
    at a zero child, and a count of sums ``<= u`` could land on a zero leaf: a zero
    child's sum is replaced by the one before it and a running maximum taken, so the
    first sum past ``u`` is always a positive child's.
    """
    inclusive = torch.cumsum(children, 1)
    stepped = torch.where(children > 0, inclusive, torch.zeros_like(inclusive))
    return torch.cummax(stepped, 1).values


def find_prefix_sum(
    tree: Tree, fractions: torch.Tensor, cums: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leaves at ``fractions`` (float64 in ``[0, 1)``, on the tree's device) of a
    sum-tree's total, and that total (0-d): for ``u = fraction * total`` the leaf ``i``
    with ``sum(leaves[:i]) <= u < sum(leaves[:i + 1])``.

    Never returns a zero leaf while the total is positive (when rounding puts ``u`` at or
    past a node's sum, the last positive child is taken). ``cums``: :func:`top_prefix`.
    """
    if cums is None:
        cums = top_prefix(tree)
    tot = cums[-1]
    top = tree[-1]
    u = fractions * tot
    node = torch.searchsorted(cums[1:], u, right=True)
    node = torch.where(node >= top.shape[0], _last_positive(top), node)
    u = u - cums[node]
    for j in range(len(tree) - 2, -1, -1):
        children = tree[j].view(-1, FANOUT)[node]  # [B, FANOUT]
        inclusive = _ordered_sums(children)
        child = (inclusive <= u[:, None]).sum(1)
        child = torch.where(child >= FANOUT, _last_positive(children), child)
        exclusive = torch.nn.functional.pad(inclusive[:, :-1], (1, 0))
        before = exclusive.gather(1, child[:, None]).squeeze(1)
        u = u - before
        node = node * FANOUT + child
    return node, tot
