"""An optional compiled kernel (numba) for n-step sampling: window, return, discount.

:meth:`NStep.gather <xpbank.NStep.gather>` walks each sampled item's window
(:meth:`EpisodeIndex.walk_slots <xpbank.EpisodeIndex.walk_slots>`), reads the window's
rewards and reduces them (:func:`~xpbank.nstep.returns.nstep_sum`): a dozen NumPy calls,
each costing its per-call overhead. With numba installed (the ``fast`` extra)
the whole of it is one compiled loop over the batch, :func:`nstep_window`, with the same
results: the same slots, steps and flags, and the return summed in float64 one step
after another from step 0 (as :func:`~xpbank.nstep.returns.nstep_sum`), then cast to
float32.

:func:`nstep_gather` goes one step further for packed CPU rows (``TensorStorage``): the
same pass also writes the sampled rows, each item's fields from its row and the next
fields from its window's last row, copying only the machine words that hold them (the
plan of :mod:`xpbank.storage.pair_rows`), and prefetching (:mod:`xpbank._jit.prefetch`) the
lines of the item ``AHEAD`` places on so their cache misses overlap. The rows of
``[B]`` items then cost about one pass over what is returned, instead of a gather of
``2B`` whole rows. The n-step values are written into the same output rows, after the
row's bytes (:meth:`PairRows.with_extras
<xpbank.storage.pair_rows.PairRows.with_extras>`), so a sample makes one array.

In lockstep mode both keep a :class:`~xpbank.nstep.table.WindowTable`: the results of the items whose
windows are complete, filled in id order as items become complete, so that a sampled
item's window is read from one 8-byte cell instead of walked (a reward line per step and
the flags).

The row lines of the sampled items are prefetched non-temporally
(:func:`~xpbank._jit.prefetch.prefetch_once`): each is read once, and a non-temporal
prefetch displaces less of the Python state the rest of the sample needs. The window
table is filled at the start of each kernel call, for the items completed since the last
one, in id order (the table's ``hi`` only moves up until a reset); the kernel restarts
the table where it finds ``next_id`` below ``hi``. One kernel serves both
:func:`nstep_window` and :func:`nstep_gather`; its source is
:mod:`xpbank.nstep.kernel_loop`, and numba's disk cache is keyed on that file only: after
editing :mod:`xpbank._jit.prefetch` or :mod:`xpbank.nstep.table`, delete
``src/xpbank/**/__pycache__/*.nb[ic]``.

The NumPy path stays the reference and runs where numba is missing, where the
environment variable ``XPBANK_NO_NUMBA=1`` is set (read once, at this module's import),
or where the reward field has no NumPy host view of dtype float32/float64.

Example:
    >>> import numpy as np
    >>> from xpbank.nstep.kernel import flags_view, kernel, nstep_window
    >>> nxt = np.array([2, 3, 4, -1, -1, -1])  # [6 slots] env 0: 0 -> 2 -> 4; env 1: 1 -> 3
    >>> flags = np.zeros((6, 2), dtype=bool)  # (terminated, truncated) of each slot
    >>> flags[3, 0] = True  # item 3 terminates
    >>> reward = np.ones(6, dtype=np.float32)
    >>> # (pair, steps, returns, discounts, terminated) of items 0 and 1, where numba is installed
    >>> kernel() is None or [a.tolist() for a in nstep_window(
    ...     np.array([0, 1]), 2, 6, 6, nxt, flags_view(flags), reward, 0.5 ** np.arange(4.0))] == [
    ...     [0, 1, 4, 3], [3, 2], [1.75, 1.5], [0.125, 0.0], [False, True]]
    True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank.errors import install_hint
from xpbank.nstep.kernel_loop import AHEAD as AHEAD  # the kernel's prefetch distance
from xpbank.nstep.kernel_loop import _cell, _nstep_gather, _window
from xpbank.nstep.table import NO_TABLE, WindowTable
from xpbank.storage.pair_rows import PairRows

__all__ = [
    "flags_view",
    "kernel",
    "kernel_plan",
    "nstep_gather",
    "nstep_rows",
    "nstep_window",
]

DISABLED = not _jit.ENABLED  # read once, at import (xpbank._jit)
_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call
#: the per-item values the kernel writes after each output row: (key, dtype), in order
EXTRAS: tuple[tuple[str | None, np.dtype], ...] = (
    ("nstep_return", np.dtype(np.float32)),
    ("nstep_discount", np.dtype(np.float32)),
    ("nstep_steps", np.dtype(np.int64)),
    ("nstep_terminated", np.dtype(np.bool_)),
    (None, np.dtype(np.int64)),  # the window's last slot (nstep_window's pairs)
)
_NO_WORDS = np.zeros((1, 1), dtype=np.uint64)  # nstep_window: no rows to copy
_NO_PLAN = np.zeros((0, 3), dtype=np.uint64)


def flags_view(flags: np.ndarray) -> np.ndarray:
    """The index's ``[capacity, 2]`` bool ``(terminated, truncated)`` array as ``[capacity]``
    uint16 (a view): non-zero where the slot ends its episode."""
    return flags.view(np.uint16).reshape(flags.shape[0])


def kernel() -> Callable[..., Any] | None:
    """The compiled kernel (numba, ``cache=True``; compiled on first use), or ``None``
    where numba is missing or ``XPBANK_NO_NUMBA=1`` was set: callers then take the
    NumPy path."""
    if not _compiled:
        kernels = _jit.compile_kernels(_nstep_gather, helpers=(_window, _cell))
        _compiled.append(None if kernels is None else kernels[0])
    return _compiled[0]


def nstep_rows(pairs: PairRows) -> PairRows:
    """``pairs`` with the n-step values (:data:`EXTRAS`) after each output row: what
    :func:`nstep_gather` writes and reads back."""
    return pairs.with_extras(EXTRAS)


def kernel_plan(rows: PairRows) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel's copy plan and value offsets for output ``rows`` (from
    :func:`nstep_rows`): ``runs`` ``[m, 3]`` uint64 ``(first word, end word, 0: item /
    1: partner)``, ``mixed`` ``[q, 3]`` uint64 ``(word, item bits, partner bits)`` and
    the byte offsets of the :data:`EXTRAS` (int64)."""
    plan = rows.plan
    runs = np.zeros((plan.runs.shape[0], 3), dtype=np.uint64)
    runs[:, :2] = plan.runs
    runs[:, 2] = plan.run_src
    mixed = np.zeros((plan.mixed.shape[0], 3), dtype=np.uint64)
    mixed[:, 0] = plan.mixed
    mixed[:, 1] = plan.mask
    mixed[:, 2] = plan.keep
    return runs, mixed, np.array(rows.extra_offsets, dtype=np.int64)


