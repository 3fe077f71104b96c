"""How a :class:`~xpbank.table.Table` draws a batch: ``B`` successive single samples, as
in Reverb, vectorized.

- Ordered selectors (FIFO, LIFO, min- and max-heap) hand out their first item until it
  may be sampled no more, then the next: without ``max_times_sampled`` that is the first
  item ``B`` times (Reverb's behaviour); with it, each item at most its remaining count
  (:func:`counts_in_order`).
- Random selectors (uniform, prioritized) with a limit draw by rejection
  (:func:`accept_draws`): a round draws the missing items i.i.d. from the current
  distribution and keeps each draw unless its item was already drawn as often as it may
  be (its rank among the round's draws of it reaches its remaining count); items used up
  leave the table and the rejected draws are drawn again in the next round. Given the
  draws kept so far, a kept draw is distributed as the next of ``B`` successive single
  samples would be (a draw from the items still there, with their weights), so the
  batch is Reverb's, and the first draw of every round is kept (the round's
  distribution holds only items with draws left): at most ``B`` rounds, usually 1 or 2.
"""

from __future__ import annotations

import numpy as np

__all__ = ["accept_draws", "counts_in_order", "occurrence_rank"]


def occurrence_rank(values: np.ndarray) -> np.ndarray:
    """For each element, how many equal elements come before it.

    Example:
        >>> occurrence_rank(np.array([5, 3, 5, 5, 3])).tolist()
        [0, 0, 1, 2, 1]
    """
    n = values.shape[0]
    order = np.argsort(values, kind="stable")
    ranked = values[order]
    idx = np.arange(n)
    start = np.ones(n, dtype=bool)
    start[1:] = ranked[1:] != ranked[:-1]
    first = np.maximum.accumulate(np.where(start, idx, 0))
    out = np.empty(n, dtype=np.int64)
    out[order] = idx - first
    return out


def accept_draws(draws: np.ndarray, usable: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """The mask of draws to keep: usable ones whose rank among the usable draws of their
    item is below the item's ``remaining`` count (all three aligned with ``draws``).

    Example:
        >>> accept_draws(np.array([1, 2, 1, 1]), np.ones(4, bool), np.array([2, 5, 2, 2])).tolist()
        [True, True, True, False]
    """
    keep = np.zeros(draws.shape[0], dtype=bool)
    idx = np.flatnonzero(usable)
    keep[idx] = occurrence_rank(draws[idx]) < remaining[idx]
    return keep


def counts_in_order(remaining: np.ndarray, need: int) -> np.ndarray:
    """How many draws each candidate gives, in order, to make ``need`` (the candidates'
    ``remaining`` counts add up to at least ``need``).

    Example:
        >>> counts_in_order(np.array([2, 3, 4]), 4).tolist()
        [2, 2]
    """
    cum = np.cumsum(remaining)
    m = int(np.searchsorted(cum, need)) + 1
    counts = remaining[:m].copy()
    counts[-1] -= int(cum[m - 1]) - need
    return counts
