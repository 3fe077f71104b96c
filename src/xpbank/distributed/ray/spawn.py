"""Starting a Ray buffer's actors: one :class:`~xpbank.distributed.ray.shard.Shard` per
shard (capacity split as evenly as possible) and, with a rate limiter, its
:class:`~xpbank.distributed.ray.link.LimiterHost`; and the check that a checkpoint
directory holds no banks of an earlier buffer unless the caller resumes from them.

Example:
    >>> capacities(10, 3)
    [4, 3, 3]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from xpbank.distributed.limiter import RateLimiter
from xpbank.distributed.ray.link import LimiterHost, ShardLink
from xpbank.distributed.ray.shard import Shard
from xpbank.errors import BankError, ShardUnavailableError
from xpbank.spec import Spec

__all__ = ["ShardPlan", "capacities", "check_checkpoint_dir", "spawn", "wait_started"]


@dataclass(frozen=True)
class ShardPlan:
    """What every shard actor is built from (its constructor's arguments but its index)."""

    num_shards: int
    capacity: int
    spec: Spec | None
    options: dict[str, Any]
    directory: str
    every_items: int | None
    every_seconds: float | None


def capacities(capacity: int, num_shards: int) -> list[int]:
    """``capacity`` split over ``num_shards``, the first ones one larger where it does not divide."""
    base, extra = divmod(capacity, num_shards)
    return [base + (s < extra) for s in range(num_shards)]


def spawn(
    plan: ShardPlan, rate_limiter: RateLimiter | None, ray_options: dict[str, Any]
) -> tuple[list[Any], Any]:
    """Start the shard actors (and the limiter's); returns their handles without waiting."""
    remote = ray.remote(Shard).options(**ray_options)
    spec = None if plan.spec is None else plan.spec.to_dict()
    shards = [
        remote.remote(
            s, plan.num_shards, cap, spec, plan.options, plan.directory, plan.every_items, plan.every_seconds
        )
        for s, cap in enumerate(capacities(plan.capacity, plan.num_shards))
    ]
    if rate_limiter is None:
        return shards, None
    host = ray.remote(LimiterHost).options(
        max_concurrency=64, max_restarts=ray_options.get("max_restarts", 0)
    )
    buffer = (
        None
        if rate_limiter.samples_per_insert is None
        else (rate_limiter.max_diff - rate_limiter.min_diff) / 2
    )
    return shards, host.remote(rate_limiter.samples_per_insert, rate_limiter.min_size_to_sample, buffer)


def wait_started(link: ShardLink, timeout: float) -> None:
    """Wait until every shard answers.

    Raises:
        ShardUnavailableError: a shard did not start within ``timeout`` (or its constructor failed).
    """
    started = link.collect({s: link.submit(s, "ping") for s in range(link.num_shards)}, timeout)
    failed = {s: a for s, a in started.items() if isinstance(a, ShardUnavailableError)}
    if failed:
        raise ShardUnavailableError(f"shard(s) {sorted(failed)} did not start within {timeout:g} s: {failed}")


def check_checkpoint_dir(directory: Path, resume: bool) -> None:
    """Refuse a directory with shard banks of an earlier buffer unless ``resume``.

    Raises:
        BankError: banks or id marks are there and ``resume`` is False.
    """
    banks = sorted(p.name for p in directory.glob("shard-*") if p.is_dir()) if directory.is_dir() else []
    marks = list(directory.glob("shard-*.issued")) if directory.is_dir() else []
    if (banks or marks) and not resume:
        raise BankError(
            f"checkpoint_dir {directory} holds shard checkpoints of an earlier buffer "
            f"({banks or 'id marks'}); pass resume=True to load them, or give an empty directory"
        )
