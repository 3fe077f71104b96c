"""xpbank.compat.rose against ROSE's document and a brute-force deque reference."""

from __future__ import annotations

import pickle
import re
import sys
import types
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import xpbank
from xpbank.compat.rose import Experience, ExperienceBank, create_experience


def _exp(i: int, info: Any = None) -> Experience:
    return create_experience([float(i), -1.0], i % 3, float(i) / 2, [float(i + 1), -1.0], i % 4 == 3, info)


def _same(a: Experience, b: Experience) -> bool:
    return (
        torch.equal(
            torch.as_tensor(a.state, dtype=torch.float32), torch.as_tensor(b.state, dtype=torch.float32)
        )
        and int(a.action) == int(b.action)
        and float(a.reward) == float(b.reward)
        and torch.equal(
            torch.as_tensor(a.next_state, dtype=torch.float32),
            torch.as_tensor(b.next_state, dtype=torch.float32),
        )
        and bool(a.done) == bool(b.done)
        and a.info == b.info
    )


def _check(bank: ExperienceBank, ref: list[Experience]) -> None:
    assert len(bank) == len(ref)
    got = list(bank)
    assert all(_same(g, r) for g, r in zip(got, ref, strict=True))


# -- the document's examples, as written there (imports aside) --------------------------
def test_document_examples_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state, action, reward, next_state, done = [0.0, 1.0], 1, 0.5, [1.0, 2.0], False
    experience1, experience2, experience3 = _exp(1), _exp(2), _exp(3)
    bank1, bank2 = ExperienceBank(), ExperienceBank(max_size=2)
    bank2.add_batch([_exp(7), _exp(8)])

    experience = create_experience(state, action, reward, next_state, done, info={"step": 42})
    bank = ExperienceBank(max_size=10000)
    bank.add(experience)
    bank.add_batch([experience1, experience2, experience3])
    batch = bank.sample(batch_size=32, replace=True)
    bank = ExperienceBank(session_id="rose_session")
    bank.add_batch([experience, experience1])
    filepath = bank.save()  # Output: experience_bank_{date}_{session_id}.pkl
    filepath = bank.save(work_dir="./data", bank_file="experiences.pkl")
    loaded_bank = ExperienceBank.load("./data/experiences.pkl")
    bank1.add_batch([experience1, experience2])
    merged_bank = bank1.merge(bank2)
    bank1.merge_inplace(bank2)
    bank_files = ExperienceBank.list_saved_banks("./data")

    assert len(batch) == 32 and all(isinstance(e, Experience) for e in batch)
    assert {e.info["step"] for e in batch if e.info} == {42}
    assert filepath == "data/experiences.pkl"
    assert re.fullmatch(
        r"experience_bank_\d{8}_rose_session",
        next(p.name for p in tmp_path.iterdir() if p.is_dir() and p.name != "data"),
    )
    assert loaded_bank.session_id == "rose_session" and len(loaded_bank) == 2
    _check(loaded_bank, [experience, experience1])
    _check(merged_bank, [experience1, experience2, _exp(7), _exp(8)])
    _check(bank1, [experience1, experience2, _exp(7), _exp(8)])
    assert bank_files == ["data/experiences.pkl"]


# -- saving ---------------------------------------------------------------------------
def test_round_trip_keeps_data_infos_max_size_and_session(tmp_path):
    bank = ExperienceBank(max_size=5, session_id="s1")
    ref = deque(maxlen=5)
    for i in range(8):
        e = _exp(i, {"i": i, "tags": ["a", None], "x": 1.5} if i % 2 else None)
        bank.add(e)
        ref.append(e)
    path = bank.save(tmp_path)
    assert re.fullmatch(r"experience_bank_\d{8}_s1", path.rsplit("/", 1)[-1])
    back = ExperienceBank.load(path)
    assert (back.max_size, back.session_id) == (5, "s1")
    _check(back, list(ref))
    back.add(_exp(100))  # still bounded: the oldest goes
    ref.append(_exp(100))
    _check(back, list(ref))
    assert bank.save(tmp_path) == path  # the same name again: replaced in place
    assert ExperienceBank.list_saved_banks(tmp_path) == [path]


