"""ReplayBuffer driven by hypothesis against a tiny list-based model, on both backends.

The model is a Python list of ``(id, row)`` pairs, oldest first, at most ``capacity``
long, plus the next id to hand out. Ids are never reused: :meth:`ReplayBuffer.clear`
moves the next id up to a multiple of the capacity (documented in ``xpbank/ring/ids.py``),
so the model does the same.
"""

from __future__ import annotations

import io
import re

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from tensordict import TensorDict

from helpers import make_batch, transition_spec
from xpbank import (
    CapacityError,
    EmptyBufferError,
    ReplayBuffer,
    SpecError,
    StaleIndexError,
    XpbankIndexError,
)
from xpbank.spec.spec import NestedKey

SPEC = transition_spec()
KEYS: list[NestedKey] = list(SPEC)

Row = dict[NestedKey, torch.Tensor]


def rows_of(batch: dict[NestedKey, torch.Tensor]) -> list[Row]:
    n = next(iter(batch.values())).shape[0]
    return [{k: v[i].clone() for k, v in batch.items()} for i in range(n)]


class ReplayModel(RuleBasedStateMachine):
    """Compares every observable effect of a ReplayBuffer with the list model."""

    storage = "memory"

    def __init__(self) -> None:
        super().__init__()
        self.rb: ReplayBuffer | None = None
        self.capacity = 0
        self.items: list[tuple[int, Row]] = []
        self.next_id = 0
        self.payload = 1000  # data values, unrelated to ids
        self.spec_known = False

    # -- model helpers ---------------------------------------------------------------
    @property
    def buffer(self) -> ReplayBuffer:
        assert self.rb is not None
        return self.rb

    @property
    def first_id(self) -> int:
        return self.next_id - len(self.items)

    def row_of(self, id_: int) -> Row:
        for i, row in self.items:
            if i == id_:
                return row
        raise AssertionError(f"id {id_} is not live in the model")

    def check_rows(self, td: TensorDict, ids: list[int], keys: list[NestedKey] | None = None) -> None:
        """``td`` holds ids ``ids`` and, for each, the model's data of that id."""
        assert td["index"].dtype == torch.int64
        assert td["index"].tolist() == ids
        assert td.batch_size == torch.Size([len(ids)])
        for key in KEYS if keys is None else keys:
            for r, id_ in enumerate(ids):
                assert torch.equal(td[key][r], self.row_of(id_)[key]), (key, id_)

    def write(self, rows: list[Row]) -> None:
        for row in rows:
            self.items.append((self.next_id, row))
            self.next_id += 1
        del self.items[: max(0, len(self.items) - self.capacity)]
        self.payload += len(rows)
        self.spec_known = True

    def check_all(self) -> None:
        if not self.items:
            try:
                self.buffer.sample_all()
            except EmptyBufferError as exc:
                assert str(exc) == "sample_all: the buffer is empty; add or extend first"
            else:
                raise AssertionError("sample_all of an empty buffer did not raise")
            return
        self.check_rows(self.buffer.sample_all(), [i for i, _ in self.items])

    # -- rules ---------------------------------------------------------------------------
    @initialize(capacity=st.integers(1, 7), seed=st.integers(0, 2**16), lazy=st.booleans())
    def setup(self, capacity: int, seed: int, lazy: bool) -> None:
        self.capacity = capacity
        self.rb = ReplayBuffer(capacity, None if lazy else SPEC, storage=self.storage, seed=seed)
        self.spec_known = not lazy

    @rule()
    def add(self) -> None:
        (row,) = rows_of(make_batch(SPEC, 1, start=self.payload))
        assert self.buffer.add(row) == self.next_id
        self.write([row])

    @rule(n=st.integers(0, 10))
    def extend(self, n: int) -> None:
        batch = make_batch(SPEC, n, start=self.payload)
        if n == 0 and not self.spec_known:
            # an empty batch still lays out a lazy buffer
            assert self.buffer.extend(batch) == range(self.next_id, self.next_id)
            self.spec_known = True
            return
        assert self.buffer.extend(batch) == range(self.next_id, self.next_id + n)
        self.write(rows_of(batch) if n else [])

    @rule(data=st.data())
    def sample_by_index(self, data: st.DataObject) -> None:
        size = len(self.items)
        if size == 0:
            try:
                self.buffer.sample_by_index([0])
            except EmptyBufferError:
                return
            raise AssertionError("sample_by_index of an empty buffer did not raise")
        positions = data.draw(st.lists(st.integers(-size, size - 1), max_size=10), label="positions")
        kind = data.draw(st.sampled_from(["list", "tensor"]), label="kind")
        td = self.buffer.sample_by_index(
            positions if kind == "list" else torch.tensor(positions, dtype=torch.int64)
        )
        self.check_rows(td, [self.items[p][0] for p in positions])

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def sample_by_index_out_of_range(self, data: st.DataObject) -> None:
        size = len(self.items)
        bad = data.draw(
            st.one_of(st.integers(size, size + 5), st.integers(-size - 5, -size - 1)), label="bad"
        )
        msg = f"indices: position {bad} is out of range for a buffer holding {size} items"
        try:
            self.buffer.sample_by_index([0, bad])
        except XpbankIndexError as exc:
            assert re.match(re.escape(msg), str(exc)), str(exc)
        else:
            raise AssertionError("out-of-range position did not raise")

    @rule()
    def sample_all(self) -> None:
        self.check_all()

    @rule(batch_size=st.integers(1, 10), replace=st.booleans())
    def sample(self, batch_size: int, replace: bool) -> None:
        size = len(self.items)
        try:
            td = self.buffer.sample(batch_size, replace=replace)
        except EmptyBufferError:
            assert size == 0
            return
        except CapacityError as exc:
            assert not replace and batch_size > size, str(exc)
            return
        assert size > 0 and (replace or batch_size <= size)
        ids = td["index"].tolist()
        assert len(ids) == batch_size
        assert all(self.first_id <= i < self.next_id for i in ids)
        if not replace:
            assert len(set(ids)) == batch_size
        self.check_rows(td, ids)

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def update_live(self, data: st.DataObject) -> None:
        live = [i for i, _ in self.items]
        ids = data.draw(st.lists(st.sampled_from(live), max_size=8), label="ids")
        keys = data.draw(st.lists(st.sampled_from(KEYS), min_size=1, unique=True), label="fields")
        values = make_batch(SPEC.select(keys), len(ids), start=self.payload)
        self.payload += len(ids)
        self.buffer.update(torch.tensor(ids, dtype=torch.int64), values)
        for r, id_ in enumerate(ids):  # a repeated id: the last row wins
            row = self.row_of(id_)
            for key in keys:
                row[key] = values[key][r].clone()
        self.check_all()

    @rule(data=st.data())
    def update_maybe_stale(self, data: st.DataObject) -> None:
        ids = data.draw(
            st.lists(st.integers(0, self.next_id + self.capacity), min_size=1, max_size=5), label="ids"
        )
        values = {"reward": torch.full((len(ids),), -1.0)}
        bad = [i for i in ids if not self.first_id <= i < self.next_id]
        try:
            self.buffer.update(ids, values)
        except EmptyBufferError as exc:
            assert not self.spec_known, str(exc)
        except StaleIndexError as exc:
            assert self.spec_known and bad
            when = "has not been written yet" if bad[0] >= self.next_id else "has been overwritten or cleared"
            assert str(exc).startswith(f"indices: item {bad[0]} {when}"), str(exc)
        else:
            assert self.spec_known and not bad
            for id_ in ids:
                self.row_of(id_)["reward"] = torch.tensor(-1.0)
        self.check_all()  # a rejected update wrote nothing

    @rule()
    def clear(self) -> None:
        self.buffer.clear()
        self.items = []
        self.next_id = -(-self.next_id // self.capacity) * self.capacity

    @rule(through_bytes=st.booleans(), seed=st.integers(0, 2**16))
    def state_round_trip(self, through_bytes: bool, seed: int) -> None:
        state = self.buffer.state_dict()
        if through_bytes:
            buf = io.BytesIO()
            torch.save(state, buf)
            buf.seek(0)
            state = torch.load(buf, weights_only=True)
        fresh = ReplayBuffer(self.capacity, storage=self.storage, seed=seed)
        fresh.load_state_dict(state)
        assert (fresh.spec is not None) == (self.buffer.spec is not None)
        if self.items:  # the generator state travels: both draw the same next batch
            a, b = self.buffer.sample(5), fresh.sample(5)
            assert a["index"].tolist() == b["index"].tolist()
            self.check_rows(b, b["index"].tolist())
        self.rb = fresh

    @precondition(lambda self: self.spec_known)
    @rule()
    def mismatched_batch_is_rejected(self) -> None:
        bad = {**make_batch(SPEC, 2), "action": torch.zeros(2, dtype=torch.float64)}
        try:
            self.buffer.extend(bad)
        except SpecError as exc:
            assert str(exc) == "field 'action': expected (*) int64, got (2,) float64"
        else:
            raise AssertionError("a float64 action was accepted")
        self.check_all()

    # -- invariants ------------------------------------------------------------------
    @precondition(lambda self: self.rb is not None)
    @invariant()
    def size_matches(self) -> None:
        assert len(self.buffer) == len(self.items)
        assert self.buffer.is_full == (len(self.items) == self.capacity)
        assert self.buffer.capacity == self.capacity
        assert (self.buffer.spec == SPEC) if self.spec_known else (self.buffer.spec is None)


MODEL_SETTINGS = settings(max_examples=60, stateful_step_count=30, deadline=None)


class MemoryReplayModel(ReplayModel):
    storage = "memory"


class MemmapReplayModel(ReplayModel):
    storage = "memmap"


TestMemoryReplayModel = MemoryReplayModel.TestCase
TestMemoryReplayModel.settings = MODEL_SETTINGS
TestMemmapReplayModel = MemmapReplayModel.TestCase
TestMemmapReplayModel.settings = MODEL_SETTINGS
