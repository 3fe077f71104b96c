"""The ReplayBuffer suite, run over every storage backend through ``buffer_factory``.

Data written by :func:`helpers.make_batch` encodes its item number in every field; the
tests write item ``i`` as the buffer's id ``i`` (unless they say otherwise), so the data
of any returned row can be checked against its ``"index"``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from helpers import item_numbers, make_batch, transition_spec
from xpbank import (
    BatchTypeError,
    BufferChangedError,
    CapacityError,
    DeviceError,
    EmptyBufferError,
    Field,
    MemmapStorage,
    ReplayBuffer,
    Spec,
    SpecError,
    StaleIndexError,
    TensorStorage,
    XpbankIndexError,
)
from xpbank.spec.spec import NestedKey

BufferFactory = Callable[..., ReplayBuffer]

SPEC = transition_spec()
KNOWN = "expected 'obs', 'action', 'reward', 'terminated', 'truncated', 'next.obs'"

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


# -- helpers -------------------------------------------------------------------------
def item(spec: Spec, i: int) -> dict[NestedKey, torch.Tensor]:
    """Item ``i`` without a batch dim (what ``add`` takes)."""
    return {k: v[0] for k, v in make_batch(spec, 1, start=i).items()}


def assert_rows(td: TensorDict, spec: Spec, items: Any, keys: Any = None) -> None:
    """Every row of ``td`` holds exactly the data of item ``items[row]``."""
    items = torch.as_tensor(items, dtype=torch.int64).cpu()
    assert td.batch_size == torch.Size([items.shape[0]])
    if items.numel() == 0:
        return
    lo = int(items.min())
    ref = make_batch(spec, int(items.max()) - lo + 1, start=lo)
    for key in spec if keys is None else keys:
        got, want = td[key].cpu(), ref[key][items - lo]
        assert got.dtype == want.dtype, key
        assert torch.equal(got, want), f"field {key!r}: {got} != {want}"


def assert_same(a: Any, b: Any, path: str = "state") -> None:
    """Deep equality of two state dicts (tensors compared exactly, dtype included)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


@contextlib.contextmanager
def unchanged(rb: ReplayBuffer) -> Iterator[None]:
    """Assert that the block leaves ``rb`` exactly as it was: data, ids, cursor and RNG."""
    before, size, spec = rb.state_dict(), len(rb), rb.spec
    yield
    assert len(rb) == size
    assert rb.spec == spec
    assert_same(before, rb.state_dict())


def filled(make: BufferFactory, capacity: int, n: int, **kw: Any) -> ReplayBuffer:
    """A buffer of ``capacity`` with items 0 .. n-1 written (ids == item numbers)."""
    rb = make(capacity, SPEC, **kw)
    if n:
        assert rb.extend(make_batch(SPEC, n)) == range(n)
    return rb


def ids_of(td: TensorDict) -> list[int]:
    return td["index"].tolist()


# -- size, add, extend ---------------------------------------------------------------
def test_new_buffer_is_empty(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    assert len(rb) == 0
    assert not rb.is_full
    assert rb.capacity == 4
    assert rb.spec == SPEC


def test_add_returns_consecutive_ids_and_fills_up(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(3, SPEC)
    for i in range(5):
        assert rb.add(item(SPEC, i)) == i
        assert len(rb) == min(i + 1, 3)
        assert rb.is_full == (i >= 2)
    assert ids_of(rb.sample_all()) == [2, 3, 4]
    assert_rows(rb.sample_all(), SPEC, [2, 3, 4])


def test_extend_returns_ids_as_a_range(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(10, SPEC)
    assert rb.extend(make_batch(SPEC, 3)) == range(0, 3)
    assert rb.extend(make_batch(SPEC, 5, start=3)) == range(3, 8)
    assert len(rb) == 8
    assert not rb.is_full
    assert torch.equal(torch.as_tensor(rb.extend(make_batch(SPEC, 2, start=8))), torch.arange(8, 10))
    assert rb.is_full


@pytest.mark.parametrize("chunks", [[12], [3, 1, 4, 2, 2], [5, 5, 2], [1] * 12, [4, 8]])
def test_fifo_overwrite_keeps_the_newest_items_oldest_first(
    buffer_factory: BufferFactory, chunks: list[int]
) -> None:
    rb = buffer_factory(5, SPEC)
    written = 0
    for n in chunks:
        assert rb.extend(make_batch(SPEC, n, start=written)) == range(written, written + n)
        written += n
        live = list(range(max(0, written - 5), written))
        assert len(rb) == len(live)
        assert rb.is_full == (written >= 5)
        everything = rb.sample_all()
        assert ids_of(everything) == live
        assert_rows(everything, SPEC, live)


@pytest.mark.parametrize("already", [0, 3, 4])
def test_extend_larger_than_capacity_keeps_its_last_items(
    buffer_factory: BufferFactory, already: int
) -> None:
    rb = filled(buffer_factory, 4, already)
    assert rb.extend(make_batch(SPEC, 10, start=already)) == range(already, already + 10)
    live = list(range(already + 6, already + 10))
    assert len(rb) == 4
    assert ids_of(rb.sample_all()) == live
    assert_rows(rb.sample_all(), SPEC, live)


def test_extend_with_zero_items_changes_nothing(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 3)
    with unchanged(rb):
        assert rb.extend(make_batch(SPEC, 0, start=3)) == range(3, 3)
    assert rb.add(item(SPEC, 3)) == 3


def test_add_and_extend_copy_the_data(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    batch = make_batch(SPEC, 2)
    one = item(SPEC, 2)
    rb.extend(batch)
    rb.add(one)
    for value in (*batch.values(), *one.values()):
        if value.dtype == torch.bool:
            value.logical_not_()
        else:
            value.zero_()
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2])


def test_modifying_a_sampled_batch_changes_nothing_stored(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 4)
    for td in (rb.sample(6), rb.sample_all(), rb.sample_by_index([1, 2])):
        td["obs"].fill_(-1.0)
        td["next", "obs"].fill_(-1.0)
        td["action"].fill_(-1)
        td["terminated"].logical_not_()
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2, 3])


def test_every_dtype_round_trips_exactly(buffer_factory: BufferFactory, rich_spec: Spec) -> None:
    rb = buffer_factory(6, rich_spec)
    rb.extend(make_batch(rich_spec, 4))
    rb.add({k: v[0] for k, v in make_batch(rich_spec, 1, start=4).items()})
    rb.extend(make_batch(rich_spec, 5, start=5))
    assert ids_of(rb.sample_all()) == list(range(4, 10))
    assert_rows(rb.sample_all(), rich_spec, range(4, 10))
    sampled = rb.sample(16)
    assert_rows(sampled, rich_spec, sampled["index"])


