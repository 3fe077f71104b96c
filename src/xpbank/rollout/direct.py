"""Steps a front-end writes straight into a :class:`~xpbank.RolloutBuffer`'s views.

A front-end that indexes the rollout as tensors (``xpbank.compat``: rsl_rl's storage,
metta's ``Experience``) checks a step itself, writes each field at the slots
:meth:`DirectWrites.next_slots` gives (into ``rb.view(key).flatten(0, 1)``, NumPy or
torch, no validation: its own checks stand in for ``add``'s), then
:meth:`DirectWrites.advance` moves the cursors on as ``add``/``store`` would have. With
``RolloutBuffer(pack=False)`` every view is contiguous, so each field is one copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from xpbank.rollout.layout import SegmentLayout, TimeLayout, count_ends, span_of

__all__ = ["DirectWrites", "host"]


def host(x: torch.Tensor) -> np.ndarray | None:
    """``x`` as a NumPy array sharing its memory where it can (CPU), else a copy on the
    host, or ``None`` (a dtype NumPy lacks): what a front-end writes into host views.

    Example:
        >>> host(torch.ones(2)).tolist(), host(torch.ones(1, dtype=torch.bfloat16))
        ([1.0, 1.0], None)
    """
    try:
        return x.numpy()
    except (RuntimeError, TypeError):  # needs grad, another device, a dtype NumPy lacks
        try:
            return x.detach().cpu().numpy()
        except (RuntimeError, TypeError):
            return None


class DirectWrites:
    """``next_slots`` / ``advance``: the cursor side of a step written through ``view()``."""

    _layout: TimeLayout | SegmentLayout
    _all: np.ndarray
    _episode_steps: np.ndarray
    _episodes: list[int]

    def next_slots(self, env_ids: Any = None) -> np.ndarray:
        """Where the next step of ``env_ids`` (default: every env) goes: positions in
        ``view(key).flatten(0, 1)``, one per env. Nothing moves until :meth:`advance`.

        Threads: no lock, as ``add``; a write and its ``advance`` must not interleave with others.

        Raises:
            CapacityError: an env has no room (its rollout or segments are full).

        Example:
            >>> import torch
            >>> from xpbank import RolloutBuffer
            >>> rb = RolloutBuffer(num_envs=2, horizon=2, pack=False)
            >>> rb.add({"r": torch.zeros(2)})
            >>> slots = rb.next_slots()
            >>> rb.view("r").flatten(0, 1)[slots] = torch.tensor([1.0, 2.0]); rb.advance()
            >>> slots.tolist(), rb.view("r").tolist(), rb.ready()
            ([2, 3], [[0.0, 0.0], [1.0, 2.0]], True)
        """
        ids = self._all if env_ids is None else self._layout.ids(env_ids)
        return self._layout.slots(ids)

    def advance(self, env_ids: Any = None, ends: Sequence[Any] = ()) -> None:
        """Count the step written at :meth:`next_slots` of ``env_ids`` (default: every env)
        as stored, as ``add``/``store`` would after writing it.

        ``ends``: the step's ``(terminated, truncated)`` flags (``[n]``; ``None`` where
        absent), counted for ``stats()``'s episode lengths; without them nothing is counted.

        Threads: no lock, as ``add``.

        Raises:
            CapacityError: an env has no room; nothing changes.
        """
        if env_ids is None and not ends and self._layout.step_all():
            return  # every env at one step with room: the common case, O(1)
        ids = self._all if env_ids is None else self._layout.ids(env_ids)
        span = span_of(ids, self._all)
        if self._layout.contiguous(ids, span) is None:  # O(1) when every env is at one free step
            self._layout.slots(ids)  # raises where an env has no room
        if ends:
            count_ends(self._episode_steps, self._episodes, list(ends), ids, span)
        self._layout.advance(ids, span)
