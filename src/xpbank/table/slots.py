"""The slots of a :class:`~xpbank.table.Table`: which hold live items, their ids, their
insertion order, sample counts, priorities and versions, and the free slots.

:class:`TableRing` takes the place of the buffer's FIFO :class:`~xpbank.ring.ids.Ring`
when a table is bound to it, so every path that turns ids into slots and back
(``update``, ``update_priority``, ``sample_by_index``, ``sample_all``, ``epochs``) works
for slots reused out of order.

Ids: the item written into slot ``s`` gets the id ``(previous id at s) + capacity``;
the first id at ``s`` is ``s``. So ``slot = id % capacity`` still holds, ids are never
reused, and an id is live iff its slot is live and holds that id: an O(1) stale check
per id, vectorized. Under pure FIFO use (no removals but the oldest) the slots are
written ``0, 1, ...`` and wrap, and the ids are exactly the FIFO ring's (``clear``
too moves every slot's next id to the next multiple of ``capacity``, as the ring does).

Free slots are a FIFO queue (a circular array): a write takes the slots that were freed
first. A queue that hands its items out oldest first frees slots in the ring's order,
so it keeps writing contiguous runs of slots (one ``storage.write`` of a slice) with
ids that count up by one, as a plain ring. ``in_order`` says that every slot was freed
at its own place in the queue (``free[p] == p``: the queue is the ring's order, as
after ``clear``), so taking free slots needs no lookup: they are ``head, head + 1, ...``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import StaleIndexError, XpbankIndexError
from xpbank.ring.ids import Ring, _as_index_array, check_positions

__all__ = ["TableRing"]


class TableRing(Ring):
    """A ring whose slots may be freed and reused in any order (see the module docstring).

    ``size`` is the number of live items; ``next_id`` is above every id issued so far;
    ``rows``: slots ``[0, rows)`` hold every live item (what a state or a bank saves).
    """

    keeps_ids = True  # each slot's id is ``ids[slot]`` (the buffer's fast read looks it up there)

    def __init__(self, capacity: int):
        super().__init__(capacity)
        c = capacity
        self.ids = np.arange(c, dtype=np.int64) - c  # the last id written at each slot
        self.live = np.zeros(c, dtype=bool)
        self.seq = np.zeros(c, dtype=np.int64)  # insertion order: the item's number
        self.stamp = np.zeros(c, dtype=np.int64)  # changes with the item's priority
        self.times = np.zeros(c, dtype=np.int64)  # times sampled
        self.priority = np.zeros(c, dtype=np.float64)
        self.version = np.zeros(c, dtype=np.int64)
        self.free = np.arange(c, dtype=np.int64)  # circular FIFO queue of free slots
        self.free_head, self.free_count = 0, c
        self.in_order = True  # free[p] == p for every p (see the module docstring)
        self.fifo_ids = True  # ids are the FIFO ring's for next_id (see fifo_ids_hold)
        self.inserted = 0  # items inserted so far: the next item's seq
        self.stamps = 0
        self._rows = 0
        self._index = np.arange(c, dtype=np.int64)  # slot numbers: a run's seqs without an arange

    @property
    def rows(self) -> int:
        """Slots ``[0, rows)`` hold every live item."""
        return self._rows

    # -- placement -----------------------------------------------------------------
    def take_free(self, n: int) -> np.ndarray:
        """The ``n`` slots freed first (``n <= free_count``), now taken."""
        head, c = self.free_head, self.capacity
        if self.in_order and head + n <= c:  # the queue is the ring's order: no lookup
            out = np.arange(head, head + n, dtype=np.int64)
        else:
            out = self.free[(head + np.arange(n)) % c]
        self.free_head = (self.free_head + n) % self.capacity
        self.free_count -= n
        return out

    def fifo_ids_hold(self) -> bool:
        """Whether every slot ``s`` holds the FIFO ring's id for ``next_id``: the newest id
        below ``next_id`` that is ``s`` mod capacity (``fifo_ids``, checked in O(capacity)).

        True after construction and :meth:`clear`, and kept by every insert into the slots
        ``next_id % capacity, ...`` (wrapping; the new ids then count up by one from
        ``next_id``); any other insert drops it, a loaded state checks it anew."""
        last = self.next_id - 1
        return bool(np.array_equal(self.ids, last - (last - self._index) % self.capacity))

    def insert_run(self, start: int, n: int) -> int:
        """:meth:`insert` of the free slots ``start .. start + n - 1`` (``n >= 1``, no
        wrap) by slice writes; returns the first id (the others follow by one where the
        ids are the FIFO ring's at ``next_id % capacity``, else see ``ids``)."""
        stop, c = start + n, self.capacity
        ids = self.ids[start:stop]
        ids += c
        self.live[start:stop] = True
        np.add(self._index[start:stop], self.inserted - start, out=self.seq[start:stop])
        np.add(self._index[start:stop], self.stamps - start, out=self.stamp[start:stop])
        self.times[start:stop] = 0
        return self.count_run(start, n)

    def count_run(self, start: int, n: int) -> int:
        """:meth:`insert_run`'s counters, its arrays written (by it, or by a compiled
        kernel: :mod:`xpbank.table.run_kernels`); returns the first new id."""
        stop, c = start + n, self.capacity
        self.inserted += n
        self.stamps += n
        self.size += n
        if self.fifo_ids and start == self.next_id % c:
            self.next_id += n  # the new ids are next_id .. next_id + n - 1
        else:
            self.fifo_ids = False
            self.next_id = max(self.next_id, int(self.ids[start:stop].max()) + 1)
        self._rows = max(self._rows, stop)
        return int(self.ids[start])

    def insert(self, slots: np.ndarray, run: slice | None = None) -> np.ndarray:
        """Mark free ``slots`` live with fresh ids, seqs and zero counts; returns the ids.
        ``run``: the same slots as a slice (they are contiguous), indexed without a lookup."""
        n = slots.shape[0]
        if self.fifo_ids and n:  # kept where the slots are the FIFO ring's next ones
            c, start = self.capacity, self.next_id % self.capacity
            self.fifo_ids = (
                run.start == start
                if run is not None
                else bool(np.array_equal(slots, (start + np.arange(n)) % c))  # e.g. a write over the wrap
            )
        at = slots if run is None else run
        ids = self.ids[at] + self.capacity
        self.ids[at] = ids
        self.live[at] = True
        self.seq[at] = np.arange(self.inserted, self.inserted + n)
        self.inserted += n
        self.stamp[at] = np.arange(self.stamps, self.stamps + n)
        self.stamps += n
        self.times[at] = 0
        self.size += n
        if n:
            self.next_id = max(self.next_id, int(ids.max()) + 1)
            self._rows = max(self._rows, int(slots[-1] if run is not None else slots.max()) + 1)
        return ids

    def restamp(self, slots: np.ndarray) -> None:
        """Give ``slots`` new stamps (their priority changed: older heap entries lapse)."""
        self.stamp[slots] = self.stamps + np.arange(slots.shape[0])
        self.stamps += slots.shape[0]

    def release(self, slots: np.ndarray) -> None:
        """Free live ``slots`` (distinct), last in the free queue."""
        k = slots.shape[0]
        self.live[slots] = False
        idx = (self.free_head + self.free_count + np.arange(k)) % self.capacity
        if not (self.in_order and np.array_equal(slots, idx)):  # in order: free[idx] == idx already
            self.in_order = False
            self.free[idx] = slots
        self.free_count += k
        self.size -= k

    def release_run(self, start: int, stop: int) -> None:
        """:meth:`release` of the live slots ``start, start + 1, ..., stop - 1``; where
        they are the next places of a free queue in the ring's order, nothing to look up."""
        k, c = stop - start, self.capacity
        if not (self.in_order and start == (self.free_head + self.free_count) % c and stop <= c):
            self.release(np.arange(start, stop, dtype=np.int64))
            return
        self.live[start:stop] = False  # free[p] == p there already
        self.free_count += k
        self.size -= k

    def clear(self) -> None:
        """Free every slot; every id issued so far becomes stale."""
        c = self.capacity
        base = -(-self.next_id // c) * c
        self.ids[:] = np.arange(c, dtype=np.int64) + (base - c)
        self.next_id = base
        self.live[:] = False
        self.free[:] = np.arange(c)
        self.free_head, self.free_count, self.size, self._rows = 0, c, 0, 0
        self.in_order = self.fifo_ids = True

    # -- ids and positions -----------------------------------------------------------
    def live_slots(self) -> np.ndarray:
        """The live slots, oldest first."""
        slots = np.flatnonzero(self.live[: self._rows])
        return slots[np.argsort(self.seq[slots], kind="stable")]

    def ids_of_slots(self, slots: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(self.ids[slots.cpu().numpy()])

    def slots_of_positions(self, positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots, ids)`` of positions in insertion order (0 = oldest live, -1 = newest).

        Raises:
            XpbankIndexError: a position outside ``[-size, size)``.
        """
        pos = check_positions(positions, self.size)
        slots = self.live_slots()[pos]
        return torch.from_numpy(slots), torch.from_numpy(self.ids[slots])

    def _stale(self, ids: np.ndarray) -> np.ndarray:
        """A mask of ``ids`` (issued ones) that are not live."""
        s = ids % self.capacity
        return ~self.live[s] | (self.ids[s] != ids)

    def _never(self, ids: np.ndarray) -> None:
        bad = (ids < 0) | (ids >= self.next_id)
        if bad.any():
            raise XpbankIndexError(
                f"indices: item {int(ids[bad][0])} was never issued (ids so far are below "
                f"{self.next_id}); nothing was updated"
            )

    def slots_of_ids(self, ids: Any) -> torch.Tensor:
        """The slots of live ``ids``.

        Raises:
            XpbankIndexError: an id never issued.
            StaleIndexError: an id whose item was removed, overwritten or cleared.
        """
        arr = _as_index_array(ids, "indices")
        self._never(arr)
        stale = self._stale(arr)
        if stale.any():
            raise StaleIndexError(
                f"indices: item {int(arr[stale][0])} has been removed, overwritten or cleared "
                f"({self.size} items are live); nothing was updated. Use the 'index' of a recent sample."
            )
        return torch.from_numpy(arr % self.capacity)

    def check_ids(self, ids: np.ndarray, values: np.ndarray, stale: str) -> tuple[np.ndarray, np.ndarray]:
        """``(slots, values)`` of a priority update's live ids (``stale="skip"`` drops the rest).

        Raises:
            XpbankIndexError: an id never issued.
            StaleIndexError: (``stale="raise"``) an id that is no longer live.
        """
        self._never(ids)
        dead = self._stale(ids)
        if dead.any():
            if stale == "raise":
                raise StaleIndexError(
                    f"indices: item {int(ids[dead][0])} has been removed, overwritten or cleared; "
                    "nothing was updated. Pass stale='skip' to drop such updates and write the rest."
                )
            ids, values = ids[~dead], values[~dead]
        return ids % self.capacity, values

    # -- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, int]:
        """The ring's counters and ``rows`` (the storage rows a state or bank keeps)."""
        return {**super().state_dict(), "rows": self._rows}

    _ARRAYS = ("ids", "live", "seq", "stamp", "times", "priority", "version", "free")

    def arrays_state(self) -> dict[str, Any]:
        """The slots' arrays (CPU tensors) and counters, for the table's state."""
        out: dict[str, Any] = {name: torch.from_numpy(getattr(self, name).copy()) for name in self._ARRAYS}
        out.update(
            free_head=self.free_head, free_count=self.free_count, inserted=self.inserted,
            stamps=self.stamps, rows=self._rows, next_id=self.next_id, size=self.size,
        )  # fmt: skip
        return out

    def load_arrays(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`arrays_state` (shapes checked by the caller)."""
        for name in self._ARRAYS:
            getattr(self, name)[:] = np.asarray(
                state[name].numpy() if hasattr(state[name], "numpy") else state[name]
            )
        self.free_head, self.free_count = int(state["free_head"]), int(state["free_count"])
        self.inserted, self.stamps, self._rows = (
            int(state["inserted"]),
            int(state["stamps"]),
            int(state["rows"]),
        )
        self.next_id, self.size = int(state["next_id"]), int(state["size"])
        self.in_order = bool(np.array_equal(self.free, np.arange(self.capacity)))
        self.fifo_ids = self.fifo_ids_hold()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.fifo_ids = self.fifo_ids_hold()  # next_id moved under the ids
