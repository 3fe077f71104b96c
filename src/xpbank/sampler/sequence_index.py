"""Which windows a batch of new items completes: pure array work for SequenceSampler.

Each env's items are counted (its ``c``-th item) and the last ``history`` ids of each
env are kept in a small ring ``recent[env, c % history]``, so the item ``k`` steps back
in an env's stream is one read. An item's position in its episode is its count minus
the count of its episode's first item. Both are updated per batch with a stable sort by
env and running maxima, with no loop over items.

Example:
    >>> import numpy as np
    >>> window_priority(np.array([[1.0, 3.0, 2.0]]), np.array([[True, True, False]]), 0.5).tolist()
    [2.5]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank.ring.episodes import SlotLinks

__all__ = ["EnvStreams", "new_starts", "window_priority"]


class EnvStreams:
    """Per-env counters and the ids of each env's last ``history`` items."""

    def __init__(self, history: int):
        self.history = history
        self.count = np.zeros(0, dtype=np.int64)  # items of each env indexed so far
        self.last = np.zeros(0, dtype=np.int64)  # each env's newest indexed id (-1: none)
        self.start_count = np.zeros(0, dtype=np.int64)  # count of its episode's first item
        self.recent = np.zeros((0, history), dtype=np.int64)

    @property
    def width(self) -> int:
        return int(self.count.shape[0])

    def grow(self, width: int) -> None:
        if width <= self.width:
            return
        extra = width - self.width
        self.count = np.concatenate([self.count, np.zeros(extra, dtype=np.int64)])
        self.last = np.concatenate([self.last, np.full(extra, -1, dtype=np.int64)])
        self.start_count = np.concatenate([self.start_count, np.zeros(extra, dtype=np.int64)])
        self.recent = np.concatenate([self.recent, np.full((extra, self.history), -1, dtype=np.int64)])

    def clear(self) -> None:
        """Every item was dropped: the next item of each env starts afresh."""
        self.last[:] = -1

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count.copy(), "last": self.last.copy(), "start_count": self.start_count.copy(),
                "recent": self.recent.copy()}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.count = np.array(state["count"], dtype=np.int64)
        self.last = np.array(state["last"], dtype=np.int64)
        self.start_count = np.array(state["start_count"], dtype=np.int64)
        self.recent = np.array(state["recent"], dtype=np.int64).reshape(-1, self.history)


def new_starts(
    streams: EnvStreams,
    ids: np.ndarray,
    links: SlotLinks,
    capacity: int,
    window: int,
    stride: int,
    padded: bool,
    min_span: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """Index the consecutive new ``ids`` and return the window starts they complete.

    Padded windows need at least ``min_span`` real steps (burn-in + 1: one to train on).

    Returns:
        ``(start_ids, spans)``: each newly valid window's first id and how many of its
        ``window`` steps are real (``window``, or fewer when padded past an episode end).
        Starts may be already overwritten; the caller drops those.
    """
    slots = ids % capacity
    env = links.env[slots]
    streams.grow(int(env.max()) + 1)
    order = np.argsort(env, kind="stable")
    se, sid, ss = env[order], ids[order], slots[order]
    n = ids.shape[0]
    ar = np.arange(n)
    head = np.ones(n, dtype=bool)
    head[1:] = se[1:] != se[:-1]
    rank = ar - np.maximum.accumulate(np.where(head, ar, 0))
    if rank.max() >= streams.history - window:  # keep each env's lookups inside `recent`
        half = n // 2
        a = new_starts(streams, ids[:half], links, capacity, window, stride, padded, min_span)
        b = new_starts(streams, ids[half:], links, capacity, window, stride, padded, min_span)
        return np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]])
    count = streams.count[se] + rank
    # an episode's first item, or the first after items this index never saw
    fresh = (links.start[ss] == sid) | (head & (links.prev[ss] != streams.last[se]))
    anchor = np.maximum.accumulate(np.where(fresh | head, ar, 0))
    first = np.where(fresh, count, streams.start_count[se])[anchor]
    pos = count - first
    h = streams.history
    streams.recent[se, count % h] = sid
    last = np.ones(n, dtype=bool)
    last[:-1] = head[1:]
    envs = se[last]
    streams.count[envs] = count[last] + 1
    streams.last[envs] = sid[last]
    streams.start_count[envs] = first[last]

    back = window - 1
    full = (pos >= back) & ((pos - back) % stride == 0)
    starts = [streams.recent[se[full], (count[full] - back) % h]]
    spans = [np.full(int(full.sum()), window, dtype=np.int64)]
    if padded and back:
        ends = np.flatnonzero(links.terminated[ss] | links.truncated[ss])
        k = np.arange(min_span - 1, back)  # a start k steps before the last item: k + 1 real steps
        p = pos[ends, None] - k
        rows, col = np.nonzero((p >= 0) & (p % stride == 0))
        at, ks = ends[rows], k[col]
        starts.append(streams.recent[se[at], (count[at] - ks) % h])
        spans.append(ks + 1)
    return np.concatenate(starts), np.concatenate(spans)


def window_priority(errors: np.ndarray, mask: np.ndarray, eta: float) -> np.ndarray:
    """R2D2's sequence priority ``eta * max|d| + (1 - eta) * mean|d|`` over masked steps
    (0 for a row without any)."""
    err = np.where(mask, np.abs(errors), 0.0)
    mean = err.sum(axis=1) / np.maximum(mask.sum(axis=1), 1)
    return eta * err.max(axis=1, initial=0.0) + (1.0 - eta) * mean
