"""The per-slot arrays of an :class:`~xpbank.EpisodeIndex` and how a planned write lands in them.

:class:`SlotLinks` holds each slot's env, neighbours, episode start and end flags (ids;
``-1``: none). :func:`write_slots` and :func:`write_slots_lockstep` record a
:class:`~xpbank.ring.episode_plan._Plan` in them once the ring has advanced past it.

A lockstep write lands as slices, the predecessors' ``next`` links included (one slice
one env step back). Stopping by flags: in lockstep mode a window stops at its first step
that ends its episode, or whose env's next id is not below ``ring.next_id``; for a live
item that is exactly where ``next`` is ``-1``. Two bytes of flags per slot, so a window's
flags lie within ``2 * (n - 1) * E + 2`` bytes, one cache line or two, where following
``next`` took a line per step.

Example:
    >>> links = SlotLinks.allocate(4)
    >>> links.next.tolist(), links.flags.shape
    ([-1, -1, -1, -1], (4, 2))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from xpbank.ring.episode_plan import MINUS_ONE, _Plan
from xpbank.storage.hugepages import advise_huge_pages

__all__ = ["RingView", "SlotLinks", "as_array", "as_ids", "write_slots", "write_slots_lockstep"]


class RingView(Protocol):
    """What the episode index reads of its ring (:class:`~xpbank.ring.ids.Ring`): which ids
    are live. Typed here so the index imports nothing from ``ids.py``, which names the
    index as ``Ring.episodes``."""

    @property
    def capacity(self) -> int: ...
    @property
    def next_id(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def first_id(self) -> int: ...


@dataclass(frozen=True)
class SlotLinks:
    """Per-slot views of an :class:`EpisodeIndex` (ids; ``-1``: none)."""

    env: np.ndarray
    prev: np.ndarray
    next: np.ndarray
    start: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    flags: np.ndarray  # [capacity, 2] bool: terminated, truncated (the two arrays above)
    # [4, capacity] int64 whose rows are env, prev, next and start (the arrays above), so a
    # compiled kernel takes them as one argument (each array argument costs ~0.2 µs)
    rows: np.ndarray | None = None

    @classmethod
    def allocate(cls, capacity: int) -> SlotLinks:
        """New arrays for ``capacity`` slots: no env history, no links, no ends."""
        rows = _huge_pages((4, capacity), -1)  # next is read at random by n-step sampling
        rows[0] = 0
        flags = np.zeros((capacity, 2), dtype=bool)  # one read: does a slot end, and how
        # the rows and the flags' columns: views
        return cls(rows[0], rows[1], rows[2], rows[3], flags[:, 0], flags[:, 1], flags, rows)


def write_slots(a: SlotLinks, plan: _Plan, ring: RingView) -> None:
    """Record a planned write in ``a``, after the ring has advanced past it (any plan)."""
    c, n = ring.capacity, plan.ids.shape[0]
    keep = slice(max(0, n - c), None)  # a batch over capacity keeps its tail
    first = int(plan.ids[keep.start]) % c
    count = n - keep.start
    slots: Any = slice(first, first + count) if first + count <= c else plan.ids[keep] % c
    a.env[slots] = plan.env[keep]
    a.prev[slots] = plan.prev[keep]
    a.start[slots] = plan.start[keep]
    a.terminated[slots] = plan.terminated[keep]
    a.truncated[slots] = plan.truncated[keep]
    a.next[slots] = -1
    link = plan.link if plan.link is not None else ~plan.fresh  # type: ignore[operator]
    live = link & (plan.prev >= ring.first_id)  # a live predecessor, same episode
    a.next[plan.prev[live] % c] = plan.ids[live]


def write_slots_lockstep(a: SlotLinks, plan: _Plan, ring: RingView, buffer: np.ndarray) -> np.ndarray | None:
    """:func:`write_slots` for a lockstep write whose predecessors are all live and whose
    slots and predecessors' slots are one run without a wrap: every array is written with
    slices. ``None`` (nothing written) otherwise.

    Args:
        a: the arrays written.
        plan: a lockstep plan (``plan.step``: items per env step).
        ring: the ring, advanced past the plan's items.
        buffer: ``n + e`` next links from the last call, reused where the length fits
            (the last ``e`` are always ``-1``).

    Returns:
        The buffer used (``buffer`` itself, or a new one of the right length) for the
        next call; ``None`` where the write needs :func:`write_slots`.
    """
    e, c, n = plan.step, ring.capacity, plan.ids.shape[0]
    first = ring.next_id - n  # the plan's first id (the ring has advanced)
    back = (first - e) % c  # the slot of the first item's predecessor
    if first - e < ring.first_id or back + n + e > c:
        return None
    lo, hi = back + e, back + e + n
    a.env[lo:hi] = plan.env
    a.prev[lo:hi] = plan.prev
    a.start[lo:hi] = plan.start
    a.terminated[lo:hi] = plan.terminated
    a.truncated[lo:hi] = plan.truncated
    # next of the predecessors (an item that starts an episode leaves -1) and of the
    # new items (-1: not written yet), in one slice from a reused buffer
    if buffer.shape[0] != n + e:
        buffer = np.full(n + e, -1, dtype=np.int64)
    head = buffer[:n]
    if plan.fresh is not None:  # one env step: no negation needed
        head[...] = plan.ids
        np.copyto(head, MINUS_ONE, where=plan.fresh)
    else:
        head.fill(-1)
        np.copyto(head, plan.ids, where=plan.link)
    a.next[back:hi] = buffer
    return buffer


def _huge_pages(shape: tuple[int, ...], fill: int) -> np.ndarray:
    """int64 entries of ``fill`` over transparent huge pages where the system gives them
    (see storage/hugepages.py: fewer TLB misses on scattered reads; 8 MB per 1M entries)."""
    block = torch.empty(shape, dtype=torch.int64)
    advise_huge_pages(block)  # before the first write maps the pages
    return block.fill_(fill).numpy()


def as_array(value: Any, dtype: Any) -> np.ndarray:
    """A saved array (a tensor, a NumPy array or a list) as NumPy of ``dtype``."""
    arr = value.numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
    return arr.astype(dtype, copy=False)


def as_ids(ids: Any) -> np.ndarray:
    """Item ids (an int, a list, an array or a tensor on any device) as flat int64 NumPy."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
    return arr.reshape(-1).astype(np.int64, copy=False)