def test_unbounded_round_trip_then_grows(tmp_path):
    bank = ExperienceBank()
    bank.add_batch([_exp(i) for i in range(30)])
    back = ExperienceBank.load(bank.save(tmp_path, "b"))
    assert back.max_size is None
    back.add_batch([_exp(i) for i in range(30, 2100)])  # past the first buffer's capacity
    _check(back, [_exp(i) for i in range(2100)])


def test_load_with_max_size_rebounds_keeping_the_newest(tmp_path):
    bank = ExperienceBank()
    bank.add_batch([_exp(i) for i in range(10)])
    back = ExperienceBank.load(bank.save(tmp_path, "b"), max_size=4)
    assert back.max_size == 4
    _check(back, [_exp(i) for i in range(6, 10)])


def test_load_refuses_a_bank_not_saved_by_rose(tmp_path):
    rb = xpbank.ReplayBuffer(4)
    rb.extend({"x": torch.zeros(2)})
    path = xpbank.save(rb, tmp_path / "plain")
    with pytest.raises(xpbank.BankError, match=r"not a bank saved by xpbank\.compat\.rose"):
        ExperienceBank.load(path)


# -- refusing bad input at add, leaving the bank unchanged -----------------------------
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            create_experience([0.0, 1.0], 0, 0.0, [0.0, 1.0], False, {"obj": object()}),
            r"experience 1: info: .* must be JSON-able",
        ),
        (
            create_experience([0.0, 1.0], 0, 0.0, [0.0, 1.0], False, {"t": (1, 2)}),
            r"info: .* does not survive JSON",
        ),
        (
            create_experience([0.0, 1.0], 0, 0.0, [0.0, 1.0], False, ["not", "a dict"]),
            r"info: \['not', 'a dict'\] expected a dict, got list",
        ),
        (
            create_experience("text", 0, 0.0, [0.0, 1.0], False),
            r"experience 1: state: expected a number, a list or an array",
        ),
        (
            create_experience([0.0, 1.0], 0, [1.0, 2.0], [0.0, 1.0], False),
            r"reward: expected one real number",
        ),
        (create_experience([0.0, 1.0], 0, 0.0, [0.0, 1.0], 2), r"done: expected a bool \(or 0/1\), got 2"),
        ((1, 2, 3), r"experience 1: expected an Experience, got tuple"),
    ],
)
def test_bad_experience_refused_at_add_batch_and_nothing_stored(bad, match):
    bank = ExperienceBank(max_size=4)
    bank.add(_exp(0))
    with pytest.raises(xpbank.SpecError, match=match):
        bank.add_batch([_exp(1), bad, _exp(2)])
    _check(bank, [_exp(0)])


def test_shape_change_refused_naming_the_field():
    bank = ExperienceBank()
    bank.add(_exp(0))
    with pytest.raises(xpbank.SpecError, match="state"):
        bank.add(create_experience([0.0, 1.0, 2.0], 0, 0.0, [0.0, 1.0], False))
    with pytest.raises(xpbank.SpecError, match=r"state: experiences in one batch differ in shape"):
        bank.add_batch([_exp(1), create_experience([0.0], 0, 0.0, [0.0, 1.0], False)])
    _check(bank, [_exp(0)])


def test_states_of_numbers_lists_and_arrays_become_tensors():
    bank = ExperienceBank()
    bank.add(
        create_experience(
            np.array([1, 2], dtype=np.int32), 3, 1, np.array([2, 3], dtype=np.int32), np.bool_(True)
        )
    )
    e = bank[0]
    assert e.state.dtype == torch.int32 and e.state.tolist() == [1, 2]
    assert (e.action.item(), e.reward, e.done) == (3, 1.0, True)


