"""Epoch plans: every item once per epoch, in minibatches (PPO-style passes)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from xpbank.errors import CapacityError

__all__ = ["epoch_plan"]


def epoch_plan(
    n: int,
    batch_size: int,
    n_epochs: int = 1,
    shuffle: bool = True,
    drop_last: bool = False,
    generator: torch.Generator | None = None,
) -> Iterator[torch.Tensor]:
    """Yield minibatches of positions ``[0, n)``: each epoch visits every position once.

    Args:
        n: number of items.
        batch_size: items per minibatch; the last one of an epoch is smaller unless
            ``drop_last``.
        n_epochs: passes over the items.
        shuffle: a fresh random order each epoch (else ``0, 1, ..., n-1``).
        drop_last: skip a last, short minibatch.
        generator: the randomness for ``shuffle``.

    Raises:
        CapacityError: ``batch_size`` or ``n_epochs`` is not positive.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise CapacityError(f"batch_size: expected a positive int, got {batch_size!r}")
    if isinstance(n_epochs, bool) or not isinstance(n_epochs, int) or n_epochs <= 0:
        raise CapacityError(f"n_epochs: expected a positive int, got {n_epochs!r}")
    stop = n - n % batch_size if drop_last else n
    for _ in range(n_epochs):
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, stop, batch_size):
            yield order[start : start + batch_size]
