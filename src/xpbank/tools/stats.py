"""Statistics of a buffer computed in chunks, so a bank larger than memory works.

:class:`Moments` is a count, mean, sum of squared deviations, min and max;
:func:`moments` computes them for one array and :func:`combine` merges two (Chan et
al.'s parallel update), so a field is read one chunk at a time and never whole.

Example:
    >>> import numpy as np
    >>> m = combine(moments(np.array([1.0, 2.0])), moments(np.array([3.0, 4.0])))
    >>> m.count, m.mean, round(m.std, 4), m.min, m.max
    (4, 2.5, 1.118, 1.0, 4.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from xpbank.replay.buffer import ReplayBuffer
from xpbank.spec.spec import NestedKey
from xpbank.tools.episode_scan import CHUNK, iter_episodes

__all__ = ["Moments", "moments", "combine", "field_stats", "EpisodeStats", "episode_stats"]


@dataclass(frozen=True)
class Moments:
    """Count, mean, sum of squared deviations (``m2``), min and max of some numbers."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float = math.inf
    max: float = -math.inf

    @property
    def std(self) -> float:
        """The population standard deviation (0 for no numbers)."""
        return math.sqrt(self.m2 / self.count) if self.count else 0.0


def moments(values: np.ndarray) -> Moments:
    """The :class:`Moments` of every element of ``values`` (computed in float64)."""
    x = np.asarray(values, dtype=np.float64).ravel()
    if x.size == 0:
        return Moments()
    mean = float(x.mean())
    return Moments(int(x.size), mean, float(((x - mean) ** 2).sum()), float(x.min()), float(x.max()))


def combine(a: Moments, b: Moments) -> Moments:
    """The :class:`Moments` of the union of two sets of numbers."""
    if a.count == 0:
        return b
    if b.count == 0:
        return a
    n = a.count + b.count
    delta = b.mean - a.mean
    mean = a.mean + delta * b.count / n
    m2 = a.m2 + b.m2 + delta * delta * a.count * b.count / n
    return Moments(n, mean, m2, min(a.min, b.min), max(a.max, b.max))


def field_stats(
    buffer: ReplayBuffer,
    *,
    fields: list[NestedKey] | None = None,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> dict[NestedKey, Moments]:
    """Per field, the :class:`Moments` of all its stored elements, read ``chunk`` items at a time.

    Args:
        buffer: any buffer (an opened bank reads pages as it goes).
        fields: only these fields; default all.
        chunk: items read per step.
        progress: called with the number of items read after each step.

    Example:
        >>> import torch, xpbank
        >>> rb = xpbank.ReplayBuffer(10)
        >>> _ = rb.extend({"x": torch.tensor([[1.0, 3.0], [5.0, 7.0]])})
        >>> field_stats(rb, chunk=1)["x"].mean
        4.0
    """
    spec = buffer.spec
    if spec is None or len(buffer) == 0:
        return {}
    keys = list(spec) if fields is None else fields
    out = {key: Moments() for key in keys}
    n = len(buffer)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        batch = buffer.sample_by_index(np.arange(lo, hi), fields=keys)
        for key in keys:
            out[key] = combine(out[key], moments(batch[key].to(torch.float64).numpy()))
        if progress is not None:
            progress(hi - lo)
    return out


@dataclass(frozen=True)
class EpisodeStats:
    """The complete episodes found in a buffer: returns and lengths, oldest ending first.

    Attributes:
        returns: float64 ``[episodes]`` (empty without a reward field).
        lengths: int64 ``[episodes]``.
        terminated: bool ``[episodes]`` (``False``: ended by truncation).
        partial: episodes left out: cut by the ring's wrap or not finished.
    """

    returns: np.ndarray
    lengths: np.ndarray
    terminated: np.ndarray
    partial: int


def episode_stats(buffer: ReplayBuffer, *, reward: str | None = "reward", chunk: int = CHUNK) -> EpisodeStats:
    """The returns and lengths of the complete episodes in ``buffer`` (one streaming scan).

    Args:
        buffer: any buffer.
        reward: the reward field; ``None`` (or a buffer without it): lengths only.
        chunk: items read per step.

    Example:
        >>> import torch, xpbank
        >>> rb = xpbank.ReplayBuffer(10)
        >>> _ = rb.extend({"reward": torch.ones(3), "truncated": torch.tensor([0, 1, 0]).bool()})
        >>> s = episode_stats(rb)
        >>> s.returns.tolist(), s.lengths.tolist(), s.partial
        ([2.0], [2], 1)
    """
    has_reward = reward is not None and buffer.spec is not None and reward in buffer.spec
    returns, lengths, terminated, partial = [], [], [], 0
    for ep in iter_episodes(buffer, reward=reward if has_reward else None, chunk=chunk, partial=True):
        if not ep.complete:
            partial += 1
            continue
        lengths.append(len(ep))
        terminated.append(ep.terminated)
        if ep.total is not None:
            returns.append(ep.total)
    return EpisodeStats(
        np.asarray(returns, dtype=np.float64),
        np.asarray(lengths, dtype=np.int64),
        np.asarray(terminated, dtype=bool),
        partial,
    )
