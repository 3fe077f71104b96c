"""A sample over the shards: how many items each shard that is up gives (drawn from the
shards' sizes or priority mass), the parts fetched in parallel, then merged into one
flat batch with global ids (and, prioritized, global importance weights)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.distributed.ray.health import Health
from xpbank.distributed.ray.ids import encode
from xpbank.distributed.ray.link import ShardLink
from xpbank.distributed.ray.weights import global_weights
from xpbank.errors import CapacityError, EmptyBufferError, PriorityError, ShardUnavailableError
from xpbank.sampler import PrioritizedSampler

__all__ = ["capped_counts", "draw_parts", "merge_parts"]

#: a shard's answer to a ``sample`` call: (shard, {"data", "ids", "stats", "stored"})
Parts = list[tuple[int, dict[str, Any]]]


def draw_parts(
    link: ShardLink,
    health: Health,
    rng: np.random.Generator,
    batch_size: int,
    keys: Any,
    prioritized: bool,
    replace: bool,
) -> tuple[Parts, dict[int, dict[str, Any]]]:
    """Draw ``batch_size`` items over the shards that are up and fetch them.

    Per-shard counts come from a multinomial over the shards' sizes (uniform) or priority
    totals (prioritized), or, with ``replace=False``, a multivariate hypergeometric draw
    over the sizes. A shard that fails mid-sample is marked down and its items are drawn
    again from the others (all of them again with ``replace=False``: a shard asked twice
    could repeat an item).

    Args:
        link: the buffer's shard link (Ray calls).
        health: which shards are up (polled for their stats).
        rng: the client's generator.
        batch_size: items to draw (> 0).
        keys: the fields to fetch (``check_fields``'s answer).
        prioritized: draw by priority mass (else by size).
        replace: draw with replacement.

    Returns:
        ``(parts, stats)``: each answer with its shard (a shard may answer twice), and
        the shards' stats of the last poll.

    Raises:
        ShardUnavailableError: every shard is down.
        EmptyBufferError: no shard that is up holds an item.
        PriorityError: every stored priority is 0.
        CapacityError: ``replace=False`` and more items asked for than are stored.
    """
    parts: Parts = []
    stats: dict[int, dict[str, Any]] = {}
    need = batch_size
    while need:  # again only when a shard failed mid-sample: its rows come from the others
        stats = health.poll()
        if not stats:
            raise ShardUnavailableError(f"sample: all {link.num_shards} shards are down")
        shards = sorted(stats)
        mass = np.array([stats[s]["total" if prioritized else "size"] for s in shards], dtype=np.float64)
        if not mass.sum() > 0:
            if sum(int(stats[s]["size"]) for s in shards) == 0:
                where = " (on the shards that are up)" if health.down else ""
                raise EmptyBufferError(f"sample: the buffer is empty{where}; add or extend first")
            raise PriorityError("sample: every stored priority is 0, so no item can be drawn; use eps > 0")
        if not replace and need > mass.sum():
            raise CapacityError(
                f"sample: {need} distinct items asked for (replace=False), but only "
                f"{int(mass.sum())} are stored (on the shards that are up)"
            )
        if replace:
            counts = rng.multinomial(need, mass / mass.sum())
        else:  # distinct items: uniform without replacement over the union of the shards
            counts = rng.multivariate_hypergeometric(mass.astype(np.int64), need)
        calls = {
            s: ("sample", (int(k), keys, prioritized, replace))
            for s, k in zip(shards, counts, strict=True)
            if k
        }
        need = 0
        for s, answer in link.call_each(calls).items():
            if isinstance(answer, ShardUnavailableError):
                health.mark_down(s, answer)
                need += calls[s][1][0]
            else:
                parts.append((s, answer))
        if need and not replace:  # redraw all: a shard asked twice could repeat an item
            parts, need = [], batch_size
    return parts, stats


def capped_counts(rng: np.random.Generator, need: int, mass: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """Per-shard counts summing to ``need``, drawn by ``mass``, none above its ``cap``.

    A multinomial over ``mass``; a shard drawn past its cap (the samples its items may
    still give under ``max_times_sampled``) keeps ``cap``, and the excess is drawn again
    over the shards with room left, in proportion to their mass (their room where every
    such mass is 0). ``need <= cap.sum()`` must hold.

    Example:
        >>> capped_counts(np.random.default_rng(0), 5, np.array([1.0, 9.0]), np.array([9, 2])).tolist()
        [3, 2]
    """
    counts = np.zeros(len(mass), dtype=np.int64)
    cap = np.asarray(cap, dtype=np.int64)
    left = need
    while left:
        room = cap - counts
        weights = np.where(room > 0, np.asarray(mass, dtype=np.float64), 0.0)
        if not weights.sum() > 0:
            weights = room.astype(np.float64)
        counts += np.minimum(rng.multinomial(left, weights / weights.sum()), room)
        left = need - int(counts.sum())
    return counts


def merge_parts(
    parts: Parts,
    stats: dict[int, dict[str, Any]],
    num_shards: int,
    sampler: PrioritizedSampler | None,
    samples: int,
) -> dict[Any, torch.Tensor]:
    """The parts' rows as one flat batch (grouped by shard) with their global ``"index"``
    and, where ``sampler`` is given, their ``"weight"`` from the global totals (each
    shard's stats as of its draw; ``samples``: the ``sample`` calls before this one)."""
    first = parts[0][1]["data"]
    flat = {k: torch.cat([answer["data"][k] for _, answer in parts]) for k in first}
    ids = [encode(answer["ids"].numpy(), s, num_shards) for s, answer in parts]
    flat["index"] = torch.from_numpy(np.concatenate(ids))
    if "her_goal" in flat:  # a HerSampler's goal steps: global ids too (-1 stays)
        local = flat["her_goal"].numpy()
        shard = np.concatenate([np.full(len(answer["ids"]), s) for s, answer in parts])
        flat["her_goal"] = torch.from_numpy(np.where(local >= 0, encode(local, shard, num_shards), -1))
    if sampler is not None:
        totals = {**stats, **{s: answer["stats"] for s, answer in parts}}  # as of each shard's draw
        stored = np.concatenate([answer["stored"] for _, answer in parts])
        flat["weight"] = torch.from_numpy(global_weights(stored, list(totals.values()), sampler, samples))
    return flat