def test_numpy_and_nested_mapping_batches_are_accepted(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    batch = make_batch(SPEC, 3)
    nested: dict[str, Any] = {k: v.numpy() for k, v in batch.items() if isinstance(k, str)}
    nested["next"] = {"obs": batch["next", "obs"].numpy()}
    assert rb.extend(nested) == range(3)
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2])


def test_tensordict_batches_and_items_are_accepted(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    batch = make_batch(SPEC, 3)
    td = TensorDict(
        {k: v for k, v in batch.items() if isinstance(k, str)} | {"next": {"obs": batch["next", "obs"]}},
        batch_size=[3],
    )
    assert rb.extend(td) == range(3)
    assert rb.add(td[1]) == 3
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2, 1])


def test_grad_tracking_and_strided_inputs_are_stored_as_plain_data(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    batch = make_batch(SPEC, 8)
    strided = {k: v[::2] for k, v in batch.items()}  # items 0, 2, 4, 6
    strided["obs"] = strided["obs"].clone().requires_grad_(True)
    rb.extend(strided)
    rb.update([1], {"reward": torch.tensor([-1.0], requires_grad=True)})
    everything = rb.sample_all()
    assert not everything["obs"].requires_grad
    assert everything["reward"].tolist() == [0.0, -1.0, 4.0, 6.0]
    assert_rows(everything, SPEC, [0, 2, 4, 6], keys=["obs", "action", ("next", "obs"), "truncated"])


# -- sample --------------------------------------------------------------------------
def test_sample_rows_match_the_data_written_for_their_index(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 21, seed=1)
    batch = rb.sample(64)
    assert batch.batch_size == torch.Size([64])
    assert batch["index"].dtype == torch.int64
    assert set(ids_of(batch)) <= set(range(13, 21))
    assert_rows(batch, SPEC, batch["index"])
    assert item_numbers(batch).tolist() == ids_of(batch)


def test_sample_before_wraparound_draws_only_written_items(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 16, 3, seed=2)
    batch = rb.sample(200)
    assert set(ids_of(batch)) == {0, 1, 2}  # 200 draws from 3: each one shows up
    assert_rows(batch, SPEC, batch["index"])


def test_sample_without_replacement_gives_distinct_items(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 11, seed=3)
    for k in (1, 2, 3, 5, 8):
        batch = rb.sample(k, replace=False)
        ids = ids_of(batch)
        assert len(ids) == k and len(set(ids)) == k
        assert set(ids) <= set(range(3, 11))
        assert_rows(batch, SPEC, batch["index"])
    assert sorted(ids_of(rb.sample(8, replace=False))) == list(range(3, 11))


def test_sample_without_replacement_of_more_than_stored_raises(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 3, seed=0)
    msg = "sample: 4 distinct items asked for (replace=False), but only 3 are stored"
    with unchanged(rb), pytest.raises(CapacityError, match=re.escape(msg)):
        rb.sample(4, replace=False)
    assert len(ids_of(rb.sample(4, replace=True))) == 4


# -- sample_by_index -----------------------------------------------------------------
@pytest.mark.parametrize(
    "positions",
    [
        [0, -1, 2, -2],
        torch.tensor([0, -1, 2, -2]),
        np.array([0, -1, 2, -2]),
        np.array([0, -1, 2, -2], dtype=np.int32),
        torch.tensor([0, -1, 2, -2], dtype=torch.int16),
    ],
    ids=["list", "tensor", "ndarray", "int32-array", "int16-tensor"],
)
def test_sample_by_index_counts_from_oldest_and_newest(buffer_factory: BufferFactory, positions: Any) -> None:
    rb = filled(buffer_factory, 5, 8)  # live: 3 4 5 6 7
    batch = rb.sample_by_index(positions)
    assert ids_of(batch) == [3, 7, 5, 6]
    assert_rows(batch, SPEC, [3, 7, 5, 6])


@pytest.mark.parametrize(
    ("positions", "expected"),
    [(range(1, 4), [4, 5, 6]), (range(-1, -6, -1), [7, 6, 5, 4, 3]), (0, [3]), (np.int64(-1), [7]), ([], [])],
)
def test_sample_by_index_accepts_ranges_and_scalars(
    buffer_factory: BufferFactory, positions: Any, expected: list[int]
) -> None:
    rb = filled(buffer_factory, 5, 8)
    batch = rb.sample_by_index(positions)
    assert ids_of(batch) == expected
    assert_rows(batch, SPEC, expected)


@pytest.mark.parametrize("bad", [5, -6, [0, 7], [-1, -9, 12]])
def test_sample_by_index_out_of_range_raises(buffer_factory: BufferFactory, bad: Any) -> None:
    rb = filled(buffer_factory, 8, 5)
    first_bad = next(p for p in np.atleast_1d(bad) if not -5 <= p < 5)
    msg = f"indices: position {first_bad} is out of range for a buffer holding 5 items (valid: -5 .. 4)"
    with unchanged(rb), pytest.raises(XpbankIndexError, match=re.escape(msg)):
        rb.sample_by_index(bad)


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ([0.5], "indices: expected integers, got dtype float64"),
        (torch.tensor([True, False]), "indices: expected integers, got dtype bool"),
        ([[0, 1]], "indices: expected a 1-D sequence of integers, got shape (1, 2)"),
    ],
)
def test_sample_by_index_rejects_non_integer_positions(
    buffer_factory: BufferFactory, bad: Any, msg: str
) -> None:
    rb = filled(buffer_factory, 8, 5)
    with unchanged(rb), pytest.raises(XpbankIndexError, match=re.escape(msg)):
        rb.sample_by_index(bad)


def test_sample_all_after_wraparound_is_oldest_first(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 6, 17)
    everything = rb.sample_all()
    assert ids_of(everything) == list(range(11, 17))
    assert_rows(everything, SPEC, range(11, 17))


# -- fields= -------------------------------------------------------------------------
FIELD_CHOICES: list[Any] = [
    ["obs", ("next", "obs")],
    ["reward"],
    "action",
    ("next", "obs"),
    ["truncated", "obs"],
]


