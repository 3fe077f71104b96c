"""Priority updates by global id: each id to its shard, every shard checked before any writes.

An update names items by the global ids a sample returned (``local * S + shard``, see
:mod:`xpbank.distributed.ray.ids`). :func:`route_priorities` splits them by shard, asks
every involved shard to check its ids in parallel (never issued, or overwritten / lost
in a restart), raises the first problem as the local buffer would (in global ids), and
only then sends the writes. A shard that is down gets nothing (the health tracker is
told); an item overwritten between the check and the write is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank.distributed.ray.ids import id_problem, split_by_shard
from xpbank.errors import ShardUnavailableError

__all__ = ["check_routed", "route_priorities"]


def check_routed(
    link: Any, health: Any, ids: np.ndarray, stale: str
) -> tuple[dict[int, np.ndarray], list[np.ndarray]]:
    """Split global ``ids`` by shard and have every involved shard check its own, in parallel.

    Returns ``({shard: local ids}, rows)`` (``rows[s]``: the positions of shard ``s``'s
    ids). A shard that is down is marked down in ``health`` and left out; with
    ``health=None`` it raises instead.

    Raises:
        XpbankIndexError: an id never issued.
        StaleIndexError: (``stale="raise"``) an overwritten or lost id.
        ShardUnavailableError: (``health=None``) an involved shard is down.
    """
    ids, rows = split_by_shard(ids, link.num_shards)
    local = {s: ids[r] // link.num_shards for s, r in enumerate(rows) if r.size}
    for s, problem in link.call_each({s: ("check_ids", (loc,)) for s, loc in local.items()}).items():
        if isinstance(problem, ShardUnavailableError):
            if health is None:
                raise problem
            health.mark_down(s, problem)
            local.pop(s)
        elif problem is not None:
            error = id_problem(s, problem, link.num_shards, stale)
            if error is not None:
                raise error
    return local, rows


def route_priorities(link: Any, health: Any, ids: np.ndarray, values: np.ndarray, stale: str) -> None:
    """Send checked ``values`` (float64, one per id) to the shards owning ``ids``.

    Args:
        link: the buffer's :class:`~xpbank.distributed.ray.link.ShardLink`.
        health: its :class:`~xpbank.distributed.ray.health.Health` (down shards are marked).
        ids: global ids (int64).
        values: their new priorities, already checked (finite, >= 0).
        stale: ``"raise"`` or ``"skip"``.

    Raises:
        XpbankIndexError: an id never issued; nothing is written.
        StaleIndexError: (``stale="raise"``) an overwritten or lost id; nothing is written.
    """
    local, rows = check_routed(link, health, ids, stale)
    writes = link.call_each({s: ("update_priority", (loc, values[rows[s]])) for s, loc in local.items()})
    for s, answer in writes.items():
        if isinstance(answer, ShardUnavailableError):
            health.mark_down(s, answer)
