"""A :class:`~xpbank.table.Table`'s options: the selector and remover names, the rate
limiter as a config (JSON-able, for banks and Ray shards), number checks."""

from __future__ import annotations

from typing import Any

from xpbank.distributed.limiter import RateLimiter
from xpbank.errors import SpecError
from xpbank.spec.keys import NestedKey

__all__ = [
    "REMOVERS",
    "SELECTORS",
    "as_tuple",
    "limiter_config",
    "make_limiter",
    "reads_episodes",
]

SELECTORS = ("uniform", "prioritized", "fifo", "lifo", "min_heap", "max_heap")
REMOVERS = ("fifo", "lifo", "min_heap", "max_heap", "uniform")


def limiter_config(limiter: Any) -> Any:
    """``None``, ``"queue"`` or a :class:`~xpbank.RateLimiter`'s constructor arguments."""
    if limiter is None or limiter == "queue":
        return limiter
    spi = limiter.samples_per_insert
    out = {"samples_per_insert": spi, "min_size_to_sample": limiter.min_size_to_sample}
    if spi is not None:
        out["error_buffer"] = (limiter.max_diff - limiter.min_diff) / 2
    return out


def make_limiter(value: Any) -> RateLimiter | str | None:
    """The inverse of :func:`limiter_config` (a limiter given as is)."""
    if value is None or value == "queue" or isinstance(value, RateLimiter):
        return value
    if isinstance(value, dict):
        return RateLimiter(**value)
    raise SpecError(f"rate_limiter: expected None, 'queue', a RateLimiter or its config, got {value!r}")


def reads_episodes(storage: Any) -> bool:
    """Whether ``storage`` follows the FIFO ring's episode index (``FrameStorage``)."""
    return bool(getattr(storage, "needs_episodes", False)) or hasattr(storage, "prepare_write")


def as_tuple(key: NestedKey) -> tuple[str, ...]:
    """A nested key as a tuple (a JSON list in a config)."""
    return key if isinstance(key, tuple) else (key,)