@pytest.mark.parametrize("fields", FIELD_CHOICES)
def test_fields_selects_only_those_entries_plus_index(buffer_factory: BufferFactory, fields: Any) -> None:
    rb = filled(buffer_factory, 6, 9, seed=0)
    keys = [fields] if isinstance(fields, (str, tuple)) else fields
    expected = {k if isinstance(k, str) else tuple(k) for k in keys} | {"index"}
    for td in (
        rb.sample(5, fields=fields),
        rb.sample(3, replace=False, fields=fields),
        rb.sample_by_index([0, -1], fields=fields),
        rb.sample_all(fields=fields),
        next(rb.epochs(4, fields=fields)),
    ):
        assert set(td.keys(include_nested=True, leaves_only=True)) == expected
        assert_rows(td, SPEC, td["index"], keys=keys)


@pytest.mark.parametrize(
    "call",
    [
        lambda rb: rb.sample(2, fields=["obs", "nope"]),
        lambda rb: rb.sample_by_index([0], fields=["nope"]),
        lambda rb: rb.sample_all(fields="nope"),
        lambda rb: next(rb.epochs(2, fields=["nope"])),
    ],
    ids=["sample", "sample_by_index", "sample_all", "epochs"],
)
def test_unknown_field_raises(buffer_factory: BufferFactory, call: Callable[[ReplayBuffer], Any]) -> None:
    rb = filled(buffer_factory, 6, 4, seed=0)
    msg = (
        "fields: unknown field(s) ['nope']; "
        "known: ['obs', 'action', 'reward', 'terminated', 'truncated', 'next.obs']"
    )
    with unchanged(rb), pytest.raises(SpecError, match=re.escape(msg)):
        call(rb)


@pytest.mark.parametrize(
    "bad_call",
    [
        lambda rb: rb.sample(2, fields=["nope"]),
        lambda rb: rb.sample(9, replace=False),
        lambda rb: rb.sample(0),
        lambda rb: next(rb.epochs(2, fields=["nope"])),
    ],
    ids=["unknown-field", "too-many-distinct", "batch-size-0", "epochs-unknown-field"],
)
def test_a_rejected_call_does_not_consume_randomness(
    buffer_factory: BufferFactory, bad_call: Callable[[ReplayBuffer], Any]
) -> None:
    rb, twin = filled(buffer_factory, 6, 4, seed=0), filled(buffer_factory, 6, 4, seed=0)
    with unchanged(rb), pytest.raises((SpecError, CapacityError)):
        bad_call(rb)
    assert ids_of(rb.sample(16)) == ids_of(twin.sample(16))


# -- epochs --------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("written", "batch_size", "drop_last", "sizes"),
    [
        (10, 4, False, [4, 4, 2]),
        (10, 4, True, [4, 4]),
        (10, 5, True, [5, 5]),
        (10, 10, False, [10]),
        (10, 32, False, [10]),
        (10, 32, True, []),
        (23, 3, False, [3, 3, 3, 1]),  # capacity 10, wrapped: live ids 13 .. 22
    ],
)
@pytest.mark.parametrize("shuffle", [True, False])
def test_epochs_visit_every_item_once_per_epoch(
    buffer_factory: BufferFactory,
    written: int,
    batch_size: int,
    drop_last: bool,
    sizes: list[int],
    shuffle: bool,
) -> None:
    rb = filled(buffer_factory, 10, written, seed=5)
    live = list(range(max(0, written - 10), written))
    batches = list(rb.epochs(batch_size, n_epochs=3, shuffle=shuffle, drop_last=drop_last))
    assert [b.batch_size[0] for b in batches] == sizes * 3
    per_epoch = len(sizes)
    for e in range(3):
        ids = [i for b in batches[e * per_epoch : (e + 1) * per_epoch] for i in ids_of(b)]
        assert len(ids) == len(set(ids)) == sum(sizes)
        assert set(ids) <= set(live)
        if not drop_last:
            assert sorted(ids) == live
        if not shuffle:
            assert ids == live[: sum(sizes)]
    for b in batches:
        assert_rows(b, SPEC, b["index"])


def test_epochs_shuffle_draws_a_fresh_order_each_epoch(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 20, 20, seed=6)
    orders = [ids_of(b) for b in rb.epochs(20, n_epochs=3)]
    assert all(sorted(o) == list(range(20)) for o in orders)
    # 20! orders: with a fixed seed these are distinct, and not the identity
    assert orders[0] != orders[1] != orders[2]
    assert list(range(20)) not in orders


@pytest.mark.parametrize(
    "change",
    [lambda rb: rb.add(item(SPEC, 100)), lambda rb: rb.extend(make_batch(SPEC, 0)), lambda rb: rb.clear()],
    ids=["add", "extend-0-items-is-fine", "clear"],
)
def test_changing_the_buffer_during_epochs_raises(
    buffer_factory: BufferFactory, change: Callable[[ReplayBuffer], Any], request: pytest.FixtureRequest
) -> None:
    rb = filled(buffer_factory, 8, 8, seed=0)
    it = rb.epochs(3, n_epochs=2)
    first = next(it)
    assert first.batch_size[0] == 3
    change(rb)
    if "extend-0" in request.node.callspec.id:
        assert sum(b.batch_size[0] for b in it) == 16 - 3  # nothing was added: the plan goes on
        return
    with pytest.raises(
        BufferChangedError,
        match=re.escape("epochs: the buffer was extended or cleared during iteration"),
    ):
        next(it)


def test_update_during_epochs_is_allowed(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 13, seed=0)
    seen = []
    for batch in rb.epochs(3, n_epochs=1):
        seen += ids_of(batch)
        rb.update(batch["index"], {"reward": -batch["index"].to(torch.float32)})
    assert sorted(seen) == list(range(5, 13))
    everything = rb.sample_all()
    assert everything["reward"].tolist() == [-float(i) for i in range(5, 13)]
    assert_rows(everything, SPEC, range(5, 13), keys=["obs", "action", ("next", "obs"), "terminated"])


@pytest.mark.parametrize(
    ("kwargs", "error", "msg"),
    [
        ({"batch_size": 0}, CapacityError, "batch_size: expected a positive int, got 0"),
        ({"batch_size": 2, "n_epochs": 0}, CapacityError, "n_epochs: expected a positive int, got 0"),
        ({"batch_size": 2.0}, CapacityError, "batch_size: expected a positive int, got 2.0"),
    ],
)
def test_epochs_argument_errors(
    buffer_factory: BufferFactory, kwargs: dict[str, Any], error: type[Exception], msg: str
) -> None:
    rb = filled(buffer_factory, 4, 4, seed=0)
    with unchanged(rb), pytest.raises(error, match=re.escape(msg)):
        next(rb.epochs(**kwargs))


