"""Integrity where data is copied or trusted: every copy of a bank verifies what it
copies, verify passes exactly what load passes, "r+" checks before it drops checksums,
and merge copies a consistent snapshot of a buffer being written."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import xpbank
from bank_cases import edit_manifest
from episode_data import filled_buffer
from xpbank import CorruptBankError, ReplayBuffer
from xpbank.bank import merge_into
from xpbank.bank.checksum import hasher_for
from xpbank.tools.cli import build_app
from xpbank.tools.commands import verify_bank

runner = CliRunner()


def cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(build_app(), [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _buffer(capacity: int, n: int, first: int = 0) -> ReplayBuffer:
    """Items whose values encode their id: ``id`` and ``obs = [id, id + 0.5, -id]``."""
    rb = ReplayBuffer(capacity, seed=0)
    if n:
        ids = torch.arange(first, first + n)
        rb.extend({"id": ids, "obs": torch.stack([ids, ids + 0.5, -ids], 1).float()})
    return rb


@pytest.fixture
def two(tmp_path: Path) -> tuple[Path, Path]:
    """Two banks of the same spec; ``a`` has a flipped byte inside its stored ``obs`` rows."""
    a = xpbank.save(_buffer(16, 12), tmp_path / "a")
    b = xpbank.save(_buffer(8, 5, first=100), tmp_path / "b")
    _flip(a / "data" / "obs.npy", 128 + 4 * 3 * 7 + 2)  # header 128 bytes, rows of 12: row 7
    return a, b


def _flip(path: Path, at: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[at] ^= 0x10
    path.write_bytes(bytes(raw))


DAMAGED = r"a/data/obs\.npy: checksum mismatch"


# -- 1. copies verify what they copy -------------------------------------------------
def test_python_merge_of_a_damaged_bank_raises_unless_told_not_to(two: tuple[Path, Path]) -> None:
    a, b = two
    with pytest.raises(CorruptBankError, match=DAMAGED):
        xpbank.merge(a, b)
    with pytest.raises(CorruptBankError, match=DAMAGED):
        xpbank.merge(b, a)
    dst = _buffer(40, 0)
    _ = dst.extend({"id": torch.zeros(1, dtype=torch.int64), "obs": torch.zeros(1, 3)})
    with pytest.raises(CorruptBankError, match=DAMAGED):
        merge_into(dst, a)
    assert len(dst) == 1  # nothing copied
    merged = xpbank.merge(a, b, verify=False)  # the explicit opt-out copies it as it is
    assert merged.sample_all()["id"].tolist() == [*range(12), *range(100, 105)]
    merge_into(dst, a, verify=False)
    assert len(dst) == 13


@pytest.fixture
def episodes(tmp_path: Path) -> tuple[Path, Path]:
    """Two banks of episodes (exportable to Minari); ``a`` has a flipped byte in its rewards."""
    a = xpbank.save(filled_buffer([[4, 7], [5]], 40, 60), tmp_path / "a")
    b = xpbank.save(filled_buffer([[3], [6, 2]], 25, 100, seed=1), tmp_path / "b")
    _flip(a / "data" / "reward.npy", (a / "data" / "reward.npy").stat().st_size - 3)  # a is full: stored
    return a, b


@pytest.mark.parametrize("command", ["merge", "export-npz", "export-minari", "inspect"])
def test_cli_copies_of_a_damaged_bank_fail_in_one_line_unless_no_verify(
    episodes: tuple[Path, Path], tmp_path: Path, command: str
) -> None:
    a, b = episodes
    out = tmp_path / "out"
    args: list[object] = {
        "merge": ["merge", a, b, "-o", out],
        "export-npz": ["export", a, out, "--to", "npz"],
        "export-minari": ["export", a, out, "--to", "minari"],
        "inspect": ["inspect", a],
    }[command]
    if command == "export-minari":
        pytest.importorskip("minari")
    code, _, err = cli(*args)
    assert code == 1
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert "a/data/reward.npy: checksum mismatch" in err
    assert not out.exists() and not out.with_suffix(".npz").exists()  # nothing written
    code, stdout, err = cli(*args, "--no-verify")
    assert code == 0, err
    assert "not verified (--no-verify)" in stdout
    if command == "merge":
        assert len(xpbank.load(out)) == len(xpbank.load(a, verify=False)) + len(xpbank.load(b))


def test_inspect_says_what_it_verified(two: tuple[Path, Path]) -> None:
    _, b = two
    code, out, _ = cli("inspect", b)
    assert code == 0
    assert "verified: 2 of 2 data checksum(s) match, 1 state file(s)" in out
    bank = xpbank.open_bank(b, "r+")  # modified in place from now on: no data checksums
    bank.checkpoint()
    del bank
    code, out, _ = cli("inspect", b)
    assert code == 0
    assert "verified: 0 of 2 data checksum(s) match (2 modified in place: shape and size only)" in out


# -- 2. verify passes exactly what load passes ------------------------------------------
def _rehash(bank: Path, rel: str, nbytes: int) -> Callable[[dict[str, Any]], None]:
    """An edit making a data file's checksum entry cover only ``nbytes`` (a matching value)."""
    raw = (bank / rel).read_bytes()

    def edit(m: dict[str, Any]) -> None:
        entry = next(e for e in m["data"] if e["path"] == rel)
        h = hasher_for(entry["checksum"]["algorithm"])
        h.update(raw[128 : 128 + nbytes])
        entry["checksum"].update(bytes=nbytes, value=h.value())

    return edit


