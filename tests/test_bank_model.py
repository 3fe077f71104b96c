"""Hypothesis drives a buffer through writes, updates, clears, save/load round trips,
"r+" banks, checkpoints and reopenings, against a dict model of the live items."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import xpbank
from helpers import item_numbers, make_batch, transition_spec
from xpbank import ReplayBuffer

SPEC = transition_spec()
CAPACITY = 5


class BankMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="xpbank-model-"))
        self.path = self.root / "bank"
        self.rb = ReplayBuffer(CAPACITY, SPEC, seed=0)
        self.is_bank = False  # an "r+" bank (writes go to its files)
        # model: id -> (item number, reward); ids are consecutive
        self.items: dict[int, tuple[int, float]] = {}
        self.next_id = 0
        self.next_item = 0

    def teardown(self) -> None:
        del self.rb
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(k=st.integers(1, 7))
    def extend(self, k: int) -> None:
        self.rb.extend(make_batch(SPEC, k, start=self.next_item))
        for j in range(k):
            self.items[self.next_id + j] = (self.next_item + j, float(self.next_item + j))
        self.next_id += k
        self.next_item += k
        for old in [i for i in self.items if i < self.next_id - CAPACITY]:
            del self.items[old]

    @precondition(lambda self: bool(self.items))
    @rule(data=st.data())
    def update(self, data: st.DataObject) -> None:
        ids = data.draw(st.lists(st.sampled_from(sorted(self.items)), min_size=1, max_size=3, unique=True))
        values = torch.tensor([-100.0 - i for i in ids])
        self.rb.update(ids, {"reward": values})
        for i, v in zip(ids, values.tolist(), strict=True):
            self.items[i] = (self.items[i][0], v)

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.items.clear()
        self.next_id = -(-self.next_id // CAPACITY) * CAPACITY

    @precondition(lambda self: not self.is_bank)
    @rule()
    def save_and_load(self) -> None:
        self.rb = xpbank.load(xpbank.save(self.rb, self.path))

    @precondition(lambda self: not self.is_bank)
    @rule()
    def save_and_open_for_writing(self) -> None:
        xpbank.save(self.rb, self.path)
        del self.rb  # a memory buffer saved; the bank takes over
        self.rb = xpbank.open_bank(self.path, "r+")
        self.is_bank = True

    @precondition(lambda self: self.is_bank)
    @rule()
    def checkpoint_and_reopen(self) -> None:
        self.rb.checkpoint()
        del self.rb  # releases the bank's lock
        self.rb = xpbank.open_bank(self.path, "r+")

    @precondition(lambda self: self.is_bank)
    @rule()
    def checkpoint_and_load(self) -> None:
        self.rb.checkpoint()
        del self.rb
        self.rb = xpbank.load(self.path)
        self.is_bank = False

    @invariant()
    def matches_model(self) -> None:
        assert len(self.rb) == len(self.items)
        ring = self.rb.state_dict(data=False)["ring"]
        assert ring["next_id"] == self.next_id
        if not self.items:
            return
        got = self.rb.sample_all()
        assert got["index"].tolist() == sorted(self.items)
        assert item_numbers(got).tolist() == [self.items[i][0] for i in sorted(self.items)]
        assert got["reward"].tolist() == [self.items[i][1] for i in sorted(self.items)]


BankMachine.TestCase.settings = settings(
    max_examples=10, stateful_step_count=12, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
test_bank_model = BankMachine.TestCase