# -- update --------------------------------------------------------------------------
def test_update_writes_a_subset_of_fields_in_place(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 6, 9, seed=0)  # live 3 .. 8
    batch = rb.sample(3, replace=False)
    ids = ids_of(batch)
    new_obs = torch.full((3, 3), 0.5) + torch.arange(3.0)[:, None]
    rb.update(batch["index"], {"reward": torch.tensor([10.0, 20.0, 30.0]), "obs": new_obs})
    everything = rb.sample_all()
    for row, i in enumerate(range(3, 9)):
        if i in ids:
            j = ids.index(i)
            assert everything["reward"][row].item() == [10.0, 20.0, 30.0][j]
            assert torch.equal(everything["obs"][row], new_obs[j])
        else:
            assert_rows(everything[row : row + 1], SPEC, [i], keys=["reward", "obs"])
    # untouched fields keep their data everywhere
    assert_rows(everything, SPEC, range(3, 9), keys=["action", "terminated", "truncated", ("next", "obs")])


def test_update_accepts_tensordicts_nested_keys_and_index_kinds(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 6, 6)
    values = TensorDict({"next": {"obs": torch.full((2, 3), -7.0)}}, batch_size=[2])
    rb.update(np.array([1, 4]), values)
    rb.update(range(2, 4), {"action": torch.tensor([-2, -3])})
    rb.update(5, {"terminated": torch.tensor([True])})
    everything = rb.sample_all()
    assert everything["next", "obs"][[1, 4]].eq(-7.0).all()
    assert everything["action"].tolist() == [0, 1, -2, -3, 4, 5]
    assert everything["terminated"].tolist() == [True, False, True, False, True, True]
    assert_rows(everything[[0, 2, 3, 5]], SPEC, [0, 2, 3, 5], keys=[("next", "obs")])


def test_update_with_a_repeated_index_keeps_the_last_row(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 5, 5)
    rb.update([2, 4, 2, 2, 4], {"reward": torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])})
    assert rb.sample_all()["reward"].tolist() == [0.0, 1.0, 4.0, 3.0, 5.0]


def test_update_with_no_indices_changes_nothing(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 5, 5)
    with unchanged(rb):
        rb.update([], {"reward": torch.zeros(0)})


@pytest.mark.parametrize("ids", [[0], [1, 6], torch.tensor([7, 0]), [6, 7, 8, 9, 1]])
def test_update_of_an_overwritten_item_raises_and_writes_nothing(
    buffer_factory: BufferFactory, ids: Any
) -> None:
    rb = filled(buffer_factory, 4, 10)  # live 6 .. 9; 0 .. 5 overwritten
    stale = next(i for i in torch.as_tensor(ids).tolist() if i < 6)
    msg = (
        f"indices: item {stale} has been overwritten or cleared (live items: 6 .. 9); nothing was updated. "
        "Use the 'index' of a recent sample."
    )
    n = len(torch.as_tensor(ids))
    with unchanged(rb), pytest.raises(StaleIndexError, match=re.escape(msg)):
        rb.update(ids, {"reward": torch.full((n,), 99.0)})


def test_a_stale_index_from_a_sample_is_caught_after_the_slot_is_reused(
    buffer_factory: BufferFactory,
) -> None:
    rb = filled(buffer_factory, 4, 4, seed=0)
    batch = rb.sample_by_index([0, 1])  # ids 0, 1 in slots 0, 1
    rb.extend(make_batch(SPEC, 2, start=4))  # ids 4, 5 now in slots 0, 1
    with unchanged(rb), pytest.raises(StaleIndexError, match=r"item 0 has been overwritten or cleared"):
        rb.update(batch["index"], {"reward": torch.zeros(2)})
    assert_rows(rb.sample_all(), SPEC, [2, 3, 4, 5])


def test_update_after_clear_raises(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 3)
    rb.clear()
    rb.extend(make_batch(SPEC, 2, start=50))
    with (
        unchanged(rb),
        pytest.raises(StaleIndexError, match=r"indices: item 1 has been overwritten or cleared"),
    ):
        rb.update([1], {"reward": torch.zeros(1)})


def test_update_of_an_id_not_yet_written_raises(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 3)
    msg = "indices: item 3 has not been written yet (live items: 0 .. 2); nothing was updated."
    with unchanged(rb), pytest.raises(StaleIndexError, match=re.escape(msg)):
        rb.update([0, 3], {"reward": torch.zeros(2)})
    empty = buffer_factory(8, SPEC)
    with unchanged(empty), pytest.raises(StaleIndexError, match=r"item 0 has not been written yet"):
        empty.update([0], {"reward": torch.zeros(1)})


def test_update_of_a_lazy_buffer_before_any_write_raises() -> None:
    rb = ReplayBuffer(4)
    msg = "update: the buffer is empty (nothing has been written yet)"
    with unchanged(rb), pytest.raises(EmptyBufferError, match=re.escape(msg)):
        rb.update([0], {"reward": torch.zeros(1)})


@pytest.mark.parametrize(
    ("values", "msg"),
    [
        ({"reward": torch.zeros(3)}, "update: got 2 indices but 3 rows of values"),
        ({"bonus": torch.zeros(2)}, f"batch keys do not match the spec: unknown field(s) ['bonus']; {KNOWN}"),
        (
            {"action": torch.zeros(2, dtype=torch.float64)},
            "field 'action': expected (*) int64, got (2,) float64",
        ),
        ({"obs": torch.zeros(2, 4)}, "field 'obs': expected (*, 3) float32, got (2, 4) float32"),
        (
            {"reward": torch.zeros(2), "action": torch.zeros(1, dtype=torch.int64)},
            "field 'action': batch shape (1,) differs from field 'reward''s (2,)",
        ),
    ],
    ids=["row-count", "unknown-key", "dtype", "shape", "ragged"],
)
def test_update_with_bad_values_raises_and_writes_nothing(
    buffer_factory: BufferFactory, values: dict[str, torch.Tensor], msg: str
) -> None:
    rb = filled(buffer_factory, 4, 4)
    with unchanged(rb), pytest.raises(SpecError, match=re.escape(msg)):
        rb.update([1, 2], values)