def test_sample_without_replacement_is_distinct_and_bounded():
    bank = ExperienceBank()
    bank.add_batch([_exp(i) for i in range(6)])
    got = sorted(int(e.action * 0 + e.state[0]) for e in bank.sample(6, replace=False))
    assert got == list(range(6))
    with pytest.raises(xpbank.CapacityError, match="7 distinct items asked for"):
        bank.sample(7, replace=False)
    with pytest.raises(xpbank.EmptyBufferError, match="empty"):
        ExperienceBank().sample(1)


def test_sample_is_uniform_within_tolerance():
    bank = ExperienceBank(max_size=5)
    bank.add_batch([_exp(i) for i in range(8)])  # wrapped: items 3..7
    counts = np.zeros(8)
    for e in bank.sample(20_000):
        counts[int(e.state[0])] += 1
    assert counts[:3].sum() == 0
    # each of 5 items: p = 0.2, sd of a count = sqrt(20000 * 0.16) ~ 57; allow 5 sd
    assert np.all(np.abs(counts[3:] - 4000) < 5 * 57)


# -- legacy pickles ---------------------------------------------------------------------
@dataclass
class _RoseExperience:  # ROSE's dataclass, pickled under its module path below
    state: Any
    action: Any
    reward: float
    next_state: Any
    done: bool
    info: dict = None  # type: ignore[assignment]


def _legacy_pickle(path, payload_of) -> list[Experience]:
    """Write a pickle as ROSE's save does (assumed shape: a list of
    ``rose.rl.experience.Experience``, or a dict holding one under ``"experiences"``)."""
    module = types.ModuleType("rose.rl.experience")
    _RoseExperience.__module__, _RoseExperience.__qualname__ = "rose.rl.experience", "Experience"
    module.Experience = _RoseExperience  # type: ignore[attr-defined]
    saved = {name: sys.modules.get(name) for name in ("rose", "rose.rl", "rose.rl.experience")}
    sys.modules.update(
        {
            "rose": types.ModuleType("rose"),
            "rose.rl": types.ModuleType("rose.rl"),
            "rose.rl.experience": module,
        }
    )
    try:
        items = [
            _RoseExperience(np.array([i, 0.5]), i, float(i), np.array([i + 1, 0.5]), i == 2, {"i": i})
            for i in range(3)
        ]
        path.write_bytes(pickle.dumps(payload_of(items)))
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return [Experience(e.state, e.action, e.reward, e.next_state, e.done, e.info) for e in items]


@pytest.mark.parametrize("shape", ["list", "dict"])
def test_legacy_pickle_needs_allow_pickle_and_warns(tmp_path, shape):
    path = tmp_path / "experience_bank_legacy.pkl"
    payload = (lambda xs: xs) if shape == "list" else (lambda xs: {"experiences": xs, "session_id": "old"})
    expected = _legacy_pickle(path, payload)
    with pytest.raises(xpbank.BankError, match=r"legacy ROSE pickle\? Unpickling can run arbitrary code"):
        ExperienceBank.load(path)
    with pytest.warns(UserWarning, match="only do this for files you trust"):
        bank = ExperienceBank.load(path, allow_pickle=True)
    _check(bank, expected)
    assert bank.session_id == "old" if shape == "dict" else bank.session_id != "old"
    back = ExperienceBank.load(bank.save(tmp_path, "converted"))  # converted: no pickle now
    _check(back, expected)


# -- merging ----------------------------------------------------------------------------
@pytest.mark.parametrize(("a_max", "b_max"), [(None, 3), (3, None), (None, None), (3, 4)])
def test_merge_keeps_everything(a_max, b_max):
    a, b = ExperienceBank(max_size=a_max), ExperienceBank(max_size=b_max)
    a.add_batch([_exp(i) for i in range(3)])
    b.add_batch([_exp(i) for i in range(10, 13)])
    merged = a.merge(b)
    assert merged.max_size == (None if a_max is None or b_max is None else a_max + b_max)
    _check(merged, [_exp(i) for i in (0, 1, 2, 10, 11, 12)])
    assert merged.session_id not in (a.session_id, b.session_id)


