"""Epoch plans: every item once per epoch, in minibatches (PPO-style passes)."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from xpbank.errors import check_positive_int

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
        CapacityError: ``batch_size`` or ``n_epochs`` is not positive (raised at the
            call, not at the first ``next``).
    """
    batch_size = check_positive_int("batch_size", batch_size)
    n_epochs = check_positive_int("n_epochs", n_epochs)
    return _plan(n, batch_size, n_epochs, shuffle, drop_last, generator)


def _plan(
    n: int, batch_size: int, n_epochs: int, shuffle: bool, drop_last: bool, generator: torch.Generator | None
) -> Iterator[torch.Tensor]:
    stop = n - n % batch_size if drop_last else n
    for _ in range(n_epochs):
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for start in range(0, stop, batch_size):
            yield order[start : start + batch_size]