# -- clear ---------------------------------------------------------------------------
def test_clear_then_reuse(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 6, seed=0)
    rb.clear()
    assert len(rb) == 0 and not rb.is_full
    assert rb.spec == SPEC and rb.capacity == 4
    with pytest.raises(EmptyBufferError, match=re.escape("sample: the buffer is empty; add or extend first")):
        rb.sample(1)
    ids = rb.extend(make_batch(SPEC, 3, start=100))
    assert len(ids) == 3 and ids.start > 5  # ids are never reused
    assert len(rb) == 3
    everything = rb.sample_all()
    assert ids_of(everything) == list(ids)
    assert item_numbers(everything).tolist() == [100, 101, 102]
    rb.update(ids[1:2], {"reward": torch.tensor([-1.0])})
    assert rb.sample_all()["reward"].tolist() == [100.0, -1.0, 102.0]
    more = rb.extend(make_batch(SPEC, 3, start=103))
    assert more == range(ids.stop, ids.stop + 3)
    assert item_numbers(rb.sample_all()).tolist() == [102, 103, 104, 105]
    sampled = rb.sample(20)
    assert torch.equal(item_numbers(sampled) - 100, sampled["index"] - ids.start)


def test_clear_of_an_empty_buffer_is_harmless(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(3, SPEC)
    rb.clear()
    rb.clear()
    assert rb.extend(make_batch(SPEC, 2)) == range(0, 2)
    assert_rows(rb.sample_all(), SPEC, [0, 1])


# -- lazy spec -----------------------------------------------------------------------
def test_lazy_spec_from_first_extend(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4)
    assert rb.spec is None
    rb.extend(make_batch(SPEC, 3))
    assert rb.spec == SPEC
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2])
    bad = {**make_batch(SPEC, 2), "action": torch.zeros(2, dtype=torch.float64)}
    with (
        unchanged(rb),
        pytest.raises(SpecError, match=re.escape("field 'action': expected (*) int64, got (2,) float64")),
    ):
        rb.extend(bad)


def test_lazy_spec_from_first_add(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4)
    assert rb.add(item(SPEC, 0)) == 0
    assert rb.spec == SPEC
    rb.extend(make_batch(SPEC, 2, start=1))
    assert_rows(rb.sample_all(), SPEC, [0, 1, 2])
    missing = {k: v for k, v in item(SPEC, 3).items() if k != "truncated"}
    with unchanged(rb), pytest.raises(SpecError, match=re.escape("missing field(s) ['truncated']")):
        rb.add(missing)


def test_lazy_spec_takes_python_numbers(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4)
    rb.add({"x": 1.5, "n": 3, "flag": True})
    assert {k: f.dtype for k, f in rb.spec.items()} == {
        "x": torch.float32,
        "n": torch.int64,
        "flag": torch.bool,
    }
    assert all(f.shape == () for f in rb.spec.values())
    with (
        unchanged(rb),
        pytest.raises(SpecError, match=re.escape("field 'n': expected () int64, got () float64")),
    ):
        rb.add({"x": 1.0, "n": 2.0, "flag": False})


def test_lazy_spec_rejected_first_batch_leaves_the_buffer_lazy(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4)
    ragged = {"a": torch.zeros(3), "b": torch.zeros(2)}
    with pytest.raises(
        SpecError, match=re.escape("field 'b': batch shape (2,) differs from field 'a''s (3,)")
    ):
        rb.extend(ragged)
    assert rb.spec is None and len(rb) == 0
    with pytest.raises(SpecError, match=re.escape("cannot infer a spec from an empty batch (no fields)")):
        rb.extend({})
    assert rb.spec is None
    rb.extend(make_batch(SPEC, 1))
    assert rb.spec == SPEC


# -- input errors: the buffer stays exactly as it was -----------------------------------
def _with(key: NestedKey, value: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
    return {**make_batch(SPEC, 4, start=100), key: value}


def _without(key: NestedKey) -> dict[NestedKey, torch.Tensor]:
    return {k: v for k, v in make_batch(SPEC, 4, start=100).items() if k != key}


BAD_BATCHES = [
    (
        _without("reward"),
        SpecError,
        f"batch keys do not match the spec: missing field(s) ['reward']; {KNOWN}",
    ),
    (_without(("next", "obs")), SpecError, "missing field(s) ['next.obs']"),
    (
        _with("bonus", torch.zeros(4)),
        SpecError,
        "batch keys do not match the spec: unknown field(s) ['bonus']",
    ),
    (
        {**_without("action"), "act": torch.zeros(4)},
        SpecError,
        "missing field(s) ['action']; unknown field(s) ['act']",
    ),
    (_with("obs", torch.zeros(4, 5)), SpecError, "field 'obs': expected (*, 3) float32, got (4, 5) float32"),
    (_with("obs", torch.zeros(4)), SpecError, "field 'obs': expected (*, 3) float32, got (4,) float32"),
    (
        _with(("next", "obs"), torch.zeros(4, 2)),
        SpecError,
        "field 'next.obs': expected (*, 3) float32, got (4, 2) float32",
    ),
    (_with("action", torch.zeros(4)), SpecError, "field 'action': expected (*) int64, got (4,) float32"),
    (
        _with("terminated", torch.zeros(4, dtype=torch.uint8)),
        SpecError,
        "field 'terminated': expected (*) bool, got (4,) uint8",
    ),
    (
        _with("action", torch.zeros(3, dtype=torch.int64)),
        SpecError,
        "field 'action': batch shape (3,) differs from field 'obs''s (4,)",
    ),
    ([1, 2, 3], BatchTypeError, "a batch must be a TensorDict or a mapping of tensors/arrays, got list"),
    (_with("reward", "high"), BatchTypeError, "field 'reward': expected a tensor, array or number, got str"),
]


@pytest.mark.parametrize(("batch", "error", "msg"), BAD_BATCHES)
@pytest.mark.parametrize("written", [0, 3, 9])
def test_extend_with_a_bad_batch_raises_and_changes_nothing(
    buffer_factory: BufferFactory, batch: Any, error: type[Exception], msg: str, written: int
) -> None:
    rb = filled(buffer_factory, 5, written, seed=0)
    with unchanged(rb), pytest.raises(error, match=re.escape(msg)):
        rb.extend(batch)
    assert rb.extend(make_batch(SPEC, 1, start=written)) == range(written, written + 1)  # still usable


@pytest.mark.parametrize(
    ("bad", "msg"),
    [
        ({k: v for k, v in item(SPEC, 9).items() if k != "action"}, "missing field(s) ['action']"),
        ({**item(SPEC, 9), "extra": torch.zeros(())}, "unknown field(s) ['extra']"),
        ({**item(SPEC, 9), "obs": torch.zeros(2)}, "field 'obs': expected (3,) float32, got (2,) float32"),
        (
            {**item(SPEC, 9), "obs": torch.zeros(1, 3)},
            "field 'obs': expected (3,) float32, got (1, 3) float32",
        ),
        (
            {**item(SPEC, 9), "action": torch.zeros((), dtype=torch.float32)},
            "field 'action': expected () int64, got () float32",
        ),
    ],
    ids=["missing", "extra", "shape", "batched", "dtype"],
)
def test_add_with_a_bad_item_raises_and_changes_nothing(
    buffer_factory: BufferFactory, bad: dict[NestedKey, torch.Tensor], msg: str
) -> None:
    rb = filled(buffer_factory, 5, 7, seed=0)
    with unchanged(rb), pytest.raises(SpecError, match=re.escape(msg)):
        rb.add(bad)


@pytest.mark.parametrize(
    "call",
    [lambda rb: rb.sample(1), lambda rb: rb.sample(3, replace=False), lambda rb: rb.sample_all()],
    ids=["sample", "sample-distinct", "sample_all"],
)
@pytest.mark.parametrize("lazy", [True, False])
def test_reading_an_empty_buffer_raises(
    buffer_factory: BufferFactory, call: Callable[[ReplayBuffer], Any], lazy: bool
) -> None:
    rb = buffer_factory(4, None if lazy else SPEC, seed=0)
    with unchanged(rb), pytest.raises(EmptyBufferError, match=r": the buffer is empty; add or extend first$"):
        call(rb)


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda rb: rb.sample(2), "sample"),
        (lambda rb: rb.sample_by_index([0]), "sample_by_index"),
        (lambda rb: rb.sample_all(), "sample_all"),
        (lambda rb: next(rb.epochs(2)), "epochs"),
    ],
)
def test_reading_a_cleared_buffer_raises(
    buffer_factory: BufferFactory, call: Callable[[ReplayBuffer], Any], what: str
) -> None:
    rb = filled(buffer_factory, 4, 6, seed=0)
    rb.clear()
    msg = f"{what}: the buffer is empty; add or extend first"
    with unchanged(rb), pytest.raises(EmptyBufferError, match=re.escape(msg)):
        call(rb)