def _lower_size(m: dict[str, Any]) -> None:
    for where in (m, m["state"]["ring"]):
        where["size"] = where["next_id"] = 4
    m["cursor"] = 4


def _entry_edit(rel: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    def edit(m: dict[str, Any]) -> None:
        entry = next(e for e in m["data"] if e["path"] == rel)
        if entry["checksum"] is not None and changes:
            entry["checksum"].update(changes)
        else:
            entry["checksum"] = None

    return edit


# name -> (damage(bank), whether the bank is sound)
CASES: dict[str, tuple[Callable[[Path], None], bool]] = {
    "intact": (lambda p: None, True),
    "flip in the stored rows": (lambda p: _flip(p / "data/id.npy", 128 + 8 * 3), False),
    "flip past size (the sparse tail)": (lambda p: _flip(p / "data/id.npy", 128 + 8 * 14), True),
    "checksum covering fewer rows": (lambda p: edit_manifest(p, _rehash(p, "data/obs.npy", 12 * 5)), False),
    "checksum covering 0 bytes": (lambda p: edit_manifest(p, _rehash(p, "data/obs.npy", 0)), False),
    "size lowered (ring consistent)": (lambda p: edit_manifest(p, _lower_size), False),
    "checksum value altered": (lambda p: edit_manifest(p, _entry_edit("data/id.npy", value=1)), False),
    "checksum dropped (null)": (lambda p: edit_manifest(p, _entry_edit("data/id.npy")), True),
    "state file flipped": (lambda p: _flip(p / "state/g0_0.npy", 200), False),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_verify_and_load_agree_on_damaged_banks(tmp_path: Path, name: str) -> None:
    damage, sound = CASES[name]
    bank = xpbank.save(_buffer(16, 12), tmp_path / "bank")
    damage(bank)

    def passes(check: Callable[[], Any]) -> bool:
        try:
            check()
        except CorruptBankError:
            return False
        return True

    code, _, err = cli("verify", bank)
    assert code in (0, 1) and (code == 0) == (not err), err
    verdicts = {
        "load": passes(lambda: xpbank.load(bank)),
        "open_bank(verify=True)": passes(lambda: xpbank.open_bank(bank, verify=True)),
        "verify_bank": passes(lambda: verify_bank(bank)),
        "xpbank verify": code == 0,
    }
    assert verdicts == dict.fromkeys(verdicts, sound), verdicts


def test_an_empty_bank_checks_its_checksums_of_no_bytes_too(tmp_path: Path) -> None:
    bank = xpbank.save(_empty(), tmp_path / "e")
    edit_manifest(bank, _entry_edit("data/id.npy", value=12345))
    with pytest.raises(CorruptBankError, match=r"e/data/id\.npy: checksum mismatch .* over 0 bytes"):
        xpbank.load(bank)
    with pytest.raises(CorruptBankError, match=r"e/data/id\.npy: checksum mismatch .* over 0 bytes"):
        verify_bank(bank)


def _empty() -> ReplayBuffer:
    rb = _buffer(16, 3)
    rb.clear()  # the spec stays, no items
    return rb


def test_verify_counts_state_files(tmp_path: Path) -> None:
    bank = xpbank.save(_buffer(16, 12), tmp_path / "bank")
    state = len(json.loads((bank / "manifest.json").read_text())["state_files"])
    assert verify_bank(bank) == (2, 2, state)
    code, out, _ = cli("verify", bank)
    assert code == 0 and f"{state} state file(s), {state} checksum(s) match" in out


# -- 3. "r+" checks the checksums before it drops them --------------------------------------
def test_opening_a_damaged_bank_r_plus_raises_and_keeps_its_checksums(two: tuple[Path, Path]) -> None:
    a, _ = two
    with pytest.raises(CorruptBankError, match=DAMAGED):
        xpbank.open_bank(a, "r+")
    with pytest.raises(CorruptBankError, match=DAMAGED):  # still caught: nothing was dropped
        verify_bank(a)
    bank = xpbank.open_bank(a, "r+", verify=False)  # the explicit opt-out drops them unchecked
    del bank
    assert verify_bank(a) == (2, 0, 1)


# -- 5. merge copies a consistent snapshot of a buffer being written ---------------------------
def test_merge_of_a_buffer_being_written_is_a_contiguous_run() -> None:
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: interleave the copy
    src = _buffer(3 * 4096 + 100, 3 * 4096 + 100)
    stop = threading.Event()

    def writer() -> None:
        nxt = len(src)
        while not stop.is_set():
            _ = src.extend(_buffer(64, 64, first=nxt).sample_all().exclude("index"))
            nxt += 64

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    try:
        for _ in range(8):
            got = xpbank.merge(src, _buffer(4, 0)).sample_all()
            ids = got["id"].numpy()
            assert len(ids) == src.capacity
            np.testing.assert_array_equal(np.diff(ids), 1)  # no item skipped or repeated
            want = np.stack([ids, ids + 0.5, -ids], 1).astype(np.float32)
            np.testing.assert_array_equal(got["obs"].numpy(), want)  # rows whole, of the same item
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(old)
