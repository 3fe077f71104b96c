"""A sample's host-side pieces to a CUDA device in as few copies as the layout allows.

A sample is drawn on the host (slots, ids and weights come from NumPy), and each
``.to("cuda")`` of a small CPU tensor is a copy out of pageable memory that the host
waits for: two per sample of a CUDA storage (slots, ids), one per field when a CPU
storage delivers to the GPU. Here:

- :func:`slots_and_ids_to`: a CUDA storage's slots and the batch's ids in one copy;
- :func:`rows_to`: every field of a packed CPU block's rows in one copy of the whole
  rows, each field viewed out of them on the device (as a CUDA storage's own gather
  views its rows).

Each returns what ``.to(device)`` of each piece would, bit for bit. Measured on an H200
machine against the code before (``benchmarks/bench_cuda.py``, two alternating runs of
each in one session): a pinned CPU storage delivering sample(256) to the GPU went from
212-285 µs (2.6-2.7x raw torch on GPU data) to 132-150 µs (1.8-1.9x; SB3's
``ReplayBuffer(device="cuda")`` took 177-201 µs); the one copy of slots and ids for a
GPU storage made no difference measurable there (137-205 µs before, 138 after).
Page-locked staging (``torch.empty(..., pin_memory=True)`` per sample, then an
asynchronous copy) was slower in the same comparison (the pinned-storage sample
3.9-4.9x raw), so the copies here are plain ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.spec.spec import NestedKey
from xpbank.storage.blocks import torch_view

__all__ = ["rows_to", "slots_and_ids_to"]


def slots_and_ids_to(
    slots: torch.Tensor, ids: torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``slots`` and ``ids`` (CPU int64, one shape) on ``device`` in one copy, or
    ``None`` where they are not such a pair (the caller moves them one by one)."""
    if (
        slots.device.type != "cpu"
        or ids.device.type != "cpu"
        or slots.dtype != torch.int64
        or ids.dtype != torch.int64
        or slots.shape != ids.shape
    ):
        return None
    both = torch.stack((slots, ids)).to(device)
    return both[0], both[1]


def rows_to(storage: Any, slots: torch.Tensor, device: torch.device) -> dict[NestedKey, torch.Tensor] | None:
    """Every field of ``slots`` (CPU int64, any shape) of a CPU storage whose fields
    all live in one packed block of narrow rows (its ``host_reader``), on ``device``:
    one take of the rows, one copy, each field a view of the copied rows shaped
    ``[*slots.shape, *field shape]``, in spec order. ``None``: another layout."""
    reader = getattr(storage, "host_reader", None)
    block = getattr(storage, "host_block", None)
    if reader is None or block is None or slots.device.type != "cpu":
        return None
    taken = reader.records.take(slots.numpy().reshape(-1))  # whole rows, one NumPy call
    raw = torch.from_numpy(taken.view(np.uint8).reshape(taken.shape[0], block.row_bytes))
    rows = raw.to(device)
    member = {m.key: m for m in block.members}
    shape = tuple(slots.shape)
    out = {}
    for key in reader.keys:
        field = torch_view(rows, member[key])
        out[key] = field if len(shape) == 1 else field.unflatten(0, shape)
    return out
