"""A rate limiter between inserts and samples, as in Reverb, with a timeout on every wait.

The limiter keeps two counters, ``inserts`` (items admitted for writing) and ``samples``
(items handed out), and holds the *diff* ``inserts * samples_per_insert - samples``
inside ``[min_diff, max_diff]`` once ``min_size_to_sample`` items have been inserted:

- an insert of ``n`` items may go ahead while the buffer holds fewer than
  ``min_size_to_sample`` (counting the ``n``), or when it leaves the diff at most
  ``max_diff`` (the learner is not too far behind);
- a sample of ``n`` items may go ahead once ``min_size_to_sample`` items were inserted
  and it leaves the diff at least ``min_diff`` (the collectors are not too far behind).

``error_buffer`` is how far the diff may stray either way from its target
``samples_per_insert * min_size_to_sample`` (Reverb's ``SampleToInsertRatio``):
``min_diff = target - error_buffer``, ``max_diff = target + error_buffer``.
``samples_per_insert=None`` keeps only the minimum size (Reverb's ``MinSize``). As in
Reverb, the minimum size counts the items still there: ``deletes`` (items that left a
:class:`~xpbank.Table`, which counts them) are subtracted from ``inserts`` there, not in
the diff.

The object is plain Python, safe to share between threads: ``await_insert`` and
``await_sample`` wait on a condition for up to ``timeout`` seconds and raise
:class:`~xpbank.RateLimitTimeout` instead of hanging; a call that could never go ahead
(a batch larger than the error buffer allows) is refused at once. A Ray buffer hosts one
in an actor (:mod:`xpbank.distributed.ray`).

Example:
    >>> from xpbank.distributed.limiter import RateLimiter
    >>> lim = RateLimiter(samples_per_insert=2.0, min_size_to_sample=4, error_buffer=8.0)
    >>> lim.can_sample(1)  # nothing inserted yet
    False
    >>> lim.await_insert(4, timeout=0.0)
    >>> lim.can_sample(8), lim.can_sample(9)  # diff 8 - samples must stay >= 0
    (True, False)
    >>> lim.await_sample(8, timeout=0.0); lim.can_insert(5), lim.can_insert(9)
    (True, False)
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator
from typing import Any

from xpbank.errors import CapacityError, RateLimitTimeout, check_finite_number, check_positive_int

__all__ = ["RateLimiter", "insert_room", "sample_room"]


class RateLimiter:
    """Keep samples and inserts at a ratio (Reverb's rate limiter); see the module docstring.

    Args:
        samples_per_insert: the target number of sampled items per inserted item;
            ``None``: no ratio, only ``min_size_to_sample``.
        min_size_to_sample: samples wait until this many items were inserted.
        error_buffer: how far ``inserts * samples_per_insert - samples`` may stray from
            ``samples_per_insert * min_size_to_sample``; at least
            ``max(1, samples_per_insert)`` (smaller values can block both sides for good).

    Raises:
        CapacityError: a bad argument (named in the message).
    """

    def __init__(
        self,
        samples_per_insert: float | None = None,
        min_size_to_sample: int = 1,
        error_buffer: float | None = None,
    ):
        self.min_size_to_sample = check_positive_int("min_size_to_sample", min_size_to_sample)
        if samples_per_insert is None:
            if error_buffer is not None:
                raise CapacityError(
                    "error_buffer: only meaningful with samples_per_insert; got both None and a value"
                )
            self.samples_per_insert = None
            self.min_diff, self.max_diff = -math.inf, math.inf
        else:
            spi = check_finite_number("samples_per_insert", samples_per_insert, 0.0)
            if spi == 0.0:
                raise CapacityError(
                    "samples_per_insert: expected a number > 0, got 0 (use None for no ratio)"
                )
            floor = max(1.0, spi)
            buffer = check_finite_number("error_buffer", floor if error_buffer is None else error_buffer, 0.0)
            if buffer < floor:
                raise CapacityError(
                    f"error_buffer: expected >= max(1, samples_per_insert) = {floor}, got {error_buffer!r}; "
                    "a smaller buffer can block inserts and samples for good"
                )
            self.samples_per_insert = spi
            target = spi * self.min_size_to_sample
            self.min_diff, self.max_diff = target - buffer, target + buffer
        self.inserts = 0
        self.deletes = 0  # items that left (a Table counts them): the minimum size is of what is there
        self.samples = 0
        self._cond = threading.Condition()

    @classmethod
    def queue(cls, size: int) -> RateLimiter:
        """Reverb's ``Queue(size)`` limiter: ``0 <= inserts - samples <= size``, so inserts
        wait while ``size`` items are unsampled and samples while none is.

        Example:
            >>> q = RateLimiter.queue(2)
            >>> q.can_sample(1), q.can_insert(2), q.can_insert(3)
            (False, True, False)
        """
        size = check_positive_int("size", size)
        limiter = cls(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=max(1.0, size / 2))
        limiter.min_diff, limiter.max_diff = 0.0, float(size)
        return limiter

    # -- the rules (pure reads of the counters) --------------------------------------
    def _diff(self, inserts: int, samples: int) -> float:
        return 0.0 if self.samples_per_insert is None else inserts * self.samples_per_insert - samples

    def can_insert(self, n: int) -> bool:
        """Whether an insert of ``n`` items may go ahead now."""
        if self.inserts + n - self.deletes <= self.min_size_to_sample:
            return True
        return self._diff(self.inserts + n, self.samples) <= self.max_diff

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` items may go ahead now."""
        if self.inserts - self.deletes < self.min_size_to_sample:
            return False
        return self._diff(self.inserts, self.samples + n) >= self.min_diff

    def check_fits(self, n: int, what: str) -> None:
        """Refuse a call of ``n`` items that no interleaving of the other side could admit.

        Raises:
            CapacityError: the error buffer is narrower than one such call.
        """
        if self.samples_per_insert is None:
            return
        width = self.max_diff - self.min_diff
        need = n * self.samples_per_insert if what == "insert" else float(n)
        if need > width:
            raise CapacityError(
                f"{what} of {n} items: the rate limiter's error buffer allows a diff range of {width:g}, "
                f"but this call moves it by {need:g}; it would wait forever. Use smaller batches or a "
                f"larger error_buffer (>= {need / 2:g})"
            )

    # -- blocking calls ----------------------------------------------------------
    def await_insert(self, n: int, timeout: float) -> None:
        """Wait until ``n`` items may be inserted, then count them.

        Raises:
            RateLimitTimeout: still not admitted after ``timeout`` seconds (nothing counted).
            CapacityError: ``n`` could never be admitted (see :meth:`check_fits`).
        """
        with self._await("insert", n, timeout, self.can_insert):
            self.inserts += n

    def await_sample(self, n: int, timeout: float) -> None:
        """Wait until ``n`` items may be sampled, then count them.

        Raises:
            RateLimitTimeout: still not admitted after ``timeout`` seconds (nothing counted).
            CapacityError: ``n`` could never be admitted (see :meth:`check_fits`).
        """
        with self._await("sample", n, timeout, self.can_sample):
            self.samples += n

    @contextlib.contextmanager
    def _await(self, what: str, n: int, timeout: float, ready: Any) -> Iterator[None]:
        """Hold the lock from the moment ``n`` is admitted until it is counted."""
        n = check_positive_int(f"{what} count", n)
        timeout = check_finite_number("timeout", timeout, 0.0)
        deadline = time.monotonic() + timeout
        with self._cond:
            if not ready(n):
                self.check_fits(n, what)  # e.g. inserts below min_size_to_sample may be wider
            while not ready(n):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RateLimitTimeout(self._blocked(what, n, timeout))
                self._cond.wait(left)
            yield
            self._cond.notify_all()

    def _blocked(self, what: str, n: int, timeout: float) -> str:
        why = (
            f"{self.inserts} of min_size_to_sample={self.min_size_to_sample} items inserted"
            if what == "sample" and self.inserts - self.deletes < self.min_size_to_sample
            else f"inserts={self.inserts}, samples={self.samples}, samples_per_insert="
            f"{self.samples_per_insert}, diff={self._diff(self.inserts, self.samples):g} must stay "
            f"within [{self.min_diff:g}, {self.max_diff:g}]"
        )
        other = "samples" if what == "insert" else "inserts"
        return (
            f"rate limiter: {what} of {n} items still blocked after {timeout:g} s ({why}); "
            f"no {other} came to unblock it"
        )

    def state(self) -> dict[str, float]:
        """The counters and bounds, e.g. for logging."""
        with self._cond:
            return {
                "inserts": self.inserts,
                "samples": self.samples,
                "diff": self._diff(self.inserts, self.samples),
                "min_diff": self.min_diff,
                "max_diff": self.max_diff,
            }

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_cond"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update({"deletes": 0, **state})  # pickled before deletes were counted
        self._cond = threading.Condition()

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self.samples_per_insert}, min_size_to_sample="
            f"{self.min_size_to_sample}, diff in [{self.min_diff:g}, {self.max_diff:g}])"
        )


