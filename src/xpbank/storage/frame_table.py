"""Where each stored item's frames are: FrameStorage's read plan, kept at write time.

A read of ``obs`` and ``("next", "obs")`` from a :class:`~xpbank.FrameStorage` needs, per
item, the positions of ``stack + 1`` frames in its frame array: the item's stack (its own
newest frame and those of its ``stack - 1`` predecessors in the episode, the episode's
first frame repeated before it starts, or the all-zero frame with ``pad="zero"``) and the
next item's frame. :class:`FrameTable` keeps that row for every slot, written when the
item is (and its last column when its successor is), so a read is one table lookup
instead of following episode links. Two markers send a read to the storage's side
stores: the last column is ``-1`` where the next frame is not in the frame array (an
episode end, or an env's newest item), the first is ``-1`` where the whole stack is kept
aside (its older frames were overwritten). A row without either (``row.min() >= 0``) is
served by the frame array alone.

Layout: with ``E`` envs in lockstep (and a capacity they divide), env ``e``'s frames are
kept together, slot ``t * E + e`` at position ``e * (capacity // E) + t``, so an item's
stack and next frame are one run of memory (about 35% faster gathers than frames ``E``
slots apart, measured on Atari frames). Otherwise positions are slots.

After a state load the table is rebuilt from the episode index (loaded after the
storage) on first use; a saved state holds frames in slot order.

Example:
    >>> import numpy as np
    >>> table = FrameTable(capacity=8, stack=2, envs=2, zero_pad=False)
    >>> table.positions(np.arange(8)).tolist()  # env 0's slots first, then env 1's
    [0, 4, 1, 5, 2, 6, 3, 7]
    >>> ids = np.array([2, 4])  # env 0's items 2 (its episode's first) and 4
    >>> stack, pad = walk_stacks(ids, 2, lambda x: x - 2, lambda x: np.full_like(x, 2), 0)
    >>> stack.tolist(), pad.tolist()
    ([[2, 2], [2, 4]], [[True, False], [False, False]])
    >>> table.set_rows(ids % 8, stack, pad)
    >>> table.link(np.array([2]), np.array([4]))  # item 4 follows item 2
    >>> table.src[[2, 4]].tolist()  # positions of [older frame, own frame, next frame]
    [[1, 1, 2], [1, 2, -1]]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from xpbank.ring.ids import Ring

__all__ = ["FrameTable", "walk_stacks"]


def walk_stacks(
    ids: np.ndarray,
    stack: int,
    prev_of: Callable[[np.ndarray], np.ndarray],
    start_of: Callable[[np.ndarray], np.ndarray],
    floor: int,
) -> tuple[np.ndarray, np.ndarray]:
    """The ids of each item's stack ``[n, stack]`` (oldest first) and its padding.

    Walks back ``stack - 1`` steps through ``prev_of`` and stops at the episode's first
    item (``start_of(x) == x``), whose id then fills the columns before it (``pad``
    True there). A walk that reaches an id below ``floor`` (an item that will not be
    stored) stays on it: ``stack[:, 0] < floor`` marks those items.
    """
    n = ids.shape[0]
    out = np.empty((n, stack), dtype=np.int64)
    pad = np.zeros((n, stack), dtype=bool)
    cur = ids
    out[:, stack - 1] = cur
    for j in range(stack - 2, -1, -1):
        np.logical_or(pad[:, j + 1], start_of(cur) == cur, out=pad[:, j])
        cur = np.where(~pad[:, j] & (cur >= floor), prev_of(cur), cur)
        out[:, j] = cur
    return out, pad


class FrameTable:
    """Per slot, the positions of the frames an item's ``obs`` and next ``obs`` read.

    Args:
        capacity: slots (the frame array holds ``capacity + 1`` frames, the last zeros).
        stack: frames per observation.
        envs: envs in lockstep (``1``: positions are slots).
        zero_pad: padding reads the all-zero frame instead of the episode's first.
    """

    def __init__(self, capacity: int, stack: int, envs: int, zero_pad: bool):
        self.capacity, self.stack = capacity, stack
        self.envs = envs if envs > 1 and capacity % envs == 0 else 1
        self.rows = capacity // self.envs  # frames per env
        self.zero_pad = zero_pad
        self.src = np.full((capacity, stack + 1), -1, dtype=np.int64)
        self.stale = False  # rebuild from the episode index before the next use

    def positions(self, slots: np.ndarray) -> np.ndarray:
        """Where the frames of ``slots`` are in the frame array."""
        if self.envs == 1:
            return slots
        return slots % self.envs * self.rows + slots // self.envs

    def run(self, start: int, stop: int) -> tuple[int, int] | None:
        """``(first, count)`` when slots ``[start, stop)`` of every env are one step range
        ``[first, first + count)`` of each env's frames (a lockstep write), else ``None``."""
        e = self.envs
        if e == 1 or start % e or stop % e:
            return None
        return start // e, (stop - start) // e

    def set_rows(self, slots: np.ndarray, stack_ids: np.ndarray, pad: np.ndarray) -> None:
        """New items: their stacks (ids from :func:`walk_stacks`); next frames unknown yet."""
        rows = self.positions(stack_ids % self.capacity)
        if self.zero_pad:
            rows[pad] = self.capacity  # the all-zero frame
        self.src[slots, : self.stack] = rows
        self.src[slots, self.stack] = -1

    def link(self, slots: np.ndarray, successors: np.ndarray) -> None:
        """Items whose next frame is now stored: the successor's slot in the same episode."""
        self.src[slots, self.stack] = self.positions(successors)

    def mark_kept(self, slots: np.ndarray) -> None:
        """Items whose whole stack is now kept aside (rows set by :meth:`set_rows` later
        clear the mark: their slot holds a new item)."""
        self.src[slots, 0] = -1

    def rebuild(self, ring: Ring, kept: np.ndarray) -> None:
        """Every live item's row from the ring's episode index (after a state load);
        ``kept``: the slots whose stacks are kept aside."""
        links = ring.episodes.links()  # type: ignore[union-attr]
        c = self.capacity
        ids = np.arange(ring.first_id, ring.next_id, dtype=np.int64)
        slots = ids % c
        stack, pad = walk_stacks(
            ids, self.stack, lambda x: links.prev[x % c], lambda x: links.start[x % c], ring.first_id
        )
        self.set_rows(slots, stack, pad)
        succ = links.next[slots]
        follows = (succ >= 0) & ~(links.terminated[slots] | links.truncated[slots])
        self.link(slots[follows], succ[follows] % c)
        self.mark_kept(kept)
        self.stale = False

    def nbytes(self) -> int:
        return int(self.src.nbytes)
