"""The FIFO ring a replay front-end writes through: cursor, size and item ids.

Every item written gets an id, counted from 0 and never reused: ``slot = id % capacity``.
The live items are exactly the ids in ``[next_id - size, next_id)``, so an id handed out
with a sample can be checked later: once its slot has been overwritten (or the buffer
cleared) the id is no longer live. That is the per-slot write generation
(``id // capacity``) without storing one number per slot. :meth:`Ring.clear` moves
``next_id`` up to the next multiple of ``capacity`` so that ``slot = id % capacity``
keeps holding and no id is ever live twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.errors import StaleIndexError, XpbankIndexError

if TYPE_CHECKING:
    from xpbank.ring.episodes import EpisodeIndex

__all__ = ["Ring"]


@dataclass
class Ring:
    """Write position and fill level of a ring of ``capacity`` slots."""

    capacity: int
    next_id: int = 0
    size: int = 0
    # each item's env and episode bounds, when the buffer keeps them (see episodes.py)
    episodes: EpisodeIndex | None = field(default=None, repr=False, compare=False)

    @property
    def cursor(self) -> int:
        """The slot the next item goes to."""
        return self.next_id % self.capacity

    @property
    def rows(self) -> int:
        """Slots ``[0, rows)`` hold every live item (a ring's live slots are ``[0, size)``)."""
        return self.size

    @property
    def first_id(self) -> int:
        """The id of the oldest live item."""
        return self.next_id - self.size

    def segments(self, n: int) -> list[tuple[slice, slice]]:
        """Where ``n`` new items go: ``[(slots, rows), ...]``, split at the wrap point.

        When ``n > capacity`` only the last ``capacity`` rows are written (the others
        would be overwritten by the same call).
        """
        start_row = max(0, n - self.capacity)
        start = (self.next_id + start_row) % self.capacity
        count = n - start_row
        first = min(count, self.capacity - start)
        out = [(slice(start, start + first), slice(start_row, start_row + first))]
        if first < count:
            out.append((slice(0, count - first), slice(start_row + first, n)))
        return out

    def advance(self, n: int) -> None:
        """Record that ``n`` items were written at the cursor."""
        self.next_id += n
        self.size = min(self.size + n, self.capacity)

    def clear(self) -> None:
        """Forget every item; ids handed out so far become stale."""
        self.next_id = -(-self.next_id // self.capacity) * self.capacity
        self.size = 0
        if self.episodes is not None:
            self.episodes.clear()

    def ids_of_slots(self, slots: torch.Tensor) -> torch.Tensor:
        """The ids of the live items in ``slots`` (int64, same device)."""
        base = (self.next_id // self.capacity) * self.capacity  # id of slot 0 this lap
        cpu = slots.device.type == "cpu"  # NumPy's ops on 256 ints cost a third of torch's
        if self.size < self.capacity or self.cursor == 0:
            # not wrapped since the last clear: every live slot is this lap's; or full and
            # just wrapped: all are last lap's
            offset = base if self.size < self.capacity else base - self.capacity
            return torch.from_numpy(slots.numpy() + offset) if cpu else slots + offset
        # slots at or past the cursor hold last lap's items
        if not cpu:
            return slots + base - self.capacity * (slots >= self.cursor)
        s = slots.numpy()
        return torch.from_numpy(s + np.where(s >= self.cursor, base - self.capacity, base))

    def slots_of_positions(self, positions: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots, ids)`` of logical positions (0 = oldest, -1 = newest).

        Raises:
            XpbankIndexError: a position outside ``[-size, size)``.
        """
        ids = check_positions(positions, self.size) + self.first_id
        return torch.from_numpy(ids % self.capacity), torch.from_numpy(ids)

    def slots_of_ids(self, ids: Any) -> torch.Tensor:
        """The slots of live ``ids``.

        Raises:
            StaleIndexError: an id whose item was overwritten or cleared, or never written.
        """
        arr = _as_index_array(ids, "indices")
        if arr.size and (arr.min() < self.first_id or arr.max() >= self.next_id):
            stale = int(arr[(arr < self.first_id) | (arr >= self.next_id)][0])
            when = "has not been written yet" if stale >= self.next_id else "has been overwritten or cleared"
            live = (
                f"live items: {self.first_id} .. {self.next_id - 1}" if self.size else "the buffer is empty"
            )
            raise StaleIndexError(
                f"indices: item {stale} {when} ({live}); nothing was updated. "
                "Use the 'index' of a recent sample."
            )
        return torch.from_numpy(arr % self.capacity)

    def state_dict(self) -> dict[str, int]:
        return {"capacity": self.capacity, "next_id": self.next_id, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_id, self.size = int(state["next_id"]), int(state["size"])


def check_positions(positions: Any, size: int) -> np.ndarray:
    """Logical positions (0 = oldest, -1 = newest) of ``size`` items as int64 in ``[0, size)``.

    Raises:
        XpbankIndexError: not 1-D integers, or a position outside ``[-size, size)``.
    """
    pos = _as_index_array(positions, "indices")
    if pos.size and (pos.min() < -size or pos.max() >= size):
        bad = pos[(pos < -size) | (pos >= size)][0]
        raise XpbankIndexError(
            f"indices: position {int(bad)} is out of range for a buffer holding "
            f"{size} items (valid: -{size} .. {size - 1})"
        )
    return np.where(pos < 0, pos + size, pos)


def _to_numpy(values: Any) -> np.ndarray:
    """``values`` as a NumPy array: a CPU tensor's memory shared, others converted
    (bfloat16, which NumPy lacks, as float32: a mixed-precision TD error is a priority)."""
    if isinstance(values, torch.Tensor):
        try:
            return values.numpy()  # no detach/cpu calls (~2 µs) for the usual CPU tensor
        except (RuntimeError, TypeError):  # requires grad, not on the CPU, bfloat16, or
            # a negative view (the imaginary part of a conjugate): its values, resolved
            values = values.detach().cpu().resolve_neg()
            return (values.float() if values.dtype == torch.bfloat16 else values).numpy()
    return np.asarray(values)


_INT64_MAX = np.uint64(2**63 - 1)


def _as_index_array(values: Any, name: str) -> np.ndarray:
    """A 1-D int64 NumPy array of indices from an int, sequence, range, array or tensor.

    Unsigned values convert exactly; one above int64's max is out of range (it would
    otherwise wrap to a negative index: 2**64 - 1 to -1, the newest item).
    """
    arr = _to_numpy(values)
    if arr.dtype.kind not in "iu":  # np.integer's kinds (bool is "b")
        if arr.size == 0:
            return np.zeros(0, dtype=np.int64)
        raise XpbankIndexError(f"{name}: expected integers, got dtype {arr.dtype}")
    if arr.ndim > 1:
        raise XpbankIndexError(f"{name}: expected a 1-D sequence of integers, got shape {arr.shape}")
    if arr.dtype == np.uint64 and arr.size and arr.max() > _INT64_MAX:  # would wrap to negatives
        bad = int(arr[arr > _INT64_MAX].reshape(-1)[0])
        raise XpbankIndexError(f"{name}: {bad} is out of range (an index is at most 2**63 - 1)")
    return arr.reshape(-1).astype(np.int64, copy=False)
