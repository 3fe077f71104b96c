"""Banks: save/load round trips, open_bank r/r+, checkpoint, session ids, list, merge."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import xpbank
from helpers import item_numbers, make_batch, transition_spec
from xpbank import (
    BankError,
    MemmapStorage,
    ReadOnlyError,
    ReplayBuffer,
    Spec,
    SpecError,
    StaleIndexError,
    TensorStorage,
)
from xpbank.bank import bank_of
from xpbank.sampler import SAMPLERS, make_sampler, register_sampler, sampler_config

STORAGES = ["packed", "unpacked", "memmap"]


def _buffer(kind: str, capacity: int, spec: Spec, tmp_path: Path, seed: int = 0) -> ReplayBuffer:
    storage = {
        "packed": lambda: TensorStorage(capacity, spec),
        "unpacked": lambda: TensorStorage(capacity, spec, pack=False),
        "memmap": lambda: MemmapStorage(capacity, tmp_path / f"mm-{kind}", spec),
    }[kind]()
    return ReplayBuffer(capacity, spec, storage=storage, seed=seed)


def _all(rb: ReplayBuffer) -> dict[object, torch.Tensor]:
    """Every stored item, oldest first, with ids (the brute-force view of a buffer)."""
    td = rb.sample_all()
    return {k: td[k] for k in [*rb.spec, "index"]}  # type: ignore[union-attr]


def _assert_same_buffer(a: ReplayBuffer, b: ReplayBuffer) -> None:
    assert (len(a), a.capacity, a.spec) == (len(b), b.capacity, b.spec)
    ra, rb_ = _all(a), _all(b)
    for key in ra:
        assert ra[key].dtype == rb_[key].dtype
        assert torch.equal(
            ra[key].view(torch.uint8) if ra[key].dtype == torch.bfloat16 else ra[key],
            rb_[key].view(torch.uint8) if rb_[key].dtype == torch.bfloat16 else rb_[key],
        ), key
    assert a.state_dict(data=False)["ring"] == b.state_dict(data=False)["ring"]


@pytest.mark.parametrize("kind", STORAGES)
@pytest.mark.parametrize("n", [0, 5, 13, 23])  # empty, partial, wrapped, wrapped twice
def test_round_trip_is_bit_for_bit(kind: str, n: int, rich_spec: Spec, tmp_path: Path) -> None:
    rb = _buffer(kind, 10, rich_spec, tmp_path, seed=7)
    if n:
        rb.extend(make_batch(rich_spec, n))
    path = xpbank.save(rb, tmp_path / "bank")
    back = xpbank.load(path)
    assert isinstance(back.storage, TensorStorage)
    if n:
        _assert_same_buffer(rb, back)
        # same RNG, same sampler: the same draws from here on
        for _ in range(3):
            assert torch.equal(rb.sample(6)["index"], back.sample(6)["index"])
    assert len(back) == min(n, 10)
    opened = xpbank.open_bank(path)
    assert isinstance(opened.storage, MemmapStorage)
    if n:
        _assert_same_buffer(rb, opened)


def test_ids_sampled_before_save_update_the_right_items_after_load(tmp_path: Path) -> None:
    spec = transition_spec()
    rb = ReplayBuffer(8, spec, seed=1)
    rb.extend(make_batch(spec, 13))  # wrapped: cursor 5, live ids 5..12
    sampled = rb.sample(5)["index"]
    back = xpbank.load(xpbank.save(rb, tmp_path / "b"))
    back.update(sampled, {"reward": -sampled.to(torch.float32)})
    rb.update(sampled, {"reward": -sampled.to(torch.float32)})
    _assert_same_buffer(rb, back)
    # brute force: item i (id i) has reward -i if it was sampled, else i
    ref = {i: (-i if i in sampled.tolist() else i) for i in range(5, 13)}
    got = back.sample_all()
    assert dict(zip(got["index"].tolist(), got["reward"].tolist(), strict=True)) == ref
    back.extend(make_batch(spec, 1, start=13))  # overwrites id 5's slot
    with pytest.raises(StaleIndexError, match="item 5 has been overwritten"):
        back.update([5], {"reward": torch.zeros(1)})


def test_load_to_another_device_name_and_pathlike(tmp_path: Path) -> None:
    rb = ReplayBuffer(4, seed=0)
    rb.extend({"x": torch.arange(3.0)})
    xpbank.save(rb, str(tmp_path / "s"))  # str
    back = xpbank.load(os.fspath(tmp_path / "s"), device=torch.device("cpu"))
    assert back.sample_all()["x"].tolist() == [0, 1, 2]
    with pytest.raises(xpbank.DeviceError, match="CUDA is not available"):
        if torch.cuda.is_available():
            raise xpbank.DeviceError("CUDA is not available (skip)")
        xpbank.load(tmp_path / "s", device="cuda")


@pytest.mark.cuda
def test_cuda_buffer_saves_and_loads_to_cuda(rich_spec: Spec, tmp_path: Path) -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    rb = ReplayBuffer(10, rich_spec, storing_device="cuda", seed=2)
    rb.extend(make_batch(rich_spec, 13))
    back = xpbank.load(xpbank.save(rb, tmp_path / "c"), device="cuda")
    assert back.storage.device.type == "cuda"
    _assert_same_buffer(rb, back)


def test_empty_lazy_buffer_round_trips(tmp_path: Path) -> None:
    rb = ReplayBuffer(5, seed=0)
    back = xpbank.load(xpbank.save(rb, tmp_path / "e"))
    assert back.spec is None and len(back) == 0
    back.extend({"x": torch.ones(2)})
    assert len(back) == 2


def test_save_replaces_a_bank_and_refuses_other_directories(tmp_path: Path) -> None:
    rb = ReplayBuffer(4, seed=0)
    rb.extend({"x": torch.arange(2.0)})
    xpbank.save(rb, tmp_path / "b")
    rb.extend({"x": torch.arange(5.0, 8.0)})
    xpbank.save(rb, tmp_path / "b")
    assert xpbank.load(tmp_path / "b").sample_all()["x"].tolist() == [1.0, 5.0, 6.0, 7.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b"]  # no temporaries left
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(BankError, match="non-empty directory that is not a bank"):
        xpbank.save(rb, tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(BankError, match="exists and is not a directory"):
        xpbank.save(rb, tmp_path / "file")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_data_files_are_plain_npy_in_slot_order(tmp_path: Path) -> None:
    spec = transition_spec()
    rb = ReplayBuffer(6, spec, seed=0)
    rb.extend(make_batch(spec, 8))  # slots 0,1 hold items 6,7; slots 2..5 items 2..5
    path = xpbank.save(rb, tmp_path / "b")
    action = np.load(path / "data" / "action.npy", allow_pickle=False)
    assert action.tolist() == [6, 7, 2, 3, 4, 5]
    nxt = np.load(path / "data" / "next" / "obs.npy", allow_pickle=False)
    assert nxt[:, 0].tolist() == [7, 8, 3, 4, 5, 6]
    manifest = json.loads((path / "manifest.json").read_text())
    assert (manifest["size"], manifest["next_id"], manifest["cursor"], manifest["capacity"]) == (6, 8, 2, 6)


def test_partial_bank_tail_is_sparse_zeros(tmp_path: Path) -> None:
    rb = ReplayBuffer(1000, seed=0)
    rb.extend({"x": torch.ones(3, 4)})
    path = xpbank.save(rb, tmp_path / "b")
    x = np.load(path / "data" / "x.npy", allow_pickle=False)
    assert x.shape == (1000, 4) and x[:3].sum() == 12 and not x[3:].any()


# -- session ids ------------------------------------------------------------------------
def test_session_ids_given_generated_and_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rb = ReplayBuffer(4, seed=0)
    rb.extend({"x": torch.zeros(1)})
    monkeypatch.chdir(tmp_path)
    path = xpbank.save(rb)  # default name from a new session id
    sid = path.name.removeprefix("bank_")
    assert re.fullmatch(r"\d{8}_\d{6}_[0-9a-f]{8}", sid)
    assert bank_of(xpbank.load(path))[2] == sid  # type: ignore[index]
    again = xpbank.save(xpbank.load(path), tmp_path / "copy")  # a loaded buffer keeps its session
    assert json.loads((again / "manifest.json").read_text())["session_id"] == sid
    named = xpbank.save(rb, tmp_path / "n", session_id="run-7")
    assert json.loads((named / "manifest.json").read_text())["session_id"] == "run-7"
    with pytest.raises(BankError, match="session_id: expected a non-empty string without '/'"):
        xpbank.save(rb, tmp_path / "z", session_id="a/b")


# -- open_bank ---------------------------------------------------------------------------
def test_open_r_refuses_writes_and_checkpoint(tmp_path: Path) -> None:
    spec = transition_spec()
    rb = ReplayBuffer(8, spec, seed=0)
    rb.extend(make_batch(spec, 5))
    path = xpbank.save(rb, tmp_path / "b")
    before = (path / "data" / "action.npy").read_bytes()
    ro = xpbank.open_bank(path, "r")
    with pytest.raises(ReadOnlyError, match=r"opened with mode='r' \(read-only\)"):
        ro.extend(make_batch(spec, 1, start=5))
    with pytest.raises(ReadOnlyError, match="mode='r'"):
        ro.update([1], {"reward": torch.zeros(1)})
    with pytest.raises(ReadOnlyError, match=r"checkpoint: the bank .* was opened with mode='r'"):
        ro.checkpoint()
    assert len(ro) == 5 and (path / "data" / "action.npy").read_bytes() == before
    assert item_numbers(ro.sample_all()).tolist() == [0, 1, 2, 3, 4]
    with pytest.raises(BankError, match="mode must be 'r' or 'r\\+', got 'w'"):
        xpbank.open_bank(path, "w")


def test_open_r_plus_appends_in_place_and_checkpoint_commits(tmp_path: Path) -> None:
    spec = transition_spec()
    rb = ReplayBuffer(8, spec, seed=3)
    rb.extend(make_batch(spec, 5))
    path = xpbank.save(rb, tmp_path / "b")
    bank = xpbank.open_bank(path, "r+")
    with pytest.raises(BankError, match="already open with mode='r\\+'"):
        xpbank.open_bank(path, "r+")
    bank.extend(make_batch(spec, 6, start=5))  # wraps: live 3..10
    rb.extend(make_batch(spec, 6, start=5))
    bank.update([4], {"reward": torch.tensor([40.0])})
    rb.update([4], {"reward": torch.tensor([40.0])})
    bank.sample(3)
    rb.sample(3)
    bank.checkpoint()
    manifest = json.loads((path / "manifest.json").read_text())
    assert all(entry["checksum"] is None for entry in manifest["data"])
    assert [p.name for p in (path / "state").iterdir()] == ["g1_0.npy"]
    del bank
    loaded, opened = xpbank.load(path), xpbank.open_bank(path, "r")
    _assert_same_buffer(rb, loaded)
    _assert_same_buffer(rb, opened)
    expected = rb.sample(4)["index"]  # the same RNG state in all three
    assert torch.equal(loaded.sample(4)["index"], expected)
    assert torch.equal(opened.sample(4)["index"], expected)


def test_checkpoint_needs_an_open_bank(tmp_path: Path) -> None:
    rb = ReplayBuffer(4)
    with pytest.raises(BankError, match="not an open bank"):
        rb.checkpoint()
    rb.extend({"x": torch.zeros(1)})
    with pytest.raises(BankError, match="not an open bank"):
        xpbank.load(xpbank.save(rb, tmp_path / "b")).checkpoint()
    opened = xpbank.open_bank(tmp_path / "b", "r+")
    with pytest.raises(BankError, match=r"is the bank this buffer is open on; call buffer\.checkpoint"):
        xpbank.save(opened, tmp_path / "b")
    with pytest.raises(BankError, match=r"b is open with mode='r\+' by a buffer; checkpoint and close it"):
        xpbank.save(rb, tmp_path / "b")  # another buffer over the open bank
    assert len(opened) == 1
    os.rename(tmp_path / "b", tmp_path / "moved")
    with pytest.raises(BankError, match="is no longer the bank this buffer opened"):
        opened.checkpoint()


def test_crash_between_checkpoints_keeps_the_checkpoint_ring(tmp_path: Path) -> None:
    """Simulated crash: the process 'dies' (its buffer is dropped, no checkpoint) after
    writing past the last checkpoint. Brute-force reference: per slot, what was last
    written there."""
    spec = transition_spec()
    rb = ReplayBuffer(6, spec, seed=0)
    rb.extend(make_batch(spec, 4))  # items 0..3 in slots 0..3
    path = xpbank.save(rb, tmp_path / "b")
    bank = xpbank.open_bank(path, "r+")
    bank.extend(make_batch(spec, 1, start=4))
    bank.checkpoint()  # committed: items 0..4, next_id 5
    slots = {i % 6: i for i in range(5)}
    bank.extend(make_batch(spec, 3, start=5))  # item 5 -> empty slot 5; 6, 7 -> slots 0, 1 (wrap)
    for i in range(5, 8):
        slots[i % 6] = i
    bank.storage.flush()  # the pages reach the files (as the OS would after a kill)
    del bank  # crash: no checkpoint
    back = xpbank.open_bank(path, "r")
    assert (len(back), back.state_dict(data=False)["ring"]["next_id"]) == (5, 5)  # item 5 not counted
    got = back.sample_all()
    assert got["index"].tolist() == [0, 1, 2, 3, 4]  # the checkpoint's ids ...
    # ... but the slots of ids 0 and 1 hold the rows written after it (documented loss)
    assert item_numbers(got).tolist() == [slots[s] for s in range(5)] == [6, 7, 2, 3, 4]


def test_lazy_r_plus_bank_creates_its_files_at_first_write(tmp_path: Path) -> None:
    path = xpbank.save(ReplayBuffer(4, seed=0), tmp_path / "lazy")
    bank = xpbank.open_bank(path, "r+")
    bank.extend({"x": torch.arange(3.0)})
    bank.checkpoint()
    del bank
    assert xpbank.load(path).sample_all()["x"].tolist() == [0.0, 1.0, 2.0]


# -- list_banks --------------------------------------------------------------------------
def test_list_banks_newest_first_skips_non_banks_reports_corrupt(tmp_path: Path) -> None:
    rb = ReplayBuffer(4, seed=0)
    rb.extend({"x": torch.zeros(2)})
    xpbank.save(rb, tmp_path / "old", session_id="s-old")
    xpbank.save(rb, tmp_path / "new", session_id="s-new")
    (tmp_path / "plain_dir").mkdir()
    (tmp_path / "file.txt").write_text("x")
    (tmp_path / ".b.tmp-1-abc").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "manifest.json").write_text("{not json")
    banks = xpbank.list_banks(tmp_path)
    assert [b.path.name for b in banks] == ["new", "old", "broken"]
    assert [b.session_id for b in banks[:2]] == ["s-new", "s-old"]
    assert (banks[0].size, banks[0].capacity, banks[0].spec) == (2, 4, "{'x': (*) float32}")
    assert banks[0].created <= banks[0].updated and banks[0].error is None
    assert banks[2].error is not None and "is not valid JSON" in banks[2].error
    with pytest.raises(BankError, match="is not a directory"):
        xpbank.list_banks(tmp_path / "file.txt")


# -- merge ------------------------------------------------------------------------------
def test_merge_oldest_first_and_capacity_drops_oldest(tmp_path: Path) -> None:
    spec = transition_spec()
    a, b = ReplayBuffer(4, spec, seed=0), ReplayBuffer(5, spec, seed=0)
    a.extend(make_batch(spec, 6))  # live 2..5
    b.extend(make_batch(spec, 3, start=100))
    merged = xpbank.merge(a, b)
    assert merged.capacity == 9
    assert item_numbers(merged.sample_all()).tolist() == [2, 3, 4, 5, 100, 101, 102]
    assert merged.sample_all()["index"].tolist() == list(range(7))
    small = xpbank.merge(a, xpbank.save(b, tmp_path / "b"), capacity=5)  # bank path
    assert item_numbers(small.sample_all()).tolist() == [4, 5, 100, 101, 102]
    tiny = xpbank.merge(tmp_path / "b", a, capacity=2)
    assert item_numbers(tiny.sample_all()).tolist() == [4, 5]


def test_merge_in_place_appends(tmp_path: Path) -> None:
    spec = transition_spec()
    a, b = ReplayBuffer(6, spec, seed=0), ReplayBuffer(6, spec, seed=0)
    a.extend(make_batch(spec, 4))
    b.extend(make_batch(spec, 3, start=50))
    assert a.merge_(b) is a
    assert item_numbers(a.sample_all()).tolist() == [1, 2, 3, 50, 51, 52]
    assert a.sample_all()["index"].tolist() == list(range(1, 7))
    bank = xpbank.open_bank(xpbank.save(b, tmp_path / "b"), "r+")
    bank.merge_(str(tmp_path / "b"))
    assert item_numbers(bank.sample_all()).tolist() == [50, 51, 52, 50, 51, 52]


def test_merge_refuses_different_specs_naming_fields() -> None:
    a = ReplayBuffer(4)
    a.extend({"obs": torch.zeros(1, 3), "r": torch.zeros(1)})
    b = ReplayBuffer(4)
    b.extend({"obs": torch.zeros(1, 4), "r": torch.zeros(1)})
    with pytest.raises(SpecError, match=r"field 'obs' is \(\*, 3\) float32 in a but \(\*, 4\) float32 in b"):
        xpbank.merge(a, b)
    c = ReplayBuffer(4)
    c.extend({"obs": torch.zeros(1, 3), "done": torch.zeros(1, dtype=torch.bool)})
    with pytest.raises(SpecError, match=r"field 'r' only in this buffer, field 'done' only in other"):
        a.merge_(c)
    assert len(a) == 1
    with pytest.raises(BankError, match="b must be a ReplayBuffer or a bank path, got int"):
        xpbank.merge(a, 3)


# -- sampler registry --------------------------------------------------------------------
def test_registry_rebuilds_registered_samplers_only() -> None:
    @register_sampler("test-custom")
    class Custom(xpbank.UniformSampler):
        def __init__(self, k: int = 1):
            self.k = k

        def config(self) -> dict[str, int]:
            return {"k": self.k}

    try:
        rb = ReplayBuffer(4, sampler=Custom(3))
        assert rb.config() == {"capacity": 4, "sampler": {"name": "test-custom", "config": {"k": 3}}}
        assert make_sampler(sampler_config(Custom(5))).k == 5
        with pytest.raises(SpecError, match="already registered by Custom"):
            register_sampler("test-custom")(xpbank.UniformSampler)
    finally:
        SAMPLERS.pop("test-custom")
    with pytest.raises(SpecError, match=r"'test-custom' is not registered here; known: \[.*'uniform'"):
        make_sampler({"name": "test-custom", "config": {}})

    class Unregistered(xpbank.UniformSampler):
        pass

    with pytest.raises(SpecError, match="Unregistered is not registered"):
        ReplayBuffer(4, sampler=Unregistered()).config()


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_prioritized_nstep_vector_env_buffer_round_trips(tmp_path: Path, storage: str) -> None:
    """Options and state of the other issues (num_envs, episode index, PER trees, n-step,
    cast) come back from a bank without any bank code knowing them."""
    spec = transition_spec()
    sampler = xpbank.PrioritizedSampler(alpha=0.7, beta=0.5, beta_steps=100)
    rb = ReplayBuffer(
        40, spec, storage=storage, sampler=sampler, seed=3, num_envs=2, nstep=xpbank.NStep(3, 0.9), cast=False
    )
    for step in range(27):  # wraps: 54 items into 40 slots
        rb.extend(make_batch(spec, 2, start=2 * step))
    batch = rb.sample(16)
    rb.update_priority(batch["index"], torch.rand(16, generator=torch.Generator().manual_seed(0)) + 0.1)
    xpbank.save(rb, tmp_path / "bank")
    back = xpbank.load(tmp_path / "bank")
    assert back.config() == rb.config()
    assert back.config()["num_envs"] == 2 and back.config()["nstep"]["n"] == 3
    assert isinstance(back.sampler, xpbank.PrioritizedSampler) and back.episodes is not None
    for _ in range(3):
        ours, theirs = rb.sample(32), back.sample(32)
        assert set(ours.keys(True, True)) == set(theirs.keys(True, True))
        for key in ours.keys(True, True):
            assert torch.equal(ours[key], theirs[key]), key
