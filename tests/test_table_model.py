"""Every selector and remover of a Table driven by hypothesis against a brute-force model.

The model is a list of items (value, seq, priority, times sampled), in insertion order.
A write that finds too little room removes, by the remover, from the items stored before
it; a batch of ``B`` is ``B`` successive single samples, each by the selector over the
items with draws left (and, with ``replace=False``, not yet in this batch), an item
leaving after its ``max_times_sampled``-th. Ordered selectors and removers are
predicted exactly; for the random ones (uniform, prioritized) the model replays the
table's draws one by one and checks each was allowed at its turn (and, prioritized, had
a positive priority). Ids are the rule of ``xpbank/table/slots.py``: checked through the
items' values (every write stores fresh values) and ``sample_all``, and stale ids must
be refused.
"""

from __future__ import annotations

import torch
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from xpbank import CapacityError, EmptyBufferError, ReplayBuffer, StaleIndexError, Table
from xpbank.table import REMOVERS, SELECTORS, heap


class Item:
    def __init__(self, value: int, seq: int, priority: float):
        self.value, self.seq, self.priority, self.times = value, seq, priority, 0


def first_by(kind: str, items: list[Item]) -> Item:
    """The item an ordered selector or remover picks."""
    if kind == "fifo":
        return min(items, key=lambda i: i.seq)
    if kind == "lifo":
        return max(items, key=lambda i: i.seq)
    if kind == "min_heap":
        return min(items, key=lambda i: (i.priority, i.seq))
    return min(items, key=lambda i: (-i.priority, i.seq))


def _bind_lazily(table: Table, rb: ReplayBuffer) -> None:
    saved = heap.load
    heap.load = lambda: None  # type: ignore[assignment]
    try:
        Table.bind_buffer(table, rb)
    finally:
        heap.load = saved  # type: ignore[assignment]


