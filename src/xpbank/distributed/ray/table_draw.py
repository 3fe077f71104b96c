"""A sample of a Ray buffer whose shards hold :class:`~xpbank.Table` s: how many items
each shard gives, within what it can give now, with Reverb's waits and limits.

Each shard holds its own table (the buffer's template, rebuilt from its config), so an
item lives on one shard and its sample count, ``max_times_sampled`` and removal are that
shard's, under its lock. The client:

1. polls every shard that is up for ``"draws"``, the draws its table can serve now (with
   ``max_staleness``/``current_version`` the shard first removes its stale items);
2. if they add up to less than the batch, waits (polling) while a rate limiter makes
   readers wait (a queue), up to ``timeout`` (then :class:`~xpbank.RateLimitTimeout`,
   nothing drawn), or raises :class:`~xpbank.EmptyBufferError` at once without one;
3. splits the batch over the shards by their mass (items, or the prioritized
   selector's priority sum), no shard above its draws (:func:`capped_counts`), and asks
   each for its part: a shard never waits, and one that can no longer serve its part
   draws nothing (``"short"``) and is asked again in the next round.

So a sample never returns an item more often than ``max_times_sampled`` allows, across
shards and within one batch. What is per shard: the order of the ordered selectors
(FIFO, LIFO, heaps) holds within each shard's part, not across shards (there is no
global insertion order); the prioritized selector's ``"probability"`` is made global
(scaled by the shard's share of the priority mass). Items a shard gave in a round are
kept even if a later round fails (a shard going down mid-sample): with
``max_times_sampled`` they were counted, so a sample that then times out loses them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from xpbank.distributed.ray.draw import capped_counts, merge_parts
from xpbank.errors import CapacityError, EmptyBufferError, RateLimitTimeout, ShardUnavailableError, SpecError

__all__ = ["sample_table"]


def table_options(table: Any, options: dict[str, Any]) -> tuple[float, dict[str, Any], Any]:
    """``(timeout, the shards' options, (max_staleness, current_version) or None)``.

    Raises:
        SpecError: an option the table does not take, or only one of the staleness pair.
        CapacityError: a bad timeout.
    """
    unknown = [name for name in options if name not in table.sample_options]
    if unknown:
        raise SpecError(
            f"sample: {table!r} takes no option {unknown[0]!r} (it takes: {list(table.sample_options)})"
        )
    timeout = options.get("timeout")
    limit = table.timeout if timeout is None else timeout
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not limit >= 0:
        raise CapacityError(f"timeout: expected a number of seconds >= 0, got {timeout!r}")
    k, v = options.get("max_staleness"), options.get("current_version")
    if (k is None) != (v is None):
        raise SpecError("sample: max_staleness and current_version go together; got only one of them")
    shard = {name: value for name, value in options.items() if name != "timeout"}
    return float(limit), shard, None if k is None else (k, v)


def sample_table(
    link: Any, health: Any, rng: np.random.Generator, table: Any, batch_size: int, keys: Any,
    replace: bool, options: dict[str, Any],
) -> dict[Any, torch.Tensor]:  # fmt: skip
    """``batch_size`` items over the shards (see the module): one flat batch with global ids.

    Raises:
        RateLimitTimeout: the shards could not serve the batch within the timeout.
        EmptyBufferError: too few draws left and no rate limiter to wait on.
        ShardUnavailableError: every shard is down.
    """
    limit, shard_options, staleness = table_options(table, options)
    deadline, pause = time.monotonic() + limit, 1e-3
    parts: list[tuple[int, dict[str, Any]]] = []
    need, stats = batch_size, {}
    while need:
        stats = health.poll((staleness, replace))
        if not stats:
            raise ShardUnavailableError(f"sample: all {link.num_shards} shards are down")
        shards = sorted(stats)
        draws = np.array([int(stats[s]["draws"]) for s in shards], dtype=np.int64)
        if draws.sum() < need:
            if table.rate_limiter is None and not parts:  # the template is not bound: its setting
                raise EmptyBufferError(
                    f"sample: {need} draws asked for, the shards that are up can serve {int(draws.sum())} now"
                )
            if time.monotonic() >= deadline:
                raise RateLimitTimeout(
                    f"sample of {batch_size} items still blocked after {limit:g} s (the shards that are up "
                    f"can serve {int(draws.sum())} draws now; {table!r}); no inserts came to unblock it"
                )
            time.sleep(pause)
            pause = min(2 * pause, 0.05)
            continue
        mass = np.array([float(stats[s]["total"]) for s in shards])
        counts = capped_counts(rng, need, mass, draws)
        calls = {
            s: ("sample", (int(k), keys, False, replace, shard_options))
            for s, k in zip(shards, counts, strict=True)
            if k
        }
        for s, answer in link.call_each(calls).items():
            if isinstance(answer, ShardUnavailableError):
                health.mark_down(s, answer)
            elif "short" not in answer:
                parts.append((s, answer))
                need -= calls[s][1][0]
    total = sum(float(stats[s]["total"]) for s in stats) or 1.0
    for s, answer in parts:  # the prioritized selector's probabilities, made global
        prob = answer["data"].get("probability")
        if prob is not None and s in stats:
            answer["data"]["probability"] = prob * (float(stats[s]["total"]) / total)
    return merge_parts(parts, stats, link.num_shards, None, 0)
