"""Splitting a mixed batch's ids by source, checked in full before anything is written."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from xpbank.errors import PriorityError, ReadOnlyError, SpecError, XpbankIndexError
from xpbank.replay import ReplayBuffer
from xpbank.spec.batch import flatten

__all__ = ["split_by_source", "all_locks", "check_writable", "rows_of"]

# entries a Mixture adds to a batch that are no stored field: dropped before an update
MIXTURE_KEYS = ("source", "weight")


def _as_int_array(values: Any, name: str) -> np.ndarray:
    arr = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if arr.ndim != 1 or not (arr.size == 0 or np.issubdtype(arr.dtype, np.integer)):
        raise XpbankIndexError(
            f"{name}: expected a 1-D array of ints, got shape {arr.shape} dtype {arr.dtype}"
        )
    return arr.astype(np.int64, copy=False)


def split_by_source(source: Any, indices: Any, n_sources: int) -> dict[int, np.ndarray]:
    """``{source: positions}`` of each source named in ``source`` (positions into the batch).

    Raises:
        XpbankIndexError: ``source`` and ``indices`` differ in length, or a source
            number outside ``[0, n_sources)``.
    """
    src = _as_int_array(source, "source")
    ids = _as_int_array(indices, "indices")
    if src.shape != ids.shape:
        raise XpbankIndexError(f"source: expected one source per index ({ids.shape[0]}), got {src.shape[0]}")
    bad = src[(src < 0) | (src >= n_sources)]
    if bad.size:
        raise XpbankIndexError(f"source: expected numbers in [0, {n_sources}), got {int(bad[0])}")
    return {int(s): np.flatnonzero(src == s) for s in np.unique(src)}


@contextlib.contextmanager
def all_locks(buffers: Sequence[ReplayBuffer]) -> Iterator[None]:
    """Hold every buffer's lock, taken in source order (one order everywhere: no deadlock)."""
    with contextlib.ExitStack() as stack:
        for rb in buffers:
            stack.enter_context(rb.lock)
        yield


def check_writable(rb: ReplayBuffer, s: int) -> None:
    """Raise :class:`~xpbank.ReadOnlyError` if source ``s`` is a bank opened ``"r"``."""
    if getattr(rb.storage, "mode", None) == "r":
        raise ReadOnlyError(
            f"update: source {s} is a bank opened read-only (mode='r'); its items cannot be "
            "updated (open it with xpbank.open_bank(path, 'r+') to write); nothing was updated"
        )


def rows_of(
    values: Any, positions: np.ndarray, n_rows: int, rb: ReplayBuffer, s: int
) -> dict[Any, torch.Tensor]:
    """The rows ``positions`` of ``values`` (flat, the Mixture's own entries dropped) for source ``s``."""
    flat = {k: v for k, v in flatten(values).items() if k not in MIXTURE_KEYS and k != "index"}
    spec = rb.spec
    for key, value in flat.items():
        if value.ndim == 0 or value.shape[0] != n_rows:
            raise SpecError(
                f"update: field {key!r}: expected {n_rows} rows (one per index), "
                f"got shape {tuple(value.shape)}"
            )
        if spec is not None and key not in spec:
            raise SpecError(f"update: field {key!r} is not stored by source {s}; nothing was updated")
    take = torch.from_numpy(positions)
    return {k: v.index_select(0, take.to(v.device)) for k, v in flat.items()}


def check_priorities(priorities: Any, n: int) -> np.ndarray:
    """``priorities`` as float64, one finite number >= 0 per index."""
    p = priorities.detach().cpu().numpy() if isinstance(priorities, torch.Tensor) else np.asarray(priorities)
    p = p.astype(np.float64, copy=False).reshape(-1) if p.ndim <= 1 else p
    if p.ndim != 1 or p.shape[0] != n:
        raise PriorityError(f"priorities: expected {n} values (one per index), got shape {p.shape}")
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        raise PriorityError("priorities: expected finite numbers >= 0, got NaN, infinite or negative values")
    return p
