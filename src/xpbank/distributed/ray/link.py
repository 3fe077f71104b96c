"""How a client reaches the shards and the rate limiter: Ray calls with timeouts.

:class:`ShardLink` holds the actor handles (picklable, so writers in other processes
share them) and turns Ray's failures into xpbank's: a shard that died or is restarting
(``RayActorError``) or did not answer within the timeout becomes a
:class:`~xpbank.ShardUnavailableError` *value* in the answers (the caller goes on with
the other shards); an xpbank error raised inside a shard is raised again as itself.
The rate limiter (:class:`~xpbank.distributed.limiter.RateLimiter`) lives in one small
threaded actor, :class:`LimiterHost`, so every writer and the learner count against the
same counters; a wait past the timeout raises :class:`~xpbank.RateLimitTimeout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

from xpbank.distributed.limiter import RateLimiter
from xpbank.errors import CapacityError, RateLimitTimeout, ShardUnavailableError, XpbankError

__all__ = ["ShardLink", "LimiterHost"]

_MARGIN = 30.0  # seconds a limiter call may take beyond its own timeout (scheduling, transfer)


class LimiterHost:
    """A :class:`RateLimiter` in an actor: answers ``None`` (admitted) or ``(kind, message)``."""

    def __init__(self, samples_per_insert: float | None, min_size_to_sample: int, error_buffer: float | None):
        self.limiter = RateLimiter(samples_per_insert, min_size_to_sample, error_buffer)

    def await_insert(self, n: int, timeout: float) -> tuple[str, str] | None:
        return _answer(self.limiter.await_insert, n, timeout)

    def await_sample(self, n: int, timeout: float) -> tuple[str, str] | None:
        return _answer(self.limiter.await_sample, n, timeout)

    def state(self) -> dict[str, float]:
        return self.limiter.state()


def _answer(wait: Any, n: int, timeout: float) -> tuple[str, str] | None:
    try:
        wait(n, timeout)
    except RateLimitTimeout as exc:
        return ("timeout", str(exc))
    except CapacityError as exc:
        return ("capacity", str(exc))
    return None


@dataclass
class ShardLink:
    """The actor handles of a buffer's shards (and its limiter) and the timeouts of calls.

    Args:
        shards: one actor handle per shard.
        limiter: the :class:`LimiterHost` actor, or ``None`` (no rate limiting).
        timeout: seconds a write, a sample or a limiter wait may take.
        probe_timeout: seconds a shard may take to answer a status call before a sample
            goes on without it.
    """

    shards: list[Any]
    limiter: Any = None
    timeout: float = 60.0
    probe_timeout: float = 5.0

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    def submit(self, shard: int, method: str, *args: Any) -> Any:
        """Start ``method(*args)`` on a shard; returns its object ref."""
        return getattr(self.shards[shard], method).remote(*args)

    def collect(self, refs: dict[int, Any], timeout: float) -> dict[int, Any]:
        """Wait up to ``timeout`` for every ref; a shard's answer, or a ShardUnavailableError.

        Raises:
            XpbankError: raised inside a shard (e.g. a spec mismatch), as itself.
        """
        if not refs:
            return {}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout)
        done = set(ready)
        out: dict[int, Any] = {}
        for s, ref in refs.items():
            if ref not in done:
                out[s] = ShardUnavailableError(f"shard {s} did not answer within {timeout:g} s")
                continue
            try:
                out[s] = ray.get(ref)
            except RayActorError as exc:
                out[s] = ShardUnavailableError(f"shard {s} is down ({type(exc).__name__})")
            except RayTaskError as exc:
                if isinstance(exc.cause, XpbankError):
                    raise exc.cause from None
                raise
        return out

    def call_each(self, calls: dict[int, tuple[str, tuple[Any, ...]]]) -> dict[int, Any]:
        """Run ``{shard: (method, args)}`` in parallel; answers as :meth:`collect` gives them."""
        return self.collect({s: self.submit(s, m, *args) for s, (m, args) in calls.items()}, self.timeout)

    def admit_insert(self, n: int) -> None:
        """Wait for the rate limiter to admit ``n`` inserted items (no-op without one)."""
        self._admit("await_insert", n)

    def admit_sample(self, n: int) -> None:
        """Wait for the rate limiter to admit ``n`` sampled items (no-op without one)."""
        self._admit("await_sample", n)

    def _admit(self, method: str, n: int) -> None:
        if self.limiter is None:
            return
        try:
            answer = ray.get(
                getattr(self.limiter, method).remote(n, self.timeout), timeout=self.timeout + _MARGIN
            )
        except (GetTimeoutError, RayActorError) as exc:
            raise RateLimitTimeout(
                f"rate limiter: no answer within {self.timeout + _MARGIN:g} s ({type(exc).__name__}); "
                "its actor is down or overloaded"
            ) from exc
        if answer is not None:
            kind, message = answer
            raise (RateLimitTimeout if kind == "timeout" else CapacityError)(message)
