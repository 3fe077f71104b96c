"""Source weights of a :class:`~xpbank.mix.Mixture` and the per-batch counts they give.

A weight is a number or a schedule: a pure function of the mixture's step (the number
of ``sample`` calls made so far). :func:`split_counts` turns the weights of one step
into item counts that sum to the batch size exactly (largest remainders).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xpbank.errors import CapacityError

__all__ = ["Constant", "Linear", "Schedule", "as_schedule", "split_counts"]


@dataclass(frozen=True)
class Constant:
    """The same weight at every step.

    Example:
        >>> Constant(0.25)(10_000)
        0.25
    """

    value: float

    def __post_init__(self) -> None:
        _check_weight("Constant.value", self.value)

    def __call__(self, step: int) -> float:
        return float(self.value)


@dataclass(frozen=True)
class Linear:
    """A weight going linearly from ``start`` (step 0) to ``end`` (step ``steps`` and after).

    Args:
        start: the weight of the first batch.
        end: the weight from batch ``steps`` on.
        steps: the number of ``sample`` calls the change takes (> 0).

    Example:
        >>> s = Linear(start=0.5, end=0.0, steps=4)
        >>> [s(t) for t in range(6)]
        [0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    """

    start: float
    end: float
    steps: int

    def __post_init__(self) -> None:
        _check_weight("Linear.start", self.start)
        _check_weight("Linear.end", self.end)
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps <= 0:
            raise CapacityError(f"Linear.steps: expected an int > 0, got {self.steps!r}")

    def __call__(self, step: int) -> float:
        if step >= self.steps:
            return float(self.end)
        return float(self.start + (self.end - self.start) * (step / self.steps))


Schedule = Constant | Linear


def as_schedule(weight: float | Schedule, name: str) -> Schedule:
    """``weight`` as a schedule (a number becomes a :class:`Constant`)."""
    if isinstance(weight, Constant | Linear):
        return weight
    if isinstance(weight, bool) or not isinstance(weight, int | float):
        raise CapacityError(
            f"{name}: expected a number >= 0, Constant or Linear, got {type(weight).__name__}"
        )
    _check_weight(name, weight)
    return Constant(float(weight))


def split_counts(weights: Sequence[float], batch_size: int) -> list[int]:
    """Item counts per source for one batch: proportional to ``weights``, summing to ``batch_size``.

    Largest-remainder rounding: each source gets ``floor(batch_size * w / sum(w))``,
    then the items left over go one each to the sources with the largest fractional
    parts; equal fractional parts (to 9 decimals, so float error does not break a
    tie) go to the lower source index first. A source of
    weight 0 gets no items.

    Raises:
        CapacityError: every weight is 0.

    Example:
        >>> split_counts([1.0, 1.0, 1.0], 256)
        [86, 85, 85]
        >>> split_counts([0.9, 0.1], 7)
        [6, 1]
    """
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    if not total > 0:
        raise CapacityError(f"weights: expected at least one weight > 0 at this step, got {list(weights)}")
    quotas = batch_size * w / total
    counts = np.floor(quotas).astype(np.int64)
    left = batch_size - int(counts.sum())
    if left > 0:
        # stable sort on -remainder: ties keep source order; weight-0 sources have remainder 0
        # rounded to 9 decimals: fractional parts equal but for float error are ties
        remainder = np.where(w > 0, np.round(quotas - counts, 9), -1.0)
        order = np.argsort(-remainder, kind="stable")
        counts[order[:left]] += 1
    return [int(c) for c in counts]


def _check_weight(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise CapacityError(f"{name}: expected a finite number >= 0, got {value!r}")
