"""Which slots each minibatch reads: pure functions over a rollout's time-major slot grid.

A rollout is described by a grid ``[L, R]`` of slots (column ``r`` = ``L`` consecutive
steps of one writer, see :mod:`xpbank.rollout.layout`). Everything here returns slot
indices (and masks, weights), never data: the buffer gathers them with one
``index_select`` per packed block.

- flat minibatches: a fresh permutation of all slots every epoch (:func:`flat_plan`);
- recurrent minibatches: trajectories split at episode ends (:func:`split_trajectories`),
  padded to the longest with a mask (:func:`pad_trajectories`), undone by :func:`unpad`;
  chosen by env, rsl_rl's way, or as a shuffled set of trajectories
  (:func:`trajectory_plan`);
- BPTT segments: rows of the grid, sequential or prioritized by ``sum |advantage| **
  alpha`` with importance weights (:func:`segment_plan`, :func:`anneal_beta`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from xpbank.errors import CapacityError, check_positive_int

__all__ = [
    "Trajectories",
    "flat_plan",
    "split_trajectories",
    "pad_trajectories",
    "unpad",
    "trajectory_plan",
    "segment_plan",
    "anneal_beta",
]


def flat_plan(
    n: int,
    num_minibatches: int,
    epochs: int,
    shuffle: bool,
    drop_last: bool,
    generator: torch.Generator,
    reuse_order: bool = False,
) -> Iterator[torch.Tensor]:
    """Positions ``[0, n)`` in ``num_minibatches`` minibatches per epoch, a fresh order each epoch.

    Minibatches have ``ceil(n / num_minibatches)`` items; the last of an epoch is shorter
    unless ``drop_last`` (then every minibatch has ``n // num_minibatches`` and the
    remainder, a different random set each epoch, is skipped).

    ``reuse_order`` is rsl_rl's order, for bitwise parity with it: one permutation of
    the first ``num_minibatches * (n // num_minibatches)`` positions, drawn once and
    reused every epoch (the last ``n % num_minibatches`` positions are never read).

    Example:
        >>> import torch
        >>> [b.tolist() for b in flat_plan(5, 2, 1, False, False, torch.Generator())]
        [[0, 1, 2], [3, 4]]
    """
    k = check_positive_int("num_minibatches", num_minibatches)
    check_positive_int("epochs", epochs)
    if k > n:
        raise CapacityError(f"num_minibatches {k} is more than the {n} stored steps")
    if reuse_order:
        return _reused(n // k, k, epochs, generator)
    size = n // k if drop_last else -(-n // k)
    return _flat(n, k, size, epochs, shuffle, generator)


def _reused(size: int, k: int, epochs: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    order = torch.randperm(k * size, generator=generator, device=generator.device)
    for _ in range(epochs):
        for i in range(k):
            yield order[i * size : (i + 1) * size]


def _flat(
    n: int, k: int, size: int, epochs: int, shuffle: bool, generator: torch.Generator
) -> Iterator[torch.Tensor]:
    for _ in range(epochs):
        order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
        for i in range(k):
            part = order[i * size : (i + 1) * size]
            if part.numel():
                yield part


@dataclass(frozen=True)
class Trajectories:
    """Pieces of episodes in a ``[L, R]`` grid, ordered by column then time.

    Attributes:
        row: the grid column of each trajectory ``[N]``.
        start: its first time index ``[N]``.
        length: its number of steps ``[N]`` (>= 1).
    """

    row: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor

    def __len__(self) -> int:
        return int(self.row.shape[0])


def split_trajectories(dones: torch.Tensor) -> Trajectories:
    """Split every column of ``dones [L, R]`` after each episode end and at the grid's edge.

    Example:
        >>> import torch
        >>> d = torch.tensor([[0, 0], [1, 0], [0, 1]], dtype=torch.bool)
        >>> t = split_trajectories(d)
        >>> t.row.tolist(), t.start.tolist(), t.length.tolist()
        ([0, 0, 1], [0, 2, 0], [2, 1, 3])
    """
    d = dones.detach().cpu().numpy().reshape(dones.shape[0], -1).astype(bool)
    ends = d.T.copy()  # [R, L]: column-major order = by row, then time
    ends[:, -1] = True
    row, t_end = np.nonzero(ends)
    starts = np.zeros_like(t_end)
    same = row[1:] == row[:-1]
    starts[1:][same] = t_end[:-1][same] + 1
    return Trajectories(
        torch.from_numpy(row.astype(np.int64)),
        torch.from_numpy(starts.astype(np.int64)),
        torch.from_numpy((t_end - starts + 1).astype(np.int64)),
    )


def pad_trajectories(
    grid: torch.Tensor, traj: Trajectories, pick: torch.Tensor | None = None, pad_to: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots ``[P, N]`` of the chosen trajectories, padded to the longest, and their mask.

    Padding repeats each trajectory's last slot (a real step, so a gather never reads
    garbage); ``mask`` is False there. ``P`` is the longest chosen trajectory (or
    ``pad_to``, e.g. the horizon, as rsl_rl pads).

    Example:
        >>> import torch
        >>> grid = torch.arange(6).view(3, 2)  # [T=3, E=2], slot = t * 2 + e
        >>> traj = split_trajectories(torch.tensor([[0, 0], [1, 0], [0, 0]], dtype=torch.bool))
        >>> slots, mask = pad_trajectories(grid, traj)
        >>> slots.T.tolist(), mask.T.tolist()
        ([[0, 2, 2], [4, 4, 4], [1, 3, 5]], [[True, True, False], [True, False, False], [True, True, True]])
    """
    row, start, length = traj.row, traj.start, traj.length
    if pick is not None:
        row, start, length = row[pick], start[pick], length[pick]
    longest = int(length.max()) if length.numel() else 0
    p = longest if pad_to is None else max(pad_to, longest)
    steps = torch.arange(p).unsqueeze(1)  # [P, 1]
    mask = steps < length.unsqueeze(0)
    t = start.unsqueeze(0) + torch.minimum(steps, (length - 1).unsqueeze(0))
    return grid[t, row.unsqueeze(0).expand_as(t)], mask


def unpad(padded: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The valid steps of ``padded [P, N, ...]``, trajectory by trajectory: ``[sum(mask), ...]``.

    With trajectories ordered by env then time and every trajectory of each env present
    (minibatches ``by="env"``), ``unpad(x, mask).view(n_envs, T, ...).transpose(0, 1)``
    is ``[T, n_envs, ...]``: what rsl_rl's ``unpad_trajectories`` returns.

    Example:
        >>> import torch
        >>> x = torch.tensor([[1, 3], [2, 0]]); m = torch.tensor([[True, True], [True, False]])
        >>> unpad(x, m).tolist()
        [1, 2, 3]
    """
    return padded.transpose(0, 1)[mask.transpose(0, 1)]


def trajectory_plan(
    traj: Trajectories,
    num_rows: int,
    num_minibatches: int,
    epochs: int,
    by: str,
    shuffle: bool,
    generator: torch.Generator,
    drop_last: bool = False,
) -> Iterator[torch.Tensor]:
    """Which trajectories go in each minibatch (indices into ``traj``).

    ``by="env"``: the trajectories of ``num_rows / num_minibatches`` consecutive
    columns per minibatch (rsl_rl's ``recurrent_mini_batch_generator``; with ``shuffle``
    the columns are permuted each epoch). When it does not divide, group sizes differ
    by one: no env is left out (rsl_rl drops the remainder; ``drop_last`` does as rsl_rl:
    groups of ``num_rows // num_minibatches``). ``by="trajectory"``: all trajectories in a
    fresh random order each epoch (or in order), cut into ``num_minibatches`` parts.
    """
    k = check_positive_int("num_minibatches", num_minibatches)
    check_positive_int("epochs", epochs)
    if by not in ("env", "trajectory"):
        raise CapacityError(f"by: expected 'env' or 'trajectory', got {by!r}")
    limit = num_rows if by == "env" else len(traj)
    if k > limit:
        raise CapacityError(f"num_minibatches {k} is more than the {limit} {by}s to split")
    return _trajectory_plan(traj, num_rows, k, epochs, by, shuffle, generator, drop_last)


def _trajectory_plan(
    traj: Trajectories,
    num_rows: int,
    k: int,
    epochs: int,
    by: str,
    shuffle: bool,
    gen: torch.Generator,
    drop_last: bool,
) -> Iterator[torch.Tensor]:
    n = len(traj)
    if by == "env":
        # every env, in near-equal groups; or rsl_rl's equal groups, the remainder dropped
        bounds = [i * (num_rows // k) if drop_last else i * num_rows // k for i in range(k + 1)]
        for _ in range(epochs):
            cols = torch.randperm(num_rows, generator=gen) if shuffle else torch.arange(num_rows)
            for i in range(k):
                chosen = torch.zeros(num_rows, dtype=torch.bool)
                chosen[cols[bounds[i] : bounds[i + 1]]] = True
                yield torch.nonzero(chosen[traj.row]).squeeze(1)
        return
    size = -(-n // k)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen) if shuffle else torch.arange(n)
        for i in range(k):
            yield order[i * size : (i + 1) * size]


def anneal_beta(beta0: float, alpha: float, progress: float) -> float:
    """metta's annealed importance exponent: ``beta0 + (1 - beta0) * alpha * progress``.

    ``progress`` runs from 0 (first epoch) to 1 (training's end).

    Example:
        >>> anneal_beta(0.6, 1.0, 0.5)
        0.8
    """
    return float(beta0 + (1.0 - beta0) * alpha * progress)


def segment_plan(
    advantages: torch.Tensor | None,
    minibatch_segments: int,
    num_minibatches: int,
    alpha: float,
    beta: float,
    generator: torch.Generator,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Rows of a ``[S, H]`` segment grid per minibatch, and each row's importance weight.

    ``alpha == 0``: rows in order, ``minibatch_segments`` at a time, weight 1.
    ``alpha > 0``: each minibatch draws ``minibatch_segments`` distinct rows with
    probability ``p[s] ∝ sum_t |advantages[s, t]| ** alpha`` (plus a small floor so a
    row of zeros can still be drawn), weighted ``(S * p[s]) ** -beta`` (as metta's PPO).

    Example:
        >>> import torch
        >>> plan = segment_plan(None, 2, 2, 0.0, 1.0, torch.Generator())
        >>> [(rows.tolist(), w.tolist()) for rows, w in plan]
        [([0, 1], [1.0, 1.0]), ([2, 3], [1.0, 1.0])]
    """
    per = check_positive_int("minibatch_segments", minibatch_segments)
    k = check_positive_int("num_minibatches", num_minibatches)
    if alpha < 0:
        raise CapacityError(f"alpha: expected a priority exponent >= 0, got {alpha!r}")
    if alpha > 0 and advantages is None:
        raise CapacityError("prioritized segments (alpha > 0) need advantages: compute returns first")
    return _segments(advantages, per, k, alpha, beta, generator)


def _segments(
    adv: torch.Tensor | None, per: int, k: int, alpha: float, beta: float, gen: torch.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if alpha == 0:
        ones = torch.ones(per)
        for i in range(k):
            yield torch.arange(i * per, (i + 1) * per), ones
        return
    assert adv is not None  # checked by segment_plan
    prio = adv.abs().sum(dim=1).double() ** alpha
    probs = (prio + 1e-6) / (prio.sum() + 1e-6 * prio.numel())
    weights_all = (prio.numel() * probs) ** -beta
    for _ in range(k):
        rows = torch.multinomial(probs, per, replacement=False, generator=gen)
        yield rows, weights_all[rows].float()