@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0, "4", None])
@pytest.mark.parametrize("replace", [True, False])
def test_non_positive_batch_size_raises(
    buffer_factory: BufferFactory, batch_size: Any, replace: bool
) -> None:
    rb = filled(buffer_factory, 4, 4, seed=0)
    msg = f"batch_size: expected a positive int, got {batch_size!r}"
    with unchanged(rb), pytest.raises(CapacityError, match=re.escape(msg)):
        rb.sample(batch_size, replace=replace)


@pytest.mark.parametrize("capacity", [0, -3, True, 2.5, "8", None])
@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_bad_capacity_raises(capacity: Any, storage: str) -> None:
    with pytest.raises(
        CapacityError, match=re.escape(f"capacity: expected a positive int, got {capacity!r}")
    ):
        ReplayBuffer(capacity, SPEC, storage=storage)


@pytest.mark.parametrize(
    ("storage", "msg"),
    [
        ("disk", "storage: expected 'memory', 'memmap' or a Storage, got 'disk'"),
        ("", "storage: expected 'memory', 'memmap' or a Storage, got ''"),
        (42, "storage: expected 'memory', 'memmap' or a Storage, got int"),
        (None, "storage: expected 'memory', 'memmap' or a Storage, got NoneType"),
        (torch.zeros(4), "storage: expected 'memory', 'memmap' or a Storage, got Tensor"),
    ],
)
def test_bad_storage_argument_raises(storage: Any, msg: str) -> None:
    with pytest.raises(SpecError, match=re.escape(msg)):
        ReplayBuffer(4, SPEC, storage=storage)


def test_storage_instance_of_another_capacity_raises(tmp_path: Path) -> None:
    for storage in (TensorStorage(8), MemmapStorage(8, tmp_path / "m", spec=SPEC)):
        spec_before = storage.spec
        with pytest.raises(
            CapacityError, match=re.escape("storage has capacity 8, but the buffer was given 4")
        ):
            ReplayBuffer(4, SPEC, storage=storage)
        assert storage.spec == spec_before


def test_storage_instance_with_another_spec_raises() -> None:
    other = Spec({"x": SPEC["reward"]})
    storage = TensorStorage(4, other)
    with pytest.raises(
        SpecError, match=r"^storage holds Spec\(\{'x': \(\*\) float32\}\), but the buffer was given Spec"
    ):
        ReplayBuffer(4, SPEC, storage=storage)
    assert storage.spec == other


def test_storage_instance_is_used_and_initialized(tmp_path: Path) -> None:
    for storage in (TensorStorage(4), MemmapStorage(4, tmp_path / "m")):
        rb = ReplayBuffer(4, SPEC, storage=storage)
        assert rb.storage is storage and storage.spec == SPEC
        rb.extend(make_batch(SPEC, 2))
        assert_rows(storage.read(torch.tensor([1, 0])), SPEC, [1, 0])


def test_spec_of_the_wrong_type_raises() -> None:
    with pytest.raises(SpecError, match=re.escape("spec: expected a Spec or None, got dict")):
        ReplayBuffer(4, {"obs": SPEC["obs"]})  # type: ignore[arg-type]


# -- device --------------------------------------------------------------------------
def test_device_cpu_delivers_on_cpu(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 6, device="cpu", seed=0)
    assert rb.device == torch.device("cpu")
    for td in (rb.sample(3), rb.sample_all(), rb.sample_by_index([0]), next(rb.epochs(2))):
        assert td.device == torch.device("cpu")
        assert td["obs"].device == td["index"].device == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without CUDA")
@pytest.mark.parametrize("kw", [{"device": "cuda"}, {"storing_device": "cuda"}, {"device": "cuda:0"}])
def test_cuda_without_cuda_raises(kw: dict[str, str]) -> None:
    with pytest.raises(
        DeviceError, match=r"^device 'cuda(:0)?' was asked for, but CUDA is not available here$"
    ):
        ReplayBuffer(4, SPEC, **kw)


def test_memmap_storage_cannot_store_on_another_device() -> None:
    msg = "storage='memmap' keeps data on the CPU; got storing_device='meta'"
    with pytest.raises(SpecError, match=re.escape(msg)):
        ReplayBuffer(4, SPEC, storage="memmap", storing_device="meta")


