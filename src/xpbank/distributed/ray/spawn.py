"""Starting a Ray buffer's actors: one :class:`~xpbank.distributed.ray.shard.Shard` per
shard (capacity split as evenly as possible) and, with a rate limiter, its
:class:`~xpbank.distributed.ray.link.LimiterHost`; and the check that a checkpoint
directory holds no banks of an earlier buffer unless the caller resumes from them.

Example:
    >>> capacities(10, 3)
    [4, 3, 3]
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from xpbank.distributed.limiter import RateLimiter
from xpbank.distributed.ray.link import LimiterHost, ShardLink
from xpbank.distributed.ray.shard import Shard
from xpbank.errors import BankError, CapacityError, ShardUnavailableError, SpecError, check_positive_int
from xpbank.nstep.option import NStep
from xpbank.sampler.uniform import UniformSampler
from xpbank.spec.spec import Spec

__all__ = [
    "ShardPlan",
    "capacities",
    "check_arguments",
    "check_checkpoint_dir",
    "check_seconds",
    "sampler_code",
    "shard_args",
    "spawn",
    "start_shards",
    "wait_started",
]


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


def shard_args(plan: ShardPlan) -> list[tuple[Any, ...]]:
    """The :class:`Shard` constructor's arguments of every shard of ``plan``."""
    spec = None if plan.spec is None else plan.spec.to_dict()
    return [
        (s, plan.num_shards, cap, spec, plan.options, plan.directory, plan.every_items, plan.every_seconds)
        for s, cap in enumerate(capacities(plan.capacity, plan.num_shards))
    ]


def spawn(
    plan: ShardPlan,
    rate_limiter: RateLimiter | None,
    ray_options: dict[str, Any],
    pool: list[Any] | None = None,
) -> tuple[list[Any], Any]:
    """Start the shard actors (and the limiter's); returns their handles without waiting.

    ``pool``: existing shard actors (one per shard) to :meth:`Shard.reset` to ``plan``
    instead of starting new ones.
    """
    shards: list[Any]
    if pool is None:
        remote = ray.remote(Shard).options(**ray_options)
        shards = [remote.remote(*args) for args in shard_args(plan)]
    else:
        shards = list(pool)
        ray.get([actor.reset.remote(*args) for actor, args in zip(shards, shard_args(plan), strict=True)])
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


def start_shards(count: int, **ray_options: Any) -> list[Any]:
    """Start ``count`` idle shard actors for ``RayReplayBuffer(..., shards=...)`` to reuse.

    Each holds an empty one-item buffer in a temporary directory until a buffer resets
    it; end them with ``ray.kill`` when done. ``ray_options``: ``ray.remote`` options
    (default ``max_concurrency=8``, no restarts).
    """
    count = check_positive_int("count", count)
    remote = ray.remote(Shard).options(**{"max_concurrency": 8, "max_restarts": 0, **ray_options})
    directory = tempfile.mkdtemp(prefix="xpbank-ray-pool-")
    uniform = {"sampler": {"name": "uniform", "config": {}}}
    actors: list[Any] = [remote.remote(s, count, 1, None, uniform, directory) for s in range(count)]
    ray.get([actor.ping.remote() for actor in actors])
    return actors


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


def check_arguments(
    num_shards: Any, capacity: Any, spec: Any, nstep: Any, rate_limiter: Any
) -> tuple[int, int]:
    """:class:`~xpbank.distributed.ray.RayReplayBuffer`'s checks of its shape and parts;
    returns ``(num_shards, capacity)``.

    Raises:
        CapacityError, SpecError: a bad argument (named in the message).
    """
    num_shards = check_positive_int("num_shards", num_shards)
    capacity = check_positive_int("capacity", capacity)
    if capacity < num_shards:
        raise CapacityError(f"capacity: expected at least one item per shard ({num_shards}), got {capacity}")
    if spec is not None and not isinstance(spec, Spec):
        raise SpecError(f"spec: expected a Spec or None, got {type(spec).__name__}")
    if nstep is not None and not isinstance(nstep, NStep):
        raise SpecError(f"nstep: expected an NStep or None, got {type(nstep).__name__}")
    if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
        raise CapacityError(
            f"rate_limiter: expected a RateLimiter or None, got {type(rate_limiter).__name__}"
        )
    return num_shards, capacity


def check_seconds(**values: Any) -> None:
    """Each value a number of seconds > 0.

    Raises:
        CapacityError: naming the first that is not.
    """
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise CapacityError(f"{name}: expected a number of seconds > 0, got {value!r}")


#: sampler attributes that hold code, which a sampler's config() never holds
_CODE = ("compute_reward", "compute_terminated")


def sampler_code(sampler: Any) -> dict[str, Any]:
    """The functions each shard's copy of ``sampler`` needs besides its ``config()``: a
    :class:`~xpbank.her.HerSampler`'s ``compute_reward`` (and ``compute_terminated``),
    sent with the shards' constructor arguments (Ray pickles them); ``{}`` for others.

    A relabelling sampler runs in each shard on that shard's episode index: a buffer
    that needs episodes keeps each env's rows (each writer's, without an env field) on
    one shard, so every goal comes from the item's own episode, within its shard.

    Raises:
        SpecError: a relabelling sampler without ``compute_reward`` (the shards could
            never sample), or over a base sampler that is not uniform (the client draws
            the shards' counts by their sizes, not by priority mass, and holds no
            priorities to update).
    """
    if getattr(sampler, "relabel", None) is None:
        return {}
    if getattr(sampler, "compute_reward", None) is None:
        raise SpecError(
            f"sampler: {sampler!r} has no compute_reward; a RayReplayBuffer sends it to "
            "the shards when it is built: give it to the sampler first"
        )
    base = getattr(sampler, "base", None)
    if type(base) is not UniformSampler:
        raise SpecError(
            f"sampler: a relabelling sampler over Ray needs a UniformSampler base, got {base!r} "
            "(the shards' counts are drawn by size, so priorities would not be followed)"
        )
    return {name: getattr(sampler, name) for name in _CODE if getattr(sampler, name, None) is not None}
