"""Global item ids of a sharded buffer: one int64 holds the shard and the shard's own id.

Each shard numbers its items itself, from 0, never reusing an id (as every
:class:`~xpbank.ReplayBuffer` does). The client hands out ``global = local * S + shard``
for ``S`` shards: ``shard = global % S`` and ``local = global // S``. The ids of one
shard stay in the order they were written, a global id is never reused (a local one is
not), and ids stay small non-negative int64 (a shard may write ``2**63 / S`` items).

Example:
    >>> import numpy as np
    >>> g = encode(np.array([0, 0, 7]), np.array([0, 2, 1]), num_shards=4)
    >>> g.tolist(), [a.tolist() for a in decode(g, num_shards=4)]
    ([0, 2, 29], [[0, 2, 1], [0, 0, 7]])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xpbank.errors import StaleIndexError, XpbankIndexError
from xpbank.ring.ids import _as_index_array

__all__ = ["decode", "encode", "id_problem", "lowest_id", "read_mark", "split_by_shard", "written_count"]


def encode(local: np.ndarray, shard: np.ndarray | int, num_shards: int) -> np.ndarray:
    """Global ids of the shards' own (``local``) ids: ``local * num_shards + shard``."""
    return np.asarray(local, dtype=np.int64) * num_shards + np.asarray(shard, dtype=np.int64)


def decode(ids: np.ndarray, num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """``(shard, local)`` of global ids (non-negative int64)."""
    ids = np.asarray(ids, dtype=np.int64)
    return ids % num_shards, ids // num_shards


def split_by_shard(ids: Any, num_shards: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Route global ids: ``(ids, rows)`` with ``rows[s]`` the positions of shard ``s``'s ids.

    Positions keep their order within a shard (a repeated id keeps its last value).

    Raises:
        XpbankIndexError: non-integer or multi-dimensional ids, or a negative id (never issued).
    """
    arr = _as_index_array(ids, "indices")
    if arr.size and arr.min() < 0:
        raise XpbankIndexError(f"indices: item {int(arr[arr < 0][0])} was never issued (ids are >= 0)")
    shard = arr % num_shards
    order = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[order], np.arange(num_shards + 1))
    return arr, [order[bounds[s] : bounds[s + 1]] for s in range(num_shards)]


def id_problem(shard: int, problem: dict[str, Any], num_shards: int, stale: str) -> Exception | None:
    """The error for a shard's :meth:`~xpbank.distributed.ray.shard.Shard.check_ids` answer,
    in global ids (``None``: a stale id with ``stale="skip"``, to be dropped)."""
    gid, first, nxt = (int(problem[k]) * num_shards + shard for k in ("id", "first", "next"))
    where = (
        f"shard {shard}, live ids {first} .. {nxt - num_shards} in steps of {num_shards}"
        if nxt > first
        else f"shard {shard} is empty"
    )
    if problem["kind"] == "never":
        return XpbankIndexError(f"indices: item {gid} was never issued ({where}); nothing was updated")
    if stale == "raise":
        return StaleIndexError(
            f"indices: item {gid} has been overwritten, cleared or lost in a shard restart ({where}); "
            "nothing was updated. Pass stale='skip' to drop such updates and write the rest."
        )
    return None


# -- a shard's restarts (xpbank.distributed.ray.shard) ----------------------------------
def lowest_id(ring: Any) -> int:
    """The lowest id ``ring`` holds or will hand out: a FIFO ring's oldest live id. A
    table reuses slots out of order (an old item may outlive many newer ones, and a slot
    freed early gets its next id, the old one plus the capacity, below the newest): the
    lowest, over its slots, of the live item's id or the slot's next one."""
    if not hasattr(ring, "inserted"):  # not a table's TableRing
        return int(ring.first_id)
    return int(np.where(ring.live, ring.ids, ring.ids + ring.capacity).min())


def written_count(ring: Any) -> int:
    """Items ``ring`` has stored so far (its ids count them, a table's do not)."""
    return int(ring.inserted) if hasattr(ring, "inserted") else int(ring.next_id)


def read_mark(path: Path) -> tuple[int, int]:
    """``(issued, written)``: above every id handed out, items written (0: unknown)."""
    data = path.read_bytes() if path.exists() else b""
    mark = [*np.frombuffer(data[: 8 * min(2, len(data) // 8)], dtype=np.int64).tolist(), 0, 0]
    return int(mark[0]), int(mark[1])
