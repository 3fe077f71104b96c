"""Table: presets, blocking and timeouts, Reverb's batch semantics, ids, staleness,
errors, state, banks, and a consume-once queue under threads."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pytest
import torch

import xpbank
from xpbank import (
    CapacityError,
    EmptyBufferError,
    FrameStorage,
    NStep,
    PriorityError,
    RateLimiter,
    RateLimitTimeout,
    ReplayBuffer,
    SpecError,
    StaleIndexError,
    Table,
)
from xpbank.sampler import make_sampler, sampler_config
from xpbank.table import heap


@pytest.fixture(autouse=True, params=["compiled heaps", "heapq heaps"])
def heaps(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test on both heap paths: numba's indexed heaps (where installed) and heapq's."""
    if request.param == "heapq heaps":
        monkeypatch.setattr(heap, "load", lambda: None)
    elif heap.load() is None:
        pytest.skip("numba is not installed")


def values(n: int, start: int = 0) -> dict[str, torch.Tensor]:
    return {"x": torch.arange(start, start + n, dtype=torch.float32)}


def xs(batch) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(v) for v in batch["x"].tolist()]


# -- presets and blocking -------------------------------------------------------------------
def test_queue_hands_items_out_oldest_first_once() -> None:
    rb = ReplayBuffer(8, sampler=Table.queue(timeout=0.05), seed=0)
    rb.extend(values(5))
    assert xs(rb.sample(3)) == [0, 1, 2]
    rb.extend(values(2, 5))
    assert xs(rb.sample(4)) == [3, 4, 5, 6]
    assert len(rb) == 0


def test_stack_hands_items_out_newest_first_once() -> None:
    rb = ReplayBuffer(8, sampler=Table.stack(timeout=0.05), seed=0)
    rb.extend(values(5))
    assert xs(rb.sample(2)) == [4, 3]
    rb.extend(values(1, 9))
    assert xs(rb.sample(3)) == [9, 2, 1]


def test_queue_reader_times_out_and_nothing_changes() -> None:
    rb = ReplayBuffer(4, sampler=Table.queue(timeout=5.0), seed=0)
    rb.extend(values(1))
    with pytest.raises(RateLimitTimeout, match=r"sample of 2 items still blocked after 0\.05 s"):
        rb.sample(2, timeout=0.05)
    assert len(rb) == 1 and xs(rb.sample(1)) == [0]


def test_queue_writer_times_out_when_full_and_nothing_is_written() -> None:
    rb = ReplayBuffer(3, sampler=Table.queue(timeout=0.05), seed=0)
    rb.extend(values(3))
    with pytest.raises(RateLimitTimeout, match="insert of 1 items still blocked"):
        rb.add({"x": torch.tensor(9.0)})
    assert xs(rb.sample_all()) == [0, 1, 2]
    with pytest.raises(CapacityError, match="can never fit a table of capacity 3"):
        rb.extend(values(4))


def test_waiting_reader_is_woken_by_a_writer() -> None:
    rb = ReplayBuffer(4, sampler=Table.queue(timeout=10.0), seed=0)
    got: list[list[int]] = []
    reader = threading.Thread(target=lambda: got.append(xs(rb.sample(2))))
    reader.start()
    time.sleep(0.05)
    rb.extend(values(2, 7))
    reader.join(timeout=10.0)
    assert got == [[7, 8]]


def test_waiting_writer_is_woken_by_a_reader() -> None:
    rb = ReplayBuffer(2, sampler=Table.queue(timeout=10.0), seed=0)
    rb.extend(values(2))
    writer = threading.Thread(target=lambda: rb.extend(values(2, 5)))
    writer.start()
    time.sleep(0.05)
    assert xs(rb.sample(2)) == [0, 1]
    writer.join(timeout=10.0)
    assert xs(rb.sample(2)) == [5, 6]


def test_a_backend_can_poll_while_a_reader_waits() -> None:
    table = Table.queue(timeout=10.0)
    rb = ReplayBuffer(4, sampler=table, seed=0)
    arrived = iter([None, None, values(2, 40)])  # rows that show up outside the buffer's calls

    def pull() -> None:
        rows = next(arrived, None)
        if rows is not None:
            rb.extend(rows)

    table.poll_interval, table.on_wait = 0.01, pull
    assert xs(rb.sample(2)) == [40, 41] and len(rb) == 0
    with pytest.raises(RateLimitTimeout, match="after 0 s"):
        rb.sample(1, timeout=0)


