"""load's data pass (bank/fill.py): both layouts, runs of any size, checksums in the same
pass, files that end early; prefault's interleaved steps (bank/prefault.py)."""

from __future__ import annotations

import itertools
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import xpbank
from xpbank.bank import fill as fill_module
from xpbank.bank.prefault import _steps
from xpbank.bank.snapshot import Snapshot
from xpbank.errors import CorruptBankError
from xpbank.spec.spec import Field, Spec
from xpbank.storage import TensorStorage

SPEC = Spec(
    {
        "frame": Field((2, 3), torch.uint8),
        "obs": Field((3,)),
        "step": Field((), torch.int32),
        ("next", "obs"): Field((3,)),
        "action": Field((), torch.int64),
        "done": Field((), torch.bool),
        "half": Field((2,), torch.bfloat16),
        "empty": Field((0,)),
    }
)


def _buffer(capacity: int, items: int, seed: int = 0) -> xpbank.ReplayBuffer:
    rb = xpbank.ReplayBuffer(capacity, SPEC, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    for start in range(0, items, 7):  # several writes; wraps when items > capacity
        k = min(7, items - start)
        rb.extend(
            {
                "obs": torch.randn(k, 3, generator=gen),
                ("next", "obs"): torch.randn(k, 3, generator=gen),
                "action": torch.randint(0, 9, (k,), generator=gen),
                "half": torch.randn(k, 2, generator=gen).to(torch.bfloat16),
                "done": torch.rand(k, generator=gen) < 0.3,
                "empty": torch.zeros(k, 0),
                "frame": torch.randint(0, 256, (k, 2, 3), generator=gen).to(torch.uint8),
                "step": torch.arange(start, start + k, dtype=torch.int32),
            }
        )
    return rb


def _check_against_files(loaded: xpbank.ReplayBuffer, path, rb: xpbank.ReplayBuffer) -> None:
    """Slot by slot against the bank's own .npy files read by plain NumPy (the reference),
    then the same samples as the saved buffer."""
    size = len(rb)
    for key in SPEC:
        rel = "/".join(key) if isinstance(key, tuple) else key
        want = np.load(path / "data" / f"{rel}.npy", allow_pickle=False)[:size]
        got = loaded.storage.host_view(key)[:size]
        assert got.dtype == want.dtype and np.array_equal(got, want), key
    assert len(loaded) == size
    if size == 0:
        return
    assert torch.equal(loaded.sample(9)["index"], rb.sample(9)["index"])
    x, y = loaded.sample_all(), rb.sample_all()
    for key in x.keys(True, True):
        assert torch.equal(x[key], y[key]), key


@pytest.mark.parametrize("host", ["all", "none", "one_missing"])
@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
@pytest.mark.parametrize("run_bytes", [1, 100, 1 << 21], ids=["row", "runs", "one_run"])
def test_load_bit_for_bit_both_layouts(tmp_path, monkeypatch, pack, run_bytes, host):
    """Runs of 1 row, ~3 rows, all rows; into host views, or through storage.write (the
    CUDA path, taken on the CPU by hiding the host views; all of them when any is missing)."""
    monkeypatch.setattr(fill_module, "RUN_BYTES", run_bytes)
    rb = _buffer(50, 63)  # wraps
    path = xpbank.save(rb, tmp_path / "b")
    shown = TensorStorage.host_view
    if host != "all":
        hidden = "action" if host == "one_missing" else None
        view = lambda self, key: shown(self, key) if hidden and key != hidden else None  # noqa: E731
        monkeypatch.setattr(TensorStorage, "host_view", view)
    loaded = xpbank.load(path, pack=pack)
    monkeypatch.undo()
    assert loaded.storage.pack is pack
    _check_against_files(loaded, path, rb)


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_checksum_mismatch_in_a_later_run(tmp_path, monkeypatch, pack):
    monkeypatch.setattr(fill_module, "RUN_BYTES", 64)
    rb = _buffer(30, 30)
    path = xpbank.save(rb, tmp_path / "b")
    target = path / "data" / "action.npy"
    with open(target, "r+b") as f:  # one byte of row 25 (the last run but one)
        f.seek(os.path.getsize(target) - 5 * 8)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(CorruptBankError, match=r"action\.npy: checksum mismatch \(xxh3_64|crc32"):
        xpbank.load(path, pack=pack)
    loaded = xpbank.load(path, pack=pack, verify=False)  # read as is when not verified
    assert int(loaded.storage.host_view("action")[25]) != int(rb.storage.host_view("action")[25])


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "unpacked"])
def test_file_shrinking_while_read(tmp_path, monkeypatch, pack):
    """A data file truncated after its size was checked: the read names it."""
    monkeypatch.setattr(fill_module, "RUN_BYTES", 64)
    path = xpbank.save(_buffer(30, 30), tmp_path / "b")
    opened = Snapshot.open
    seen = []

    def open_then_truncate(self, entry, writable=False):
        f, offset = opened(self, entry, writable)
        seen.append(entry.path)
        if seen.count("data/half.npy") == 2:  # the first open only checks it (Snapshot._check_files)
            os.truncate(self.path / entry.path, offset + 20 * 4)  # 20 of 30 rows (4 bytes) left
        return f, offset

    monkeypatch.setattr(Snapshot, "open", open_then_truncate)
    with pytest.raises(CorruptBankError, match=r"half\.npy: ends 40 bytes early"):
        xpbank.load(path, pack=pack)


@settings(max_examples=15, deadline=None)
@given(
    capacity=st.integers(1, 40),
    items=st.integers(0, 90),
    run_bytes=st.integers(1, 400),
    pack=st.booleans(),
)
def test_load_matches_files_any_run_size(tmp_path_factory, capacity, items, run_bytes, pack):
    path = tmp_path_factory.mktemp("bank") / "b"
    rb = _buffer(capacity, items)
    xpbank.save(rb, path)
    old = fill_module.RUN_BYTES
    fill_module.RUN_BYTES = run_bytes
    try:
        loaded = xpbank.load(path, pack=pack)
    finally:
        fill_module.RUN_BYTES = old
    _check_against_files(loaded, path, rb)


@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    step=st.integers(1, 30),
    align=st.sampled_from([1, 2, 4]),
)
def test_prefault_steps_cover_each_region_once_in_order(sizes, step, align):
    regions, at = [], 0
    for size in sizes:
        regions.append((at, at + size * align))
        at += size * align + 3 * align
    pieces = _steps(regions, step * align, align)
    for start, end in regions:  # each region: contiguous, aligned pieces, in order, exactly covered
        mine = [(s, n) for s, n in pieces if start <= s < end]
        assert mine[0][0] == start and all(n > 0 for _, n in mine)
        assert all((s - start) % align == 0 for s, _ in mine)
        assert all(a[0] + a[1] == b[0] for a, b in itertools.pairwise(mine))
        assert mine[-1][0] + mine[-1][1] == end
    assert sum(n for _, n in pieces) == sum(e - s for s, e in regions)
    assert max(n for _, n in pieces) <= step * align  # the largest region in steps, others smaller
    assert sorted(s for s, _ in pieces[: len(regions)]) == [s for s, _ in regions]  # all advance together
