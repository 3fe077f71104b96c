"""Which stored step gives each relabelled item its hindsight goal: the episode bounds and the draw.

A goal for item ``t`` is the *next* achieved goal of a step ``g`` of ``t``'s own episode
(the goal reached by acting at ``g``), chosen by a strategy (SB3's, inclusive):

- ``"future"``: ``g`` uniform over ``t, ..., end`` (``t`` itself included: its own
  outcome, so a relabelled item is sometimes a success);
- ``"final"``: ``g = end``;
- ``"episode"``: ``g`` uniform over the episode's live steps, ``first, ..., end``.

``end`` is the episode's last *written* step: its ending item (terminated or truncated,
or cut by :meth:`EpisodeIndex.truncate_newest <xpbank.EpisodeIndex.truncate_newest>`),
or, for the episode being written, the env's newest item, so a goal is never taken from
a step not yet written (nor from another env or episode). ``first`` is the episode's
first item, or its oldest live one where the ring has overwritten its start.

Two ways to find them, same answers (the tests compare them):

- lockstep (``num_envs=`` or one stream, no env field): an env's next item is
  ``stride`` ids later, so the episode's steps are ``t + stride * j`` and a draw is
  arithmetic. Each item's ``end`` is kept per slot in an :class:`EpisodeEnds`, caught up
  at sample time over the items written since (O(1) amortized per item, vectorized): a
  step ``y`` whose env's next step is written and ``next[y] == -1`` closed its episode,
  and every live step of that episode gets ``end = y`` in one ragged fill. An item
  without an ``end`` is in its env's open episode: ``end`` is the env's newest item.
- with an env field (items not in lockstep): the episode is walked through the index's
  ``next`` / ``prev`` links, one vectorized step per episode step: the time grows with
  the episode's length (fine for the tens of steps of goal tasks).
"""

from __future__ import annotations

import numpy as np

from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring
from xpbank.spec.spec import Spec, normalize_key

__all__ = ["STRATEGIES", "EpisodeEnds", "choose_goals", "episode_bounds", "stride_of"]

STRATEGIES = ("future", "final", "episode")


class EpisodeEnds:
    """Per slot, the id of the last written step of the item's episode (``-1``: the
    episode is still open), for a lockstep index; kept in ``episodes.derived``.

    Args:
        capacity: the ring's capacity.
        stride: ids between an env's consecutive items (``num_envs``, or 1).
    """

    def __init__(self, capacity: int, stride: int):
        self.end = np.full(capacity, -1, dtype=np.int64)
        self.stride = stride
        self.seen = 0  # items below this id have been looked at

    def reset(self) -> None:
        """A state was loaded: look at every live item again at the next catch-up."""
        self.seen = -1

    def catch_up(self, ring: Ring, episodes: EpisodeIndex) -> None:
        """Record the episodes closed by the items written since the last call."""
        hi, first, c, e = ring.next_id, ring.first_id, ring.capacity, self.stride
        lo = max(self.seen, first)
        if lo >= hi:
            return
        self.end[np.arange(lo, hi) % c] = -1  # new items: their episode is open so far
        # a step whose env's next step is written closes its episode where next is -1;
        # the env's newest step (the last stride ids) is looked at once its successor is
        cand = np.arange(max(lo - e, first), hi - e, dtype=np.int64)
        self.seen = hi
        if cand.size == 0:
            return
        links = episodes.links()
        closed = cand[links.next[cand % c] < 0]
        if closed.size == 0:
            return
        start = np.maximum(links.start[closed % c], first)
        count = (closed - start) // e + 1  # the live steps of each closed episode
        offsets = np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
        ends = np.repeat(closed, count)
        self.end[(ends - e * offsets) % c] = ends


def stride_of(episodes: EpisodeIndex, spec: Spec) -> int | None:
    """Ids between an env's consecutive items (``num_envs``, 1 for one stream), or
    ``None`` where items carry an env field (not in lockstep)."""
    if normalize_key(episodes.keys.env) in spec:
        return None
    return episodes.num_envs or 1


def _ends_table(episodes: EpisodeIndex, ring: Ring, stride: int) -> EpisodeEnds:
    key = ("her_ends", stride)
    table = episodes.derived.get(key)
    if table is None:
        table = episodes.derived[key] = EpisodeEnds(ring.capacity, stride)
    table.catch_up(ring, episodes)
    return table


