"""The n-step results of complete windows, kept per slot: :class:`WindowTable`.

A lockstep buffer's (``num_envs=E``) item ``t`` has a complete window once all ``n`` of its
steps are written (``t + (n - 1) * E < next_id``); its return, length and last step's
``terminated`` never change after that, unless its rewards are rewritten. The compiled
n-step kernel (:mod:`xpbank.nstep.kernel`) fills a cell per such item, in id order, and
reads a sampled item's window from its cell (one cache line) instead of walking it.

The table is one of the index's derived structures (``rb.episodes.derived``), made on
the first sample. ``clear()`` needs nothing (new ids start at or above the filled
mark); :meth:`EpisodeIndex.load_state_dict <xpbank.EpisodeIndex.load_state_dict>`
resets it, as :meth:`ReplayBuffer.load_state_dict <xpbank.ReplayBuffer.load_state_dict>`
does for an empty state without an index (the ring's ids may move back). Writes into
storage views (``TensorStorage.view``) bypass it, as they bypass every check. Buffers
that follow links (an env field instead of ``num_envs``) keep no table: an env's next
item may come any time later, so whether a window is complete is not a function of the id.

Example:
    >>> import torch
    >>> from xpbank import NStep, ReplayBuffer
    >>> rb = ReplayBuffer(16, num_envs=2, nstep=NStep(3, 0.5), seed=0)
    >>> _ = rb.extend({"obs": torch.zeros(8, 1), "reward": torch.ones(8)})  # 4 steps of 2 envs
    >>> _ = rb.sample(4)  # with numba: the table is made, and filled for items 0 .. 3
    >>> [type(t).__name__ for t in rb.episodes.derived.values()] in ([], ["WindowTable"])
    True
"""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_TABLE_N", "NO_TABLE", "WindowTable"]

MAX_TABLE_N = 0xFFFF  # a table cell keeps k in 16 bits


class WindowTable:
    """The n-step results of a lockstep buffer's items whose windows are complete, one
    8-byte cell per slot: the return (float32), ``k``, and whether the last step
    terminated.

    A window is complete once all ``n`` of its steps are written (``id + (n - 1) * E <
    next_id``), and then it never changes: it stops at the first of its first ``n - 1``
    steps that ends the episode, and those flags, the steps' rewards and the last step's
    ``terminated`` are not rewritten after (:meth:`EpisodeIndex.truncate_newest
    <xpbank.EpisodeIndex.truncate_newest>` marks only each env's newest item, at most a
    complete window's last step, and only as truncated), except a reward by
    :meth:`ReplayBuffer.update <xpbank.ReplayBuffer.update>`, which calls
    :meth:`forget`. The kernel fills the cells of the items completed since its last
    call, in id order (one window walk per item written, over lines written recently),
    and reads a sampled item's window from its cell where the cell is filled.

    Args:
        capacity: the ring's capacity.
        n: the most steps in a window (at most ``MAX_TABLE_N``).
        lockstep: the buffer's ``num_envs`` (lockstep mode).

    Attributes:
        cells: ``[capacity, 2]`` uint32: the return's float32 bits, and ``k |
            terminated << 16`` (0: not filled; such an item's window is walked, and
            kept); ``returns`` and ``meta`` view the two columns.
        state: ``[hi, 1]`` int64: the cells of the live ids below ``hi`` are filled,
            or 0 where :meth:`forget` dropped them (the kernel advances it; a reset, or
            the kernel finding ``next_id`` below it, sets it back); the 1 says the table
            is in use.

    Example:
        >>> table = WindowTable(capacity=10, n=3, lockstep=2)
        >>> table.state.tolist()
        [0, 1]
    """

    def __init__(self, capacity: int, n: int, lockstep: int):
        if not 1 <= n <= MAX_TABLE_N:
            raise ValueError(f"WindowTable: n must be in 1 .. {MAX_TABLE_N}, got {n}")
        self.capacity, self.n, self.lockstep = capacity, n, lockstep
        self.cells = np.zeros((capacity, 2), dtype=np.uint32)
        self.returns = self.cells.view(np.float32)[:, 0]
        self.meta = self.cells[:, 1]
        self.state = np.array([0, 1], dtype=np.int64)

    def reset(self) -> None:
        """Forget every cell (the index and the stored items were loaded from a state, or
        an empty state without an index was: the ring's ids may have moved back)."""
        self.meta.fill(0)
        self.state[0] = 0

    def forget(self, ids: np.ndarray, first_id: int) -> None:
        """The rewards of items ``ids`` were rewritten: the windows that hold them are
        walked again (and kept again) when sampled."""
        steps = self.lockstep * np.arange(self.n, dtype=np.int64)
        owners = (np.asarray(ids, dtype=np.int64).reshape(-1, 1) - steps).reshape(-1)
        owners = owners[(owners >= first_id) & (owners < self.state[0])]
        self.meta[owners % self.capacity] = 0


#: the kernel's table where there is none (link-following mode): marked not in use
NO_TABLE = WindowTable(1, 1, 1)
NO_TABLE.state[1] = 0