def insert_room(limiter: RateLimiter) -> int | None:
    """The most items ``limiter`` admits as one insert now (``None``: any number).

    Example:
        >>> lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=3.0)
        >>> insert_room(lim), lim.can_insert(5), lim.can_insert(6)
        (5, True, False)
    """
    spi = limiter.samples_per_insert
    if spi is None:
        return None
    by_ratio = math.floor((limiter.max_diff + limiter.samples) / spi + 1e-9) - limiter.inserts
    n = max(by_ratio, limiter.min_size_to_sample - (limiter.inserts - limiter.deletes), 0)
    while n and not limiter.can_insert(n):  # rounding: never claim more than can_insert admits
        n -= 1
    return n


def sample_room(limiter: RateLimiter) -> int:
    """The most items ``limiter`` admits as one sample now (``1 << 40``: no ratio).

    Example:
        >>> lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=3.0)
        >>> lim.await_insert(2, timeout=0.0)
        >>> sample_room(lim), lim.can_sample(4), lim.can_sample(5)
        (4, True, False)
    """
    if limiter.inserts - limiter.deletes < limiter.min_size_to_sample:
        return 0
    spi = limiter.samples_per_insert
    if spi is None:
        return 1 << 40
    n = max(0, math.floor(limiter.inserts * spi - limiter.samples - limiter.min_diff + 1e-9))
    while n and not limiter.can_sample(n):
        n -= 1
    return n