def test_rate_limiter_ratio_is_enforced() -> None:
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=2, error_buffer=4.0)
    rb = ReplayBuffer(10, sampler=Table(rate_limiter=limiter, timeout=0.01), seed=0)
    with pytest.raises(RateLimitTimeout):
        rb.sample(1)  # fewer than min_size_to_sample inserted
    rb.extend(values(2))
    rb.sample(4)  # diff 2 * 2 - 4 = 0 = min_diff (target 2 * 2, error buffer 4)
    with pytest.raises(RateLimitTimeout):
        rb.sample(1)


def test_min_size_counts_the_items_still_there_as_reverb() -> None:
    limiter = RateLimiter(None, min_size_to_sample=3)
    rb = ReplayBuffer(
        8, sampler=Table("fifo", "fifo", max_times_sampled=1, rate_limiter=limiter, timeout=0.01)
    )
    rb.extend(values(3))
    assert xs(rb.sample(1)) == [0]  # leaves: 2 items are there, fewer than 3
    with pytest.raises(RateLimitTimeout, match=r"sample of 1 items still blocked .*deletes=1"):
        rb.sample(1)
    rb.extend(values(1, 3))
    assert xs(rb.sample(1)) == [1]
    assert limiter.state()["deletes"] == 2


def test_consume_once_queue_delivers_each_item_exactly_once_across_threads() -> None:
    rb = ReplayBuffer(16, sampler=Table.queue(timeout=10.0), seed=0)
    writers, per_writer, readers, batch = 3, 200, 3, 4
    total = writers * per_writer
    seen: list[int] = []
    seen_lock = threading.Lock()
    errors: list[BaseException] = []

    def write(w: int) -> None:
        try:
            for i in range(0, per_writer, 5):
                rb.extend(values(5, w * per_writer + i))
        except BaseException as exc:  # reported below
            errors.append(exc)

    def read(share: int) -> None:
        try:
            for _ in range(share):
                got = xs(rb.sample(batch))
                with seen_lock:
                    seen.extend(got)
        except BaseException as exc:  # reported below
            errors.append(exc)

    shares = [total // batch // readers] * readers
    shares[0] += total // batch - sum(shares)
    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    threads += [threading.Thread(target=read, args=(s,)) for s in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30.0)
    assert not errors
    assert sorted(seen) == list(range(total))  # no loss, no duplicate
    assert len(rb) == 0


# -- Reverb's batch semantics -------------------------------------------------------------
def test_fifo_selector_without_a_limit_returns_the_oldest_item_batch_size_times() -> None:
    rb = ReplayBuffer(8, sampler=Table("fifo", "fifo"), seed=0)
    rb.extend(values(3))
    assert xs(rb.sample(4)) == [0, 0, 0, 0]
    assert xs(rb.sample(2, replace=False)) == [0, 1]


def test_max_times_sampled_holds_within_one_batch() -> None:
    rb = ReplayBuffer(8, sampler=Table("fifo", "fifo", max_times_sampled=2), seed=0)
    rb.extend(values(3))
    assert xs(rb.sample(5)) == [0, 0, 1, 1, 2]
    assert len(rb) == 1
    with pytest.raises(EmptyBufferError, match="may be drawn 1 more times"):
        rb.sample(2)
    assert xs(rb.sample(1)) == [2]


def test_uniform_with_a_limit_never_exceeds_it() -> None:
    rb = ReplayBuffer(64, sampler=Table("uniform", "fifo", max_times_sampled=3), seed=0)
    rb.extend(values(20))
    got = xs(rb.sample(60))
    assert sorted(got) == sorted(list(range(20)) * 3)
    assert len(rb) == 0


def test_heap_selectors_follow_priorities_with_ties_by_insertion_order() -> None:
    for selector, order in (("max_heap", [2, 0, 3]), ("min_heap", [1, 0, 3])):
        rb = ReplayBuffer(8, sampler=Table(selector, "fifo", max_times_sampled=1), seed=0)
        rb.extend(values(4))
        rb.update_priority([0, 1, 2, 3], [2.0, 1.0, 5.0, 2.0])
        assert xs(rb.sample(3)) == order


def test_prioritized_selector_frequencies_and_probabilities() -> None:
    rb = ReplayBuffer(8, sampler=Table("prioritized", "fifo", priority_exponent=1.0), seed=0)
    rb.extend(values(3))
    rb.update_priority([0, 1, 2], [1.0, 3.0, 0.0])
    batch = rb.sample(4000)
    counts = np.bincount(np.array(xs(batch)), minlength=3)
    assert counts[2] == 0  # priority 0: never drawn
    assert abs(counts[1] / 4000 - 0.75) < 0.04  # binomial sd ~0.007
    probs = dict(zip(xs(batch), batch["probability"].tolist(), strict=True))
    assert probs[0] == pytest.approx(0.25) and probs[1] == pytest.approx(0.75)
    with pytest.raises(PriorityError, match="draws with replacement"):
        rb.sample(2, replace=False)


def test_prioritized_with_a_limit_does_not_draw_zero_priority_items() -> None:
    rb = ReplayBuffer(8, sampler=Table("prioritized", "fifo", max_times_sampled=1), seed=0)
    rb.extend(values(3))
    rb.update_priority([2], [0.0])
    with pytest.raises(EmptyBufferError, match="may be drawn 2 more times"):
        rb.sample(3)
    assert sorted(xs(rb.sample(2))) == [0, 1]


# -- removers and ids ---------------------------------------------------------------------
def test_fifo_table_ids_are_the_plain_rings_ids() -> None:
    plain, table = ReplayBuffer(5, seed=0), ReplayBuffer(5, sampler=Table("uniform", "fifo"), seed=0)
    for rb in (plain, table):
        assert rb.extend(values(3)) == range(0, 3)
        assert rb.extend(values(4, 3)) == range(3, 7)
        rb.clear()
        assert rb.extend(values(2, 7)) == range(10, 12)
    assert plain.sample_all()["index"].tolist() == table.sample_all()["index"].tolist()


def test_out_of_order_slots_give_fresh_ids_and_stale_ones_are_refused() -> None:
    rb = ReplayBuffer(3, sampler=Table("uniform", "lifo"), seed=0)
    rb.extend(values(3))  # ids 0, 1, 2
    ids = rb.extend(values(2, 3))  # evicts the two newest (slots 2, 1): ids 5, 4
    assert torch.as_tensor(ids).tolist() == [5, 4]
    assert xs(rb.sample_all()) == [0, 3, 4]
    with pytest.raises(StaleIndexError, match="item 2 has been removed"):
        rb.update_priority([2], [1.0])
    with pytest.raises(StaleIndexError):
        rb.update([1], values(1))
    rb.update_priority([1, 5], [1.0, 1.0], stale="skip")
    rb.update(ids, values(2, 20))
    assert xs(rb.sample_all()) == [0, 20, 21]


# -- staleness ---------------------------------------------------------------------------
def test_max_staleness_draws_only_fresh_items_and_drops_the_rest() -> None:
    rb = ReplayBuffer(16, sampler=Table("uniform", "fifo", version_key="policy"), seed=0)
    for version in range(4):
        rb.extend({"x": torch.arange(3.0) + 10 * version, "policy": torch.full((3,), version)})
    batch = rb.sample(50, max_staleness=1, current_version=3)
    assert set(batch["policy"].tolist()) <= {2, 3}
    assert len(rb) == 6  # versions 0 and 1 left the table


def test_writer_side_version_stamp() -> None:
    table = Table.queue(versioned=True, timeout=0.01)
    rb = ReplayBuffer(8, sampler=table, seed=0)
    rb.extend(values(2))
    table.set_version(5)
    rb.extend(values(2, 2))
    assert xs(rb.sample(2, max_staleness=0, current_version=5)) == [2, 3]
    with pytest.raises(RateLimitTimeout):
        rb.sample(1, max_staleness=0, current_version=5)


# -- errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Table("random"), "selector: expected one of"),
        (lambda: Table(remover="prioritized"), "remover: expected one of"),
        (lambda: Table(max_times_sampled=0), "max_times_sampled"),
        (lambda: Table(timeout=-1), "timeout"),
        (lambda: ReplayBuffer(8, nstep=NStep(3, 0.9), sampler=Table()), "cannot serve a buffer with nstep"),
        (lambda: ReplayBuffer(8, num_envs=2, sampler=Table()), "an episode index"),
        (lambda: ReplayBuffer(8, storage=FrameStorage(8), sampler=Table()), "FrameStorage"),
    ],
)
def test_bad_options_are_refused_at_construction(make, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((SpecError, CapacityError), match=match):
        make()


def test_env_field_and_bad_version_key_are_refused_before_writing() -> None:
    rb = ReplayBuffer(8, sampler=Table(), seed=0)
    with pytest.raises(SpecError, match="env field"):
        rb.extend({"x": torch.zeros(2), "env_id": torch.zeros(2, dtype=torch.int64)})
    assert rb.spec is None
    rb = ReplayBuffer(8, sampler=Table(version_key="policy"), seed=0)
    with pytest.raises(SpecError, match="version_key 'policy': expected a scalar integer field, got"):
        rb.extend({"x": torch.zeros(2), "policy": torch.zeros(2)})


def test_a_table_serves_one_buffer_and_options_are_checked() -> None:
    table = Table()
    rb = ReplayBuffer(8, sampler=table, seed=0)
    with pytest.raises(SpecError, match="already serves a buffer"):
        ReplayBuffer(8, sampler=table)
    rb.extend(values(2))
    with pytest.raises(SpecError, match="takes no option 'deadline'"):
        rb.sample(1, deadline=3)
    with pytest.raises(SpecError, match="go together"):
        rb.sample(1, max_staleness=2)
    with pytest.raises(SpecError, match="needs a versioned table"):
        rb.sample(1, max_staleness=2, current_version=3)
    with pytest.raises(SpecError, match="takes no option 'timeout'"):
        ReplayBuffer(8, seed=0).sample(1, timeout=1.0)
    assert len(rb) == 2


# -- state, config, banks -------------------------------------------------------------------
def test_config_rebuilds_the_table() -> None:
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=3, error_buffer=6.0)
    for table in (Table.queue(version_key=("meta", "v")), Table("max_heap", "uniform", rate_limiter=limiter)):
        described = sampler_config(table)
        assert described["name"] == "table"
        assert make_sampler(described).config() == table.config()