def nstep_window(
    ids: np.ndarray,
    lockstep: int,
    capacity: int,
    next_id: int,
    nxt: np.ndarray,
    flags: np.ndarray,
    reward: np.ndarray,
    powers: np.ndarray,
    table: WindowTable | None = None,
    first_id: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each item's n-step window and its reduction, in one pass over the batch.

    Args:
        ids: ``[B]`` live item ids (int64; not checked).
        lockstep: ``num_envs`` in lockstep mode (an env's next item is that many ids
            later), or ``0``: follow the ``next`` links.
        capacity: the ring's capacity (slot = id % capacity).
        next_id: the ring's ``next_id`` (lockstep: an id from it on is not written yet).
        nxt: the per-slot ``next`` ids of the episode index (``-1``: none); read only
            when following links (``lockstep == 0``).
        flags: the index's ``(terminated, truncated)`` pairs as :func:`flags_view` gives
            them: a lockstep window stops at a slot that ends its episode (where ``next``
            is ``-1``, as at the newest step of an env, which ``next_id`` tells).
        reward: the reward of every slot (a NumPy view, strided or not; float32/float64).
        powers: ``gamma ** arange(n + 1)`` (float64): ``n = len(powers) - 1``.
        table: the buffer's :class:`~xpbank.nstep.table.WindowTable` (lockstep mode only), advanced and
            read; default none (every window walked).
        first_id: the ring's ``first_id`` (where a table starts filling).

    Returns:
        ``(pair, steps, returns, discounts, terminated)``: ``pair`` ``[2B]`` int64 the
        items' slots then their windows' last slots; ``steps`` int64 ``[B]``; float32
        ``returns`` and ``discounts`` (0 where the last step terminated); bool
        ``terminated`` ``[B]``. Equal to the NumPy path's.

    Raises:
        RuntimeError: numba is not available (see :func:`kernel`).
    """
    fn = kernel()
    if fn is None:
        raise RuntimeError(f"nstep_window: numba is not available ({install_hint('fast')})")
    b = ids.shape[0]
    rows = np.empty((b, _EXTRA_WORDS), dtype=np.uint64)
    t = table if table is not None else NO_TABLE
    fn(ids, next_id, first_id, lockstep, capacity, nxt, flags, reward, powers, t.cells, t.state,
       _NO_WORDS, _NO_PLAN, _NO_PLAN, _EXTRA_OFFSETS, rows)  # fmt: skip
    ret, disc, steps, done, last = _extras(rows, _EXTRA_OFFSETS)
    pair = np.concatenate([ids % capacity, last])
    return pair, steps, ret, disc, done


def nstep_gather(
    ids: np.ndarray,
    lockstep: int,
    capacity: int,
    next_id: int,
    nxt: np.ndarray,
    flags: np.ndarray,
    reward: np.ndarray,
    powers: np.ndarray,
    pairs: PairRows,
    table: WindowTable | None = None,
    first_id: int = 0,
) -> tuple[np.ndarray, ...]:
    """:func:`nstep_window` and the rows' read in one pass: each output row takes the
    item's fields from the item's row and the next fields from its window's last row,
    word by word as ``pairs.plan`` says, reading no other line of either row, and the
    n-step values after them (:func:`nstep_rows`).

    The loads of the item ``AHEAD`` places on (its row's lines, its table cell or its
    window's rewards and links; in lockstep mode the last row of a full window too) are
    prefetched, so the cache misses of several items overlap, as NumPy's ``take`` of
    whole rows gets from the hardware. Results equal :func:`nstep_window` followed by a
    gather of the pairs.

    Args:
        ids: ``[B]`` the live items' ids (int64, not checked).
        lockstep, capacity, next_id, nxt, flags, reward, powers, table, first_id: as
            :func:`nstep_window`.
        pairs: the storage's rows and copy plan (``TensorStorage.pair_rows``).

    Returns:
        ``(rows, last, steps, returns, discounts, terminated)``: ``rows`` ``[B, W]``
        output rows (read them with ``nstep_rows(pairs).read``: the fields and the
        n-step values), ``last`` the windows' last slots, the others as
        :func:`nstep_window`'s (views of ``rows``).

    Raises:
        RuntimeError: numba is not available (see :func:`kernel`).
    """
    fn = kernel()
    if fn is None:
        raise RuntimeError(f"nstep_gather: numba is not available ({install_hint('fast')})")
    out = nstep_rows(pairs)
    runs, mixed, offsets = kernel_plan(out)
    rows = out.empty(ids.shape[0])
    t = table if table is not None else NO_TABLE
    fn(ids, next_id, first_id, lockstep, capacity, nxt, flags, reward, powers, t.cells, t.state,
       out.words, runs, mixed, offsets, rows)  # fmt: skip
    ret, disc, steps, done, last = _extras(rows, offsets)
    return rows, last, steps, ret, disc, done


def _extras(rows: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, ...]:
    """The :data:`EXTRAS` columns of output rows, as views."""
    raw = rows.view(np.uint8)
    return tuple(
        raw[:, off : off + dtype.itemsize].view(dtype)[:, 0]
        for off, (_, dtype) in zip(offsets.tolist(), EXTRAS, strict=True)
    )


_EXTRA_OFFSETS = np.arange(len(EXTRAS), dtype=np.int64) * 8  # nstep_window's rows: the values alone
_EXTRA_WORDS = len(EXTRAS)
