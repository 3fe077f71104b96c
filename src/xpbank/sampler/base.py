"""The sampler protocol: which slots to read. A sampler returns indices, never data.

A sampler is told about writes (``on_write``) and clears (``on_clear``) so that it can
keep its own index structures (a sum-tree, episode boundaries) in step with the ring,
and it draws from the generator the front-end owns, so one seed fixes every sample.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import torch

from xpbank.ring.ids import Ring
from xpbank.storage.base import Slots

__all__ = ["Sampler"]


@runtime_checkable
class Sampler(Protocol):
    """What every sampler provides."""

    def sample(
        self, ring: Ring, batch_size: int, generator: torch.Generator, replace: bool = True
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Draw ``batch_size`` live slots.

        Returns:
            ``(slots, info)``: a 1-D int64 tensor of slots, and extra per-item entries
            to put in the batch (e.g. importance weights), possibly empty.
        """
        ...

    def on_write(self, slots: Slots, ring: Ring) -> None:
        """``slots`` were just (over)written with new items."""

    def on_clear(self) -> None:
        """Every item was dropped."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