@pytest.mark.cuda
@needs_cuda
def test_device_cuda_delivers_on_cuda(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 7, device="cuda", seed=0)
    for td in (
        rb.sample(5),
        rb.sample(3, replace=False),
        rb.sample_all(),
        rb.sample_by_index([-1]),
        next(rb.epochs(2)),
    ):
        assert td["obs"].device.type == "cuda"
        assert td["index"].device.type == "cuda"
        assert_rows(td, SPEC, td["index"])
    batch = rb.sample(4)
    rb.update(batch["index"], {"reward": batch["reward"] * 0 - 1})
    assert rb.sample_all()["reward"].eq(-1).sum().item() == len(set(ids_of(batch)))


@pytest.mark.cuda
@needs_cuda
def test_storing_device_cuda_round_trips() -> None:
    rb = ReplayBuffer(4, SPEC, storing_device="cuda", seed=0)
    rb.extend(make_batch(SPEC, 6))
    assert rb.sample(2)["obs"].device.type == "cuda"
    assert_rows(rb.sample_all(), SPEC, range(2, 6))
    other = ReplayBuffer(4, SPEC)
    other.load_state_dict(rb.state_dict())
    assert_rows(other.sample_all(), SPEC, range(2, 6))


# -- state_dict ----------------------------------------------------------------------
def _same_future(a: ReplayBuffer, b: ReplayBuffer) -> None:
    """``a`` and ``b`` hold the same items and give the same next samples."""
    assert len(a) == len(b) and a.is_full == b.is_full
    assert_same(a.sample_all().to_dict(), b.sample_all().to_dict())
    for _ in range(3):
        assert_same(a.sample(7).to_dict(), b.sample(7).to_dict())
        assert_same(a.sample(3, replace=False).to_dict(), b.sample(3, replace=False).to_dict())
    for x, y in zip(a.epochs(3), b.epochs(3), strict=True):
        assert_same(x.to_dict(), y.to_dict())


@pytest.mark.parametrize("written", [3, 8, 13])
@pytest.mark.parametrize("target", ["same", "other"])
def test_state_dict_round_trip(buffer_factory: BufferFactory, written: int, target: str) -> None:
    rb = filled(buffer_factory, 8, written, seed=11)
    rb.sample(5)  # move the generator away from its seed
    if target == "same":
        other = buffer_factory(8, SPEC, seed=99)
    else:  # the other backend: state is storage-independent
        other = ReplayBuffer(8, SPEC, storage="memmap" if buffer_factory.kind == "memory" else "memory")  # type: ignore[attr-defined]
    other.extend(make_batch(SPEC, 2, start=500))  # content to be replaced
    other.load_state_dict(rb.state_dict())
    _same_future(rb, other)
    # both go on alike: same ids, overwrites and stale checks
    assert rb.extend(make_batch(SPEC, 6, start=written)) == other.extend(make_batch(SPEC, 6, start=written))
    _same_future(rb, other)
    for buf in (rb, other):
        with pytest.raises(StaleIndexError):
            buf.update([written - 8], {"reward": torch.zeros(1)})


def test_state_dict_survives_torch_save_and_weights_only_load(
    buffer_factory: BufferFactory, tmp_path: Path
) -> None:
    rb = filled(buffer_factory, 6, 10, seed=3)
    rb.update([5, 7], {"reward": torch.tensor([-5.0, -7.0])})
    torch.save(rb.state_dict(), tmp_path / "rb.pt")
    state = torch.load(tmp_path / "rb.pt", weights_only=True)
    other = buffer_factory(6, seed=0)  # lazy: the spec comes from the state
    other.load_state_dict(state)
    assert other.spec == SPEC
    assert other.sample_all()["reward"].tolist() == [4.0, -5.0, 6.0, -7.0, 8.0, 9.0]
    _same_future(rb, other)


def test_state_dict_is_a_snapshot(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 5, seed=0)
    state = rb.state_dict()
    expected = rb.sample_all().to_dict()
    rb.update([3], {"reward": torch.tensor([-1.0])})
    rb.extend(make_batch(SPEC, 3, start=5))
    other = buffer_factory(4, SPEC)
    other.load_state_dict(state)
    assert_same(other.sample_all().to_dict(), expected)
    assert other.extend(make_batch(SPEC, 1, start=5)) == range(5, 6)


@pytest.mark.parametrize("how", ["cleared", "lazy-empty", "spec-empty"])
def test_state_dict_of_an_empty_buffer_round_trips(buffer_factory: BufferFactory, how: str) -> None:
    if how == "cleared":
        rb = filled(buffer_factory, 4, 6, seed=0)
        rb.clear()
    else:
        rb = buffer_factory(4, None if how == "lazy-empty" else SPEC, seed=0)
    other = filled(buffer_factory, 4, 2, seed=1)
    other.load_state_dict(rb.state_dict())
    assert len(other) == 0
    with pytest.raises(EmptyBufferError):
        other.sample(1)
    new_ids = other.extend(make_batch(SPEC, 2))
    assert new_ids == rb.extend(make_batch(SPEC, 2))
    assert_same(other.sample(4).to_dict(), rb.sample(4).to_dict())


def test_load_state_dict_of_another_capacity_raises(buffer_factory: BufferFactory) -> None:
    state = filled(buffer_factory, 8, 5).state_dict()
    rb = filled(buffer_factory, 4, 3, seed=0)
    with (
        unchanged(rb),
        pytest.raises(CapacityError, match=re.escape("state is of a buffer of capacity 8, this one has 4")),
    ):
        rb.load_state_dict(state)


def test_load_state_dict_of_another_version_or_spec_raises(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 3, seed=0)
    state = rb.state_dict()
    with unchanged(rb), pytest.raises(SpecError, match=re.escape("state version: expected 1, got 7")):
        rb.load_state_dict({**state, "version": 7})
    other = buffer_factory(4, Spec({"x": SPEC["reward"]}))
    other.extend({"x": torch.arange(3.0)})
    with (
        unchanged(other),
        pytest.raises(SpecError, match=r"^state holds Spec\(\{'obs'.*but this storage holds Spec\(\{'x'"),
    ):
        other.load_state_dict(state)