def _lockstep_end(episodes: EpisodeIndex, ring: Ring, ids: np.ndarray, stride: int) -> np.ndarray:
    """The last written step of each item's episode (lockstep: from the ends table)."""
    end = _ends_table(episodes, ring, stride).end.take(ids % ring.capacity)  # take: 3x a fancy index
    open_ = end < 0
    if open_.any():  # the env's open episode: its newest item
        end[open_] = ids[open_] + stride * ((ring.next_id - 1 - ids[open_]) // stride)
    return end


def episode_bounds(
    episodes: EpisodeIndex, ring: Ring, ids: np.ndarray, stride: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """``(first, end, steps)`` of each live item's episode: its first live step and its
    last written step (ids), and, without a stride, the walked episode ``[L, B]`` of ids
    (``steps[j, i]``: the ``j``-th live step of item ``i``'s episode, repeated past its
    end); with a stride ``steps`` is ``None`` (step ``j`` is ``first + stride * j``)."""
    c, first_id = ring.capacity, ring.first_id
    links = episodes.links()
    if stride is not None:
        end = _lockstep_end(episodes, ring, ids, stride)
        start = links.start[ids % c]
        first = np.where(start >= first_id, start, ids - stride * ((ids - first_id) // stride))
        return first, end, None
    back = [ids]  # walk back to the episode's first live step
    while True:
        cur = back[-1]
        prev = links.prev[cur % c]
        more = (prev >= first_id) & (links.start[cur % c] != cur)
        if not more.any():
            break
        back.append(np.where(more, prev, cur))
    rows = back[::-1]
    fwd = ids
    while True:  # and forward to its last written step (a successor is always live)
        nxt = links.next[fwd % c]
        more = nxt >= 0
        if not more.any():
            break
        fwd = np.where(more, nxt, fwd)
        rows.append(fwd)
    walked = np.stack(rows)
    # each column repeats its first live step before it, its last after it: shift the
    # repeats at the top away (count them) so row j is the j-th live step
    top = np.arange(walked.shape[0] - 1)[:, None] < len(back) - 1
    lead = np.count_nonzero((walked[1:] == walked[:-1]) & top, axis=0)
    idx = np.minimum(np.arange(walked.shape[0])[:, None] + lead, walked.shape[0] - 1)
    walked = np.take_along_axis(walked, idx, axis=0)
    return walked[0], walked[-1], walked


def choose_goals(
    episodes: EpisodeIndex,
    ring: Ring,
    ids: np.ndarray,
    strategy: str,
    uniform: np.ndarray,
    stride: int | None,
) -> np.ndarray:
    """The id of the step whose next achieved goal relabels each item ``ids`` (live).

    Args:
        episodes: the buffer's episode index.
        ring: the buffer's ring.
        ids: the relabelled items' ids (int64).
        strategy: ``"future"``, ``"final"`` or ``"episode"``.
        uniform: one float64 in ``[0, 1)`` per item (the draw; ignored by ``"final"``).
        stride: :func:`stride_of` the index (``None``: walk the links).
    """
    if stride is not None and strategy != "episode":  # the first step is not needed
        first, end, walked = ids, _lockstep_end(episodes, ring, ids, stride), None
    else:
        first, end, walked = episode_bounds(episodes, ring, ids, stride)
    if strategy == "final":
        return end
    step = 1 if stride is None else stride
    if walked is None:
        lo = ids if strategy == "future" else first
        count = end - lo
        if step != 1:
            count //= step
        count += 1
        pick = (uniform * count).astype(np.int64)
        np.minimum(pick, count - 1, out=pick)  # in place: a few small NumPy calls fewer
        if step != 1:
            pick *= step
        pick += lo
        return pick
    # walked: position of each item in its column, and the column's number of live steps
    live = np.count_nonzero(walked[1:] != walked[:-1], axis=0) + 1
    here = np.argmax(walked == ids, axis=0)
    lo = here if strategy == "future" else np.zeros_like(here)
    count = live - lo
    j = lo + np.minimum((uniform * count).astype(np.int64), count - 1)
    return walked[j, np.arange(ids.shape[0])]
