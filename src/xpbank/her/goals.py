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
  arithmetic. Each item's number of steps to its ``end`` (``left``, the item and its
  ``end`` included) is kept per slot in an :class:`EpisodeEnds`, caught up at sample
  time over the items written since (O(1) amortized per item, vectorized): a step ``y``
  whose env's next step is written and ``next[y] == -1`` closed its episode, and every
  live step of that episode gets its ``left`` in one ragged fill. An item without one
  (``0``) is in its env's open episode: ``end`` is the env's newest item. A ``future``
  draw is then ``t + stride * floor(u * left)``: a ``take`` and four small NumPy calls
  on the batch (``final``: ``left - 1`` steps on).
- with an env field (items not in lockstep): the episode is walked through the index's
  ``next`` / ``prev`` links, one vectorized step per episode step: the time grows with
  the episode's length (fine for the tens of steps of goal tasks).
"""

from __future__ import annotations

import numpy as np

from xpbank.ring.episodes import EpisodeIndex
from xpbank.ring.ids import Ring
from xpbank.spec.spec import Spec, normalize_key

__all__ = ["STRATEGIES", "EpisodeEnds", "choose_goals", "ends_table", "episode_bounds", "stride_of"]

STRATEGIES = ("future", "final", "episode")


class EpisodeEnds:
    """Per slot, the number of steps from the item to the last written step of its
    episode, both included (``0``: the episode is still open), for a lockstep index;
    kept in ``episodes.derived``.

    Args:
        capacity: the ring's capacity.
        stride: ids between an env's consecutive items (``num_envs``, or 1).
    """

    def __init__(self, capacity: int, stride: int):
        self.left = np.zeros(capacity, dtype=np.int64)
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
        self.left[np.arange(lo, hi) % c] = 0  # new items: their episode is open so far
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
        self.left[(np.repeat(closed, count) - e * offsets) % c] = offsets + 1


def stride_of(episodes: EpisodeIndex, spec: Spec) -> int | None:
    """Ids between an env's consecutive items (``num_envs``, 1 for one stream), or
    ``None`` where items carry an env field (not in lockstep)."""
    if normalize_key(episodes.keys.env) in spec:
        return None
    return episodes.num_envs or 1


def ends_table(episodes: EpisodeIndex, ring: Ring, stride: int) -> EpisodeEnds:
    """The index's :class:`EpisodeEnds` for ``stride`` (made on first use), caught up."""
    key = ("her_ends", stride)
    table = episodes.derived.get(key)
    if table is None:
        table = episodes.derived[key] = EpisodeEnds(ring.capacity, stride)
    table.catch_up(ring, episodes)
    return table


def _lockstep_left(
    episodes: EpisodeIndex, ring: Ring, ids: np.ndarray, slots: np.ndarray | None, stride: int
) -> np.ndarray:
    """The steps from each item to its episode's last written step, both included
    (lockstep: from the ends table; ``slots``: ``ids % capacity`` where the caller has them)."""
    table = ends_table(episodes, ring, stride)
    left = table.left.take(ids % ring.capacity if slots is None else slots)  # take: 3x a fancy index
    if not left.all():  # the env's open episode: up to its newest item
        open_ = left == 0
        left[open_] = (ring.next_id - 1 - ids[open_]) // stride + 1
    return left


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
        end = ids + stride * (_lockstep_left(episodes, ring, ids, None, stride) - 1)
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
    slots: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """The id of the step whose next achieved goal relabels each item ``ids`` (live).

    Args:
        episodes: the buffer's episode index.
        ring: the buffer's ring.
        ids: the relabelled items' ids (int64).
        strategy: ``"future"``, ``"final"`` or ``"episode"``.
        uniform: one float64 in ``[0, 1)`` per item (the draw; ignored by ``"final"``).
        stride: :func:`stride_of` the index (``None``: walk the links).
        slots: ``ids % capacity``, where the caller has them (saves a NumPy call).
        out: an int64 array of ``len(ids)`` to write the goals into (lockstep
            ``future``/``final``), or ``None``.
    """
    if stride is not None and strategy != "episode":  # the first step is not needed
        left = _lockstep_left(episodes, ring, ids, slots, stride)
        if strategy == "final":
            left -= 1
            pick = left
        else:
            # floor(u * left) < left for every u < 1 and left < 2**53 (the product rounds
            # to at most the float below left), so no clamp to left - 1 is needed
            pick = (uniform * left).astype(np.int64)
        if stride != 1:
            pick *= stride
        return np.add(pick, ids, out=out)
    first, end, walked = episode_bounds(episodes, ring, ids, stride)
    if strategy == "final":
        return _into(end, out)
    if walked is None:  # lockstep "episode"
        count = (end - first) // stride + 1
        pick = (uniform * count).astype(np.int64)  # < count, as above
        pick *= stride
        return np.add(pick, first, out=out)
    # walked: position of each item in its column, and the column's number of live steps
    live = np.count_nonzero(walked[1:] != walked[:-1], axis=0) + 1
    here = np.argmax(walked == ids, axis=0)
    lo = here if strategy == "future" else np.zeros_like(here)
    count = live - lo
    j = lo + np.minimum((uniform * count).astype(np.int64), count - 1)
    return _into(walked[j, np.arange(ids.shape[0])], out)


def _into(values: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is None:
        return values
    out[...] = values
    return out