# -- seeds ---------------------------------------------------------------------------
def _draws(rb: ReplayBuffer) -> list[list[int]]:
    out = [ids_of(rb.sample(16)) for _ in range(3)]
    out += [ids_of(rb.sample(6, replace=False)) for _ in range(3)]
    out += [ids_of(b) for b in rb.epochs(5, n_epochs=2)]
    return out


def test_same_seed_gives_the_same_samples(buffer_factory: BufferFactory) -> None:
    a = filled(buffer_factory, 16, 20, seed=1234)
    b = filled(buffer_factory, 16, 20, seed=1234)
    assert _draws(a) == _draws(b)
    assert_same(a.sample(8).to_dict(), b.sample(8).to_dict())


def test_different_seeds_give_different_samples(buffer_factory: BufferFactory) -> None:
    draws = [_draws(filled(buffer_factory, 16, 20, seed=s)) for s in (0, 1, 2)]
    assert draws[0] != draws[1] and draws[1] != draws[2] and draws[0] != draws[2]


def test_the_storage_backend_does_not_change_the_samples(tmp_path: Path) -> None:
    a = ReplayBuffer(16, SPEC, storage="memory", seed=7)
    b = ReplayBuffer(16, SPEC, storage=MemmapStorage(16, tmp_path / "m"), seed=7)
    for rb in (a, b):
        rb.extend(make_batch(SPEC, 20))
    assert _draws(a) == _draws(b)


# -- reserved field names ------------------------------------------------------------
INDEX_RESERVED = (
    "field 'index' is reserved: sampled batches carry the items' ids under 'index', "
    "which would hide the stored field; rename it"
)


@pytest.mark.parametrize(
    "write",
    [
        lambda rb: rb.extend({"index": torch.tensor([10.0, 11.0]), "x": torch.zeros(2)}),
        lambda rb: rb.add({"index": torch.tensor(10.0), "x": torch.tensor(0.0)}),
    ],
    ids=["extend", "add"],
)
def test_a_lazy_first_write_with_a_field_named_index_is_rejected(
    buffer_factory: BufferFactory, write: Callable[[ReplayBuffer], Any]
) -> None:
    rb = buffer_factory(4)
    with unchanged(rb), pytest.raises(SpecError, match=re.escape(INDEX_RESERVED)):
        write(rb)
    assert rb.spec is None
    rb.extend({"idx": torch.tensor([10.0, 11.0]), "x": torch.zeros(2)})  # any other name is fine
    assert rb.sample_all()["idx"].tolist() == [10.0, 11.0]


def test_a_spec_with_a_field_named_index_is_rejected(tmp_path: Path) -> None:
    spec = Spec({"index": SPEC["reward"], "x": SPEC["obs"]})
    with pytest.raises(SpecError, match=re.escape(INDEX_RESERVED)):
        ReplayBuffer(4, spec)
    for storage in (TensorStorage(4, spec), MemmapStorage(4, tmp_path / "m", spec=spec)):
        with pytest.raises(SpecError, match=re.escape(INDEX_RESERVED)):
            ReplayBuffer(4, storage=storage)


# -- known gaps ----------------------------------------------------------------------
def test_numpy_int_batch_sizes_are_accepted_like_numpy_int_capacities(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, np.int64(4), 6, seed=0)
    assert rb.capacity == 4
    assert rb.sample(np.int64(3))["index"].shape == (3,)
    assert [b.batch_size[0] for b in rb.epochs(np.int64(3), n_epochs=np.int64(1))] == [3, 1]


# -- argument checks happen at the call ---------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch_size: expected a positive int, got 0"),
        ({"batch_size": 2, "n_epochs": 0}, "n_epochs: expected a positive int, got 0"),
    ],
)
def test_epochs_rejects_bad_arguments_before_iteration(
    buffer_factory: BufferFactory, kwargs: dict[str, int], message: str
) -> None:
    rb = filled(buffer_factory, 6, 4, seed=0)
    with unchanged(rb), pytest.raises(CapacityError, match=re.escape(message)):
        rb.epochs(**kwargs)  # no next(): the error comes from the call itself


def test_epochs_on_an_empty_buffer_raises_at_the_call(buffer_factory: BufferFactory) -> None:
    rb = buffer_factory(4, SPEC)
    with pytest.raises(EmptyBufferError, match="epochs: the buffer is empty"):
        rb.epochs(2)


def test_stale_message_on_an_empty_buffer_says_it_is_empty(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 4, 3, seed=0)
    rb.clear()
    msg = "indices: item 0 has been overwritten or cleared (the buffer is empty); nothing was updated."
    with unchanged(rb), pytest.raises(StaleIndexError, match=re.escape(msg)):
        rb.update([0], {"reward": torch.zeros(1)})


def test_large_rows_round_trip_through_the_direct_write_path(buffer_factory: BufferFactory) -> None:
    # 64 items of 2 x 4x84x84 uint8 frames = 3.6 MB per extend: past the scratch size, so
    # the packed storage writes field by field; both paths must store the same bytes.
    spec = Spec(
        {
            "obs": Field((4, 84, 84), torch.uint8),
            "reward": Field(()),
            ("next", "obs"): Field((4, 84, 84), torch.uint8),
        }
    )
    rb = buffer_factory(100, spec, seed=0)
    gen = torch.Generator().manual_seed(5)
    frames = torch.randint(0, 256, (130, 4, 84, 84), dtype=torch.uint8, generator=gen)
    for start in (0, 64, 128):  # the second extend wraps (64 + 64 > 100), the third is tiny
        stop = min(start + 64, 130)
        rb.extend(
            {
                "obs": frames[start:stop],
                "reward": torch.arange(start, stop, dtype=torch.float32),
                ("next", "obs"): frames[start:stop].flip(-1),
            }
        )
    stored = rb.sample_all()
    assert torch.equal(stored["reward"], torch.arange(30, 130, dtype=torch.float32))
    assert torch.equal(stored["obs"], frames[30:130])
    assert torch.equal(stored["next", "obs"], frames[30:130].flip(-1))


def test_a_sampled_batch_can_be_passed_back_whole_to_update(buffer_factory: BufferFactory) -> None:
    rb = filled(buffer_factory, 8, 6, seed=0)
    batch = rb.sample(4, replace=False)
    batch["reward"] = batch["reward"] + 100.0
    rb.update(batch["index"], batch)  # carries "index" too: ignored, not an unknown field
    stored = rb.sample_by_index(batch["index"] - rb.sample_by_index(0)["index"])
    assert torch.equal(stored["reward"], batch["reward"])
    assert torch.equal(stored["obs"], batch["obs"])
