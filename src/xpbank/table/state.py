"""A :class:`~xpbank.table.Table`'s state: the slots' arrays (ids, liveness, insertion
order, counts, priorities, versions, free slots), the uniform packing (a uniform draw
depends on it), counters and the rate limiter's counts. Every other order (the FIFO/LIFO
log, the heaps, the sum-tree) is rebuilt from the arrays on load."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import CapacityError
from xpbank.table import ops

__all__ = ["load_state_dict", "state_dict"]


def state_dict(t: Any) -> dict[str, Any]:
    """:meth:`Table.state_dict <xpbank.Table.state_dict>` (``{}`` before binding)."""
    if t.ring is None:
        return {}
    lim = t.limiter
    return {
        "slots": t.ring.arrays_state(),
        "dense": None if t.dense is None else torch.from_numpy(t.dense.state()),
        "budget": t.budget,
        "stuck": t.stuck,
        "writer_version": t.writer_version,
        "limiter": None
        if lim is None
        else {"inserts": lim.inserts, "samples": lim.samples, "deletes": lim.deletes},
    }


def load_state_dict(t: Any, state: dict[str, Any]) -> None:
    """:meth:`Table.load_state_dict <xpbank.Table.load_state_dict>`.

    Raises:
        CapacityError: a state of a table of another capacity.
    """
    ring = t.ring
    if ring is None or not state:
        return
    got = int(state["slots"]["ids"].shape[0])
    if got != ring.capacity:
        raise CapacityError(f"table state: {got} slots, this table has {ring.capacity}")
    ring.load_arrays(state["slots"])
    t._build(ring.capacity)
    t.budget, t.stuck = int(state["budget"]), int(state["stuck"])
    t.writer_version = int(state["writer_version"])
    if t.limiter is not None and state["limiter"] is not None:
        t.limiter.inserts = int(state["limiter"]["inserts"])
        t.limiter.samples = int(state["limiter"]["samples"])
        t.limiter.deletes = int(state["limiter"]["deletes"])
    ops.rebuild_orders(t, None if state["dense"] is None else np.asarray(state["dense"]))
    t.notify()