def test_bank_round_trip_of_a_table_with_holes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    rb = ReplayBuffer(8, sampler=Table("uniform", "min_heap", max_times_sampled=2), seed=0)
    rb.extend(values(8))
    rb.update_priority(list(range(8)), [float(p) for p in (5, 1, 4, 1, 5, 9, 2, 6)])
    rb.sample(6)
    rb.extend(values(3, 100))  # fills the freed slots, evicts by lowest priority
    xpbank.save(rb, tmp_path / "bank")
    back = xpbank.load(tmp_path / "bank")
    assert isinstance(back.sampler, Table) and back.sampler.config() == rb.sampler.config()
    assert xs(back.sample_all()) == xs(rb.sample_all())
    assert back.sample_all()["index"].tolist() == rb.sample_all()["index"].tolist()
    assert back.sample(5)["index"].tolist() == rb.sample(5)["index"].tolist()
    assert xs(back.sample_all()) == xs(rb.sample_all())


def test_pickle_keeps_the_table_working() -> None:
    rb = ReplayBuffer(4, sampler=Table.queue(timeout=0.01), seed=0)
    rb.extend(values(3))
    copy = pickle.loads(pickle.dumps(rb))
    assert xs(copy.sample(2)) == [0, 1] and len(rb) == 3
    with pytest.raises(RateLimitTimeout):
        copy.sample(2)


def test_epochs_notice_a_write_into_a_full_table() -> None:
    rb = ReplayBuffer(4, sampler=Table("uniform", "min_heap"), seed=0)
    rb.extend(values(4))  # ids 0 .. 3
    for old in (3, 7):  # slot 3 is evicted twice: ids 7, then 11
        rb.update_priority([old], [0.0])
        rb.extend(values(1, 10 + old))
    plan = rb.epochs(2)
    next(plan)
    assert torch.as_tensor(rb.extend(values(1, 30))).tolist() == [4]  # slot 0: below next_id 12
    with pytest.raises(xpbank.BufferChangedError):
        next(plan)
