"""The rate limiter as a pure object (no Ray): Reverb's rules, blocking, timeouts, errors."""

from __future__ import annotations

import importlib
import sys
import threading
import time

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from xpbank import BufferTimeoutError, CapacityError, MissingExtraError
from xpbank.distributed.limiter import RateLimiter
from xpbank.errors import RateLimitTimeout


def reverb_can_insert(inserts: int, samples: int, n: int, spi: float, min_size: int, buffer: float) -> bool:
    """Reverb's RateLimiter::CanInsert, written out from its SampleToInsertRatio bounds."""
    if inserts + n <= min_size:
        return True
    return (inserts + n) * spi - samples <= spi * min_size + buffer


def reverb_can_sample(inserts: int, samples: int, n: int, spi: float, min_size: int, buffer: float) -> bool:
    """Reverb's RateLimiter::CanSample."""
    if inserts < min_size:
        return False
    return inserts * spi - (samples + n) >= spi * min_size - buffer


class LimiterMachine(RuleBasedStateMachine):
    """Random interleavings of admitted inserts and samples against Reverb's rules."""

    @initialize(
        spi=st.sampled_from([0.5, 1.0, 2.0, 8.0]),
        min_size=st.integers(1, 20),
        extra=st.floats(0.0, 20.0),
    )
    def make(self, spi: float, min_size: int, extra: float) -> None:
        self.spi, self.min_size, self.buffer = spi, min_size, max(1.0, spi) + extra
        self.lim = RateLimiter(spi, min_size, self.buffer)
        self.inserts = self.samples = 0

    def _try(self, what: str, n: int) -> None:
        args = (self.inserts, self.samples, n, self.spi, self.min_size, self.buffer)
        expected = reverb_can_insert(*args) if what == "insert" else reverb_can_sample(*args)
        assert (self.lim.can_insert(n) if what == "insert" else self.lim.can_sample(n)) == expected
        wait = self.lim.await_insert if what == "insert" else self.lim.await_sample
        try:
            wait(n, timeout=0.0)
        except RateLimitTimeout:
            assert not expected
            return
        except CapacityError:  # a call wider than the error buffer: refused for good
            assert n * (self.spi if what == "insert" else 1.0) > 2 * self.buffer
            return
        assert expected
        if what == "insert":
            self.inserts += n
        else:
            self.samples += n

    @rule(n=st.integers(1, 6))
    def insert(self, n: int) -> None:
        self._try("insert", n)

    @rule(n=st.integers(1, 6))
    def sample(self, n: int) -> None:
        self._try("sample", n)

    @invariant()
    def counters_match_and_stay_in_bounds(self) -> None:
        assert (self.lim.inserts, self.lim.samples) == (self.inserts, self.samples)
        diff = self.inserts * self.spi - self.samples
        if self.inserts > self.min_size:
            assert diff <= self.spi * self.min_size + self.buffer + 1e-9
        if self.samples:
            assert self.inserts >= self.min_size
            assert diff >= self.spi * self.min_size - self.buffer - 1e-9

    @invariant()
    def one_side_can_always_go_on(self) -> None:  # no deadlock with an error buffer >= max(1, spi)
        assert self.lim.can_insert(1) or self.lim.can_sample(1)


TestLimiterMachine = LimiterMachine.TestCase
TestLimiterMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_min_size_only_blocks_samples_until_enough_inserts() -> None:
    lim = RateLimiter(min_size_to_sample=10)
    assert not lim.can_sample(1)
    lim.await_insert(9, timeout=0)
    with pytest.raises(
        RateLimitTimeout, match=r"sample of 1 items still blocked after 0 s \(9 of min_size_to_sample=10"
    ):
        lim.await_sample(1, timeout=0)
    lim.await_insert(1, timeout=0)
    lim.await_sample(10_000, timeout=0)  # no ratio: any number of samples
    assert lim.can_insert(10**9)
    assert (lim.inserts, lim.samples) == (10, 10_000)


