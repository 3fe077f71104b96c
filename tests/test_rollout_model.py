"""RolloutBuffer driven by hypothesis against tiny list models, both layouts.

``[T, E]``: the model is one Python list of step values per env; a store appends to the
chosen envs' lists, a store into a full env must fail and change nothing, ``clear``
empties the lists. ``segmented``: the model is a list of rows of ``(agent, value)``
filled as metta's agents do (a full row takes the next free row, in the order the
agents filled), and a list of which agents still have room.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from xpbank import CapacityError, RolloutBuffer, StaleIndexError


class TimeMajorModel(RuleBasedStateMachine):
    E, T = 3, 4

    def __init__(self) -> None:
        super().__init__()
        self.rb = RolloutBuffer(self.E, self.T, seed=0)
        self.envs: list[list[float]] = [[] for _ in range(self.E)]
        self.value = 0.0
        self.old_index: torch.Tensor | None = None

    def _batch(self, n: int) -> dict[str, torch.Tensor]:
        values = torch.arange(n, dtype=torch.float32) + self.value
        self.value += n
        return {"x": values, "terminated": torch.zeros(n, dtype=torch.bool)}

    @rule(ids=st.lists(st.integers(0, E - 1), min_size=1, max_size=E, unique=True))
    def store(self, ids: list[int]) -> None:
        batch = self._batch(len(ids))
        full = [e for e in ids if len(self.envs[e]) == self.T]
        if full:
            with pytest.raises(CapacityError, match=f"env {full[0]} already holds horizon=4 steps"):
                self.rb.store(batch, ids)
            return
        self.rb.store(batch, ids)
        for e, v in zip(ids, batch["x"].tolist(), strict=True):
            self.envs[e].append(v)

    @rule()
    def add(self) -> None:
        if any(len(v) == self.T for v in self.envs):
            with pytest.raises(CapacityError, match="already holds horizon=4 steps"):
                self.rb.add(self._batch(self.E))
            return
        self.store(list(range(self.E)))

    @rule()
    def clear(self) -> None:
        if self.rb.ready():
            self.old_index = next(self.rb.minibatches(1))["index"][:2]
        self.rb.clear()
        self.envs = [[] for _ in range(self.E)]

    @rule()
    def stale_update(self) -> None:
        if self.old_index is not None:
            with pytest.raises(StaleIndexError):
                self.rb.update(self.old_index, {"x": torch.zeros(2)})

    @invariant()
    def matches_model(self) -> None:
        assert self.rb.ready() == all(len(v) == self.T for v in self.envs)
        assert len(self.rb) == sum(len(v) for v in self.envs)
        assert self.rb.room().tolist() == [len(v) < self.T for v in self.envs]
        if self.rb.ready():
            x = torch.stack([td["x"] for td in self.rb.steps()])  # [T, E]
            assert x.T.tolist() == self.envs
            seen = torch.cat([mb["index"] for mb in self.rb.minibatches(2)])
            assert len(set(seen.tolist())) == self.E * self.T


class SegmentModel(RuleBasedStateMachine):
    AGENTS, SEGMENTS, H = 2, 5, 2

    def __init__(self) -> None:
        super().__init__()
        self.rb = RolloutBuffer.segmented(self.AGENTS, self.SEGMENTS * self.H, self.H, minibatch_size=self.H)
        self.reset_model()
        self.value = 0.0

    def reset_model(self) -> None:
        self.rows: list[list[float]] = [[] for _ in range(self.SEGMENTS)]
        self.row_of = list(range(self.AGENTS))
        self.next_free = self.AGENTS

    @rule(ids=st.lists(st.integers(0, AGENTS - 1), min_size=1, max_size=AGENTS, unique=True))
    def store(self, ids: list[int]) -> None:
        values = torch.arange(len(ids), dtype=torch.float32) + self.value
        self.value += len(ids)
        if any(self.row_of[a] < 0 for a in ids):
            with pytest.raises(CapacityError, match="its segment is full and all 5 segments are taken"):
                self.rb.store({"x": values}, ids)
            return
        self.rb.store({"x": values}, ids)
        filled = []
        for a, v in zip(ids, values.tolist(), strict=True):
            self.rows[self.row_of[a]].append(v)
            if len(self.rows[self.row_of[a]]) == self.H:
                filled.append(a)
        for a in filled:
            self.row_of[a] = self.next_free if self.next_free < self.SEGMENTS else -1
            self.next_free = min(self.SEGMENTS, self.next_free + 1)

    @rule()
    def clear(self) -> None:
        self.rb.clear()
        self.reset_model()

    @invariant()
    def matches_model(self) -> None:
        assert self.rb.ready() == all(len(r) == self.H for r in self.rows)
        assert len(self.rb) == sum(len(r) for r in self.rows)
        assert self.rb.room().tolist() == [r >= 0 for r in self.row_of]
        if self.rb.ready():
            got = next(self.rb.segment_minibatches(minibatch_segments=self.SEGMENTS))["x"]
            assert got.tolist() == self.rows


TestTimeMajor = TimeMajorModel.TestCase
TestTimeMajor.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
TestSegments = SegmentModel.TestCase
TestSegments.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)