def test_merge_inplace_into_bounded_drops_oldest_like_adding_one_by_one():
    a, b = ExperienceBank(max_size=4), ExperienceBank()
    a.add_batch([_exp(i) for i in range(3)])
    b.add_batch([_exp(i, {"b": i}) for i in range(10, 13)])
    ref = deque([_exp(i) for i in range(3)], maxlen=4)
    ref.extend(_exp(i, {"b": i}) for i in range(10, 13))
    a.merge_inplace(b)
    _check(a, list(ref))


def test_merge_of_different_layouts_raises_and_changes_nothing():
    a, b = ExperienceBank(), ExperienceBank()
    a.add(_exp(0))
    b.add(create_experience([1.0, 2.0, 3.0], 0, 0.0, [1.0, 2.0, 3.0], False))
    with pytest.raises(xpbank.SpecError, match="state"):
        a.merge_inplace(b)
    _check(a, [_exp(0)])
    with pytest.raises(xpbank.SpecError, match="expected an ExperienceBank, got list"):
        a.merge([])


def test_getitem_slices_and_recent():
    bank = ExperienceBank(max_size=4)
    bank.add_batch([_exp(i) for i in range(6)])
    ref = [_exp(i) for i in range(2, 6)]
    assert _same(bank[0], ref[0]) and _same(bank[-1], ref[-1])
    assert all(_same(x, y) for x, y in zip(bank[1:3], ref[1:3], strict=True))
    assert all(_same(x, y) for x, y in zip(bank.get_recent(2), ref[-2:], strict=True))
    assert len(bank.get_recent(10)) == 4
    with pytest.raises(IndexError, match="index 4 out of range for a bank of 4"):
        bank[4]


# -- a state machine against a deque ------------------------------------------------------
class RoseMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.max_size: int | None = None
        self.bank = ExperienceBank(max_size=None)
        self.ref: deque[Experience] = deque()
        self.other = ExperienceBank()
        self.counter = 0

    @rule(max_size=st.one_of(st.none(), st.integers(1, 6)))
    def rebuild(self, max_size):
        self.bank, self.ref, self.max_size = (
            ExperienceBank(max_size=max_size),
            deque(maxlen=max_size),
            max_size,
        )

    @rule(n=st.integers(0, 8), with_info=st.booleans())
    def add_batch(self, n, with_info):
        items = [_exp(self.counter + i, {"k": self.counter + i} if with_info else None) for i in range(n)]
        self.counter += n
        self.bank.add_batch(items)
        self.ref.extend(items)

    @rule()
    def clear(self):
        self.bank.clear()
        self.ref.clear()

    @rule(n=st.integers(0, 5))
    def merge_inplace(self, n):
        other = ExperienceBank()
        items = [_exp(1000 + i) for i in range(n)]
        other.add_batch(items)
        self.bank.merge_inplace(other)
        self.ref.extend(items)

    @precondition(lambda self: len(self.ref) > 0)
    @rule(k=st.integers(1, 10))
    def recent(self, k):
        got = self.bank.get_recent(k)
        assert all(_same(x, y) for x, y in zip(got, list(self.ref)[-k:], strict=True))

    @invariant()
    def same_as_reference(self):
        _check(self.bank, list(self.ref))


TestRoseMachine = RoseMachine.TestCase
TestRoseMachine.settings = settings(max_examples=25, stateful_step_count=12, deadline=None)


def test_unbounded_bank_takes_a_first_batch_larger_than_its_first_buffer():
    bank = ExperienceBank()
    items = [_exp(i, {"i": i}) for i in range(3000)]
    bank.add_batch(items)
    _check(bank, items)