def test_a_timeout_counts_nothing_and_is_a_buffer_timeout() -> None:
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=2.0)
    lim.await_insert(2, timeout=0)
    start = time.monotonic()
    with pytest.raises(
        BufferTimeoutError, match=r"sample of 3 items still blocked after 0.05 s .*no inserts came"
    ):
        lim.await_sample(3, timeout=0.05)
    assert time.monotonic() - start >= 0.05
    assert (lim.inserts, lim.samples) == (2, 0)


def test_a_waiting_sample_is_released_by_an_insert_from_another_thread() -> None:
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=4.0)
    done: list[float] = []

    def learner() -> None:
        lim.await_sample(2, timeout=10.0)
        done.append(time.monotonic())

    thread = threading.Thread(target=learner)
    thread.start()
    time.sleep(0.05)
    assert not done  # still waiting for min_size_to_sample
    inserted = time.monotonic()
    lim.await_insert(4, timeout=0)
    thread.join(timeout=10.0)
    assert done and done[0] >= inserted
    assert (lim.inserts, lim.samples) == (4, 2)


def test_a_waiting_insert_is_released_by_samples() -> None:
    lim = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=2.0)  # diff in [-1, 3]
    lim.await_insert(3, timeout=0)  # diff 3
    errors: list[Exception] = []

    def collector() -> None:
        try:
            lim.await_insert(1, timeout=10.0)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=collector)
    thread.start()
    time.sleep(0.05)
    assert lim.inserts == 3
    lim.await_sample(2, timeout=0)  # diff 1: an insert of 1 fits again
    thread.join(timeout=10.0)
    assert not errors and lim.inserts == 4


def test_a_call_wider_than_the_error_buffer_is_refused_at_once() -> None:
    lim = RateLimiter(samples_per_insert=4.0, min_size_to_sample=1, error_buffer=10.0)
    with pytest.raises(
        CapacityError, match=r"insert of 6 items: .*diff range of 20, but this call moves it by 24"
    ):
        lim.await_insert(6, timeout=100.0)
    with pytest.raises(CapacityError, match=r"sample of 21 items: .*larger error_buffer \(>= 10.5\)"):
        lim.await_sample(21, timeout=100.0)
    assert (lim.inserts, lim.samples) == (0, 0)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        (
            {"samples_per_insert": 2.0, "error_buffer": 1.0},
            r"error_buffer: expected >= max\(1, samples_per_insert\) = 2.0, got 1.0",
        ),
        ({"samples_per_insert": 0}, r"samples_per_insert: expected a number > 0, got 0"),
        (
            {"samples_per_insert": float("nan")},
            r"samples_per_insert: expected a finite number >= 0.0, got nan",
        ),
        ({"error_buffer": 3.0}, r"error_buffer: only meaningful with samples_per_insert"),
        ({"min_size_to_sample": 0}, r"min_size_to_sample: expected a positive int, got 0"),
    ],
)
def test_bad_settings_raise_naming_the_argument(kwargs: dict[str, float], msg: str) -> None:
    with pytest.raises(CapacityError, match=msg):
        RateLimiter(**kwargs)  # type: ignore[arg-type]


def test_bad_call_arguments_raise() -> None:
    lim = RateLimiter()
    with pytest.raises(CapacityError, match=r"insert count: expected a positive int, got 0"):
        lim.await_insert(0, timeout=1.0)
    with pytest.raises(CapacityError, match=r"timeout: expected a finite number >= 0.0, got -1"):
        lim.await_sample(1, timeout=-1)


def test_ray_module_without_ray_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [
        m for m in sys.modules if m == "xpbank.distributed.ray" or m.startswith("xpbank.distributed.ray.")
    ]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(MissingExtraError, match=r"install -e '\.\[ray\]'.*'xpbank\[ray\]'"):
        importlib.import_module("xpbank.distributed.ray")
