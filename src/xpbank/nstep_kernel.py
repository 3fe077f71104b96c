"""An optional compiled kernel (numba) for n-step sampling: window, return, discount.

:meth:`NStep.gather <xpbank.NStep.gather>` walks each sampled item's window
(:meth:`EpisodeIndex.walk_slots <xpbank.EpisodeIndex.walk_slots>`), reads the window's
rewards and reduces them (:func:`~xpbank.nstep_returns.nstep_sum`): a dozen NumPy calls,
each costing its per-call overhead. With numba installed (``pip install xpbank[fast]``)
the whole of it is one compiled loop over the batch, :func:`nstep_window`, with the same
results: the same slots, steps and flags, and the return summed in float64 in the order
of ``np.dot(powers, by_step)`` (step 0 first), then cast to float32.

:func:`nstep_gather` goes one step further for packed CPU rows (``TensorStorage``): the
same pass also writes the sampled rows, each item's fields from its row and the next
fields from its window's last row, copying only the machine words that hold them (the
plan of :mod:`xpbank.storage.pair_rows`), and prefetching (:mod:`xpbank._prefetch`) the
lines of the item ``AHEAD`` places on so their cache misses overlap. The rows of
``[B]`` items then cost about one pass over what is returned, instead of a gather of
``2B`` whole rows.

The NumPy path stays the reference and runs where numba is missing, where the
environment variable ``XPBANK_NO_NUMBA=1`` is set (read once, at this module's import),
or where the reward field has no NumPy host view of dtype float32/float64.

Example:
    >>> import numpy as np
    >>> from xpbank.nstep_kernel import flags_view, kernel, nstep_window
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
from xpbank._prefetch import prefetch
from xpbank.storage.pair_rows import PairRows

__all__ = ["flags_view", "gather_outputs", "kernel", "nstep_gather", "nstep_window"]

DISABLED = not _jit.ENABLED  # read once, at import (xpbank._jit)
_compiled: list[Callable[..., Any] | None] = []  # [] until the first kernel() call
AHEAD = 8  # the kernel prefetches the lines of the item this many places ahead
# nstep_window's plan: no row words to copy (the kernel's types stay those of a real plan)
_NO_WORDS = np.zeros((1, 0), dtype=np.uint64)
_NO_RUNS = np.zeros((0, 2), dtype=np.uint64)
_NO_SRC = np.zeros(0, dtype=np.int64)
_NO_MIXED = np.zeros(0, dtype=np.uint64)
# the bits of a (terminated, truncated) pair read as one uint16 that say terminated
_TERMINATED = int(np.array([1, 0], dtype=np.uint8).view(np.uint16)[0])


def flags_view(flags: np.ndarray) -> np.ndarray:
    """The index's ``[capacity, 2]`` bool ``(terminated, truncated)`` array as ``[capacity]``
    uint16 (a view): non-zero where the slot ends its episode."""
    return flags.view(np.uint16).reshape(flags.shape[0])


def kernel() -> Callable[..., Any] | None:
    """The compiled kernel (numba, ``cache=True``; compiled on first use), or ``None``
    where numba is missing or ``XPBANK_NO_NUMBA=1`` was set: callers then take the
    NumPy path."""
    if not _compiled:
        kernels = _jit.compile_kernels(_nstep_gather)
        _compiled.append(None if kernels is None else kernels[0])
    return _compiled[0]


def nstep_window(
    ids: np.ndarray,
    lockstep: int,
    capacity: int,
    next_id: int,
    nxt: np.ndarray,
    flags: np.ndarray,
    reward: np.ndarray,
    powers: np.ndarray,
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
        raise RuntimeError("nstep_window: numba is not available (pip install xpbank[fast])")
    b = ids.shape[0]
    pair = np.empty(2 * b, dtype=np.int64)
    np.remainder(ids, capacity, out=pair[:b])  # the items' slots (the kernel works from the ids)
    steps = np.empty(b, dtype=np.int64)
    ret = np.empty(b, dtype=np.float32)
    disc = np.empty(b, dtype=np.float32)
    done = np.empty(b, dtype=np.bool_)
    rows = np.empty((b, 0), dtype=np.uint64)
    fn(ids, lockstep, capacity, next_id, nxt, flags, reward, powers, _NO_WORDS, _NO_RUNS, _NO_SRC,
       _NO_MIXED, _NO_MIXED, _NO_MIXED, rows, pair[b:], steps, ret, disc, done)  # fmt: skip
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
    out: tuple[np.ndarray, ...] | None = None,
) -> tuple[np.ndarray, ...]:
    """:func:`nstep_window` and the rows' read in one pass: each output row takes the
    item's fields from the item's row and the next fields from its window's last row,
    word by word as ``pairs.plan`` says, reading no other line of either row.

    The loads of the item ``AHEAD`` places on (its row's lines, its window's rewards and
    links; in lockstep mode the last row of a full window too) are prefetched, so the
    cache misses of several items overlap, as NumPy's ``take`` of whole rows gets from
    the hardware. Results equal :func:`nstep_window` followed by a gather of the pairs.

    Args:
        ids: ``[B]`` the live items' ids (int64, not checked).
        lockstep, capacity, next_id, nxt, flags, reward, powers: as :func:`nstep_window`.
        pairs: the storage's rows and copy plan (``TensorStorage.pair_rows``).
        out: arrays to fill, from :func:`gather_outputs` (a caller may view them, as
            tensors, before they are filled); default new ones.

    Returns:
        ``(rows, last, steps, returns, discounts, terminated)``: ``rows`` ``[B, W]``
        output rows (read them with ``pairs.read``), ``last`` the windows' last slots,
        the others as :func:`nstep_window`'s.

    Raises:
        RuntimeError: numba is not available (see :func:`kernel`).
    """
    fn = kernel()
    if fn is None:
        raise RuntimeError("nstep_gather: numba is not available (pip install xpbank[fast])")
    if out is None:
        out = gather_outputs(pairs, ids.shape[0])
    plan = pairs.plan
    fn(ids, lockstep, capacity, next_id, nxt, flags, reward, powers, pairs.words, plan.runs, plan.run_src,
       plan.mixed, plan.mask, plan.keep, *out)  # fmt: skip
    return out


def gather_outputs(pairs: PairRows, b: int) -> tuple[np.ndarray, ...]:
    """Empty outputs of :func:`nstep_gather` for ``b`` items: ``(rows, last, steps,
    returns, discounts, terminated)``."""
    return (
        pairs.empty(b),
        np.empty(b, dtype=np.int64),
        np.empty(b, dtype=np.int64),
        np.empty(b, dtype=np.float32),
        np.empty(b, dtype=np.float32),
        np.empty(b, dtype=np.bool_),
    )


def _nstep_gather(
    ids: Any,
    lockstep: Any,
    capacity: Any,
    next_id: Any,
    nxt: Any,
    flags: Any,
    reward: Any,
    powers: Any,
    words: Any,
    runs: Any,
    run_src: Any,
    mixed: Any,
    mask: Any,
    keep: Any,
    rows: Any,
    last_slot: Any,
    steps: Any,
    ret: Any,
    disc: Any,
    done: Any,
) -> None:  # pragma: no cover - compiled by numba; run only through kernel()
    """The kernel (numba nopython; outputs written in place). Iteration ``i`` prefetches
    item ``i``'s lines and then reads item ``i - AHEAD``: its window, then its output
    row from the two rows. The window mirrors ``walk_slots``: lockstep windows step
    ``lockstep`` slots on (wrapped without a division) and stop at the first step whose
    ``next`` would be ``-1`` (the slots after it are never read): the step ends its
    episode (``flags``: a full window's pairs lie within ``2 * (n - 1) * lockstep + 2``
    bytes, one line or two, where ``next`` took a line per step) or the env's next step
    has no id below ``next_id`` yet; link-following windows step to ``next`` until it is
    ``-1``. ``terminated`` of the last slot is its flags' ``_TERMINATED`` bits.
    Word indices are unsigned (no negative-index checks in the copy loops, which then
    compile to vector moves)."""
    b = ids.shape[0]
    n = powers.shape[0] - 1
    row_bytes = np.int64(words.strides[0])
    word = np.int64(words.strides[1])
    base = np.int64(words.ctypes.data)
    nxt_base, flags_base = np.int64(nxt.ctypes.data), np.int64(flags.ctypes.data)
    rew_base, rew_step = np.int64(reward.ctypes.data), np.int64(reward.strides[0])
    for i in range(b + AHEAD):
        if i < b:  # prefetch item i: its row's item words, the window's rewards and flags
            s0 = np.int64(ids[i]) % capacity
            last = s0
            prefetch(flags_base + s0 * 2)
            prefetch(rew_base + s0 * rew_step)
            if lockstep > 0:  # the window's slots are known: a full window's
                for _ in range(1, n):
                    last += lockstep
                    if last >= capacity:
                        last %= capacity
                    prefetch(rew_base + last * rew_step)
                if (flags_base + last * 2) >> 6 != (flags_base + s0 * 2) >> 6:
                    prefetch(flags_base + last * 2)
            else:  # following links: only the first is known
                prefetch(nxt_base + s0 * 8)
            for r in range(runs.shape[0]):
                if run_src[r] == 1 and lockstep == 0:
                    continue  # following links: the window's last row is not known yet
                row = base + (s0 if run_src[r] == 0 else last) * row_bytes
                line = row + np.int64(runs[r, 0]) * word
                line -= line % 64
                hi = row + np.int64(runs[r, 1]) * word
                while line < hi:
                    prefetch(line)
                    line += 64
            for q in range(mixed.shape[0]):
                prefetch(base + s0 * row_bytes + np.int64(mixed[q]) * word)
                prefetch(base + last * row_bytes + np.int64(mixed[q]) * word)
        j = i - AHEAD
        if j < 0:
            continue
        item = np.int64(ids[j])
        s0 = item % capacity
        slot = s0
        acc = 0.0
        k = 1
        while True:
            acc += powers[k - 1] * np.float64(reward[slot])
            if k == n:
                break
            if lockstep > 0:
                item += lockstep  # the env's next step
                if flags[slot] != 0 or item >= next_id:  # the episode ended, or not written yet
                    break
                slot += lockstep
                if slot >= capacity:
                    slot %= capacity
            else:
                after = nxt[slot]
                if after < 0:
                    break
                slot = after % capacity
            k += 1
        last_slot[j] = slot
        steps[j] = k
        ret[j] = np.float32(acc)
        ended = (flags[slot] & _TERMINATED) != 0
        done[j] = ended
        disc[j] = np.float32(0.0) if ended else np.float32(powers[k])
        for r in range(runs.shape[0]):
            row = s0 if run_src[r] == 0 else slot
            for w in range(runs[r, 0], runs[r, 1]):
                rows[j, w] = words[row, w]
        for q in range(mixed.shape[0]):
            w = mixed[q]
            rows[j, w] = (words[s0, w] & mask[q]) | (words[slot, w] & keep[q])