class TableModel(RuleBasedStateMachine):
    selector = remover = ""  # set by each subclass below
    lazy_heaps = False  # heapq's heaps (the path without numba) instead of the compiled ones

    @initialize(limit=st.sampled_from([None, 1, 2, 3]), capacity=st.integers(1, 6))
    def build(self, limit: int | None, capacity: int) -> None:
        self.limit, self.capacity = limit, capacity
        self.rb = ReplayBuffer(capacity, sampler=self._table(), seed=0)
        self.items: list[Item] = []
        self.next_value = self.seq = 0
        self.gone_ids: list[int] = []  # ids of items that left

    def _table(self) -> Table:
        table = Table(self.selector, self.remover, max_times_sampled=self.limit)
        if self.lazy_heaps:  # bind_buffer() looks the kernels up once
            table.bind_buffer = lambda rb: _bind_lazily(table, rb)  # type: ignore[method-assign]
        return table

    def _by_value(self, value: int) -> Item:
        return next(i for i in self.items if i.value == value)

    def _ids(self) -> dict[int, int]:
        """value -> id of every live item (through sample_all, which also checks the order)."""
        if not self.items:
            return {}
        batch = self.rb.sample_all()
        values = batch["x"].long().tolist()
        assert values == [i.value for i in sorted(self.items, key=lambda i: i.seq)]
        return dict(zip(values, batch["index"].tolist(), strict=True))

    def _leave(self, item: Item, ids: dict[int, int]) -> None:
        self.items.remove(item)
        self.gone_ids.append(ids[item.value])

    @rule(n=st.integers(1, 8))
    def extend(self, n: int) -> None:
        ids = self._ids()
        before = list(self.items)
        values = list(range(self.next_value, self.next_value + n))
        self.next_value += n
        self.rb.extend({"x": torch.tensor(values, dtype=torch.float32)})
        keep = values[-self.capacity :]
        room = self.capacity - len(before)
        evict = max(0, len(keep) - room)
        if self.remover == "uniform":  # random victims: the table's, checked to be old items
            left = {int(v) for v in self.rb.sample_all()["x"].tolist()} if len(self.rb) else set()
            gone = [i for i in before if i.value not in left]
            assert len(gone) == evict
        else:
            pool, gone = list(before), []
            for _ in range(evict):
                gone.append(first_by(self.remover, pool))
                pool.remove(gone[-1])
        for item in gone:
            self._leave(item, ids)
        for v in keep:
            self.items.append(Item(v, self.seq, 1.0))
            self.seq += 1

    @rule(b=st.integers(1, 8), replace=st.booleans())
    def sample(self, b: int, replace: bool) -> None:
        if self.selector == "prioritized" and not replace:
            return
        ids = self._ids()
        allowed = {i.value: b if self.limit is None else self.limit - i.times for i in self.items}
        if self.selector == "prioritized":
            allowed = {v: (n if self._by_value(v).priority > 0 else 0) for v, n in allowed.items()}
        if not replace:
            allowed = {v: min(n, 1) for v, n in allowed.items()}
        if sum(allowed.values()) < b:
            try:
                self.rb.sample(b, replace=replace)
            except (EmptyBufferError, CapacityError):
                assert self._ids() == ids  # nothing changed
                return
            raise AssertionError(f"sample({b}) should have been refused")
        got = [int(v) for v in self.rb.sample(b, replace=replace)["x"].tolist()]
        used: dict[int, int] = {}
        for v in got:
            if self.selector in ("uniform", "prioritized"):
                item = self._by_value(v)
            else:
                pool = [i for i in self.items if allowed[i.value] - used.get(i.value, 0) > 0]
                item = first_by(self.selector, pool)
                assert v == item.value, (got, self.selector)
            assert allowed[v] - used.get(v, 0) > 0, f"{v} drawn more often than allowed in {got}"
            used[v] = used.get(v, 0) + 1
            item.times += 1
            if self.limit is not None and item.times == self.limit:
                self._leave(item, ids)

    @rule(data=st.data())
    def update_priority(self, data: st.DataObject) -> None:
        ids = self._ids()
        if not self.items:
            return
        chosen = data.draw(st.lists(st.sampled_from(self.items), min_size=1, max_size=4))
        values = data.draw(
            st.lists(st.sampled_from([0.0, 1.0, 2.0]), min_size=len(chosen), max_size=len(chosen))
        )
        self.rb.update_priority([ids[i.value] for i in chosen], values)
        for item, p in zip(chosen, values, strict=True):
            item.priority = p

    @rule()
    def stale_ids_are_refused(self) -> None:
        for old in self.gone_ids[-3:]:
            try:
                self.rb.update_priority([old], [1.0])
            except StaleIndexError:
                continue
            raise AssertionError(f"id {old} of an item that left was accepted")

    @rule()
    def clear(self) -> None:
        ids = self._ids()
        for item in list(self.items):
            self._leave(item, ids)
        self.rb.clear()

    @rule()
    def state_round_trip(self) -> None:
        state = self.rb.state_dict()
        rb = ReplayBuffer(self.capacity, sampler=self._table(), seed=1)
        rb.load_state_dict(state)
        if self.selector in ("uniform", "prioritized") and self.items:  # the same draws
            twin = ReplayBuffer(self.capacity, sampler=self._table(), seed=2)
            twin.load_state_dict(state)
            b = min(2, len(self.items))
            try:
                a = rb.sample(b)["index"].tolist()
            except EmptyBufferError:
                a = None
            try:
                c = twin.sample(b)["index"].tolist()
            except EmptyBufferError:
                c = None
            assert a == c
            rb = ReplayBuffer(self.capacity, sampler=self._table(), seed=1)
            rb.load_state_dict(state)
        self.rb = rb

    @invariant()
    def sizes(self) -> None:
        if hasattr(self, "rb"):
            assert len(self.rb) == len(self.items)


SETTINGS = settings(
    max_examples=20,
    stateful_step_count=20,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
for _selector in SELECTORS:  # one machine per selector and remover: each gets its examples
    for _remover in REMOVERS:
        _machine = type(
            f"Model_{_selector}_{_remover}", (TableModel,), {"selector": _selector, "remover": _remover}
        )
        _machine.TestCase.settings = SETTINGS
        globals()[f"Test_{_selector}_{_remover}"] = _machine.TestCase
        if "heap" in _selector + _remover and heap.load() is not None:  # and heapq's heaps
            _lazy = type(f"Lazy_{_selector}_{_remover}", (_machine,), {"lazy_heaps": True})
            _lazy.TestCase.settings = SETTINGS
            globals()[f"TestLazy_{_selector}_{_remover}"] = _lazy.TestCase
