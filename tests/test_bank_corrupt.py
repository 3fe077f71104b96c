"""Malformed and tampered banks: every one raises CorruptBankError naming the file and
what is wrong; nothing on the load path unpickles or follows a path out of the bank."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import xpbank
from bank_cases import edit_manifest
from xpbank import BankError, CorruptBankError

OPENERS: dict[str, Callable[[Path], Any]] = {
    "load": lambda p: xpbank.load(p),
    "open_bank": lambda p: xpbank.open_bank(p, "r"),
}


def _entry(manifest: dict[str, Any], key: str) -> dict[str, Any]:
    return next(e for e in manifest["data"] if e["key"] == [key])


@pytest.fixture(params=sorted(OPENERS))
def opener(request: pytest.FixtureRequest) -> Callable[[Path], Any]:
    return OPENERS[request.param]


def test_not_a_bank(tmp_path: Path, opener: Callable[[Path], Any]) -> None:
    with pytest.raises(BankError, match="no such bank"):
        opener(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BankError, match=r"empty: not a bank \(no manifest.json\)"):
        opener(tmp_path / "empty")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("{not json", r"manifest.json: is not valid JSON"),
        ("[1, 2]", r"manifest.json: expected a JSON object, got list"),
        ('{"format": "other"}', r"manifest.json: 'format' is 'other'"),
        ('{"format": "xpbank-bank", "format_version": 99}', r"unknown 'format_version' 99"),
        ('{"format": "xpbank-bank", "format_version": "1"}', r"unknown 'format_version' '1'"),
    ],
)
def test_manifest_not_json_or_unknown_version(
    bank: Path, opener: Callable[[Path], Any], text: str, match: str
) -> None:
    (bank / "manifest.json").write_text(text)
    with pytest.raises(CorruptBankError, match=match):
        opener(bank)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda m: m.update(capacity="8"), r"'capacity' must be a int, got str"),
        (lambda m: m.update(size=True), r"'size' must be a int, got bool"),
        (lambda m: m.update(size=9), r"inconsistent ring: size 9"),
        (lambda m: m.update(cursor=0), r"inconsistent ring"),
        (lambda m: m.update(data={}), r"'data' must be a list"),
        (lambda m: m.update(spec={"fields": 3}), r"'spec' is malformed"),
        (lambda m: m["data"].pop(), r"'data' lists fields"),
        (lambda m: _entry(m, "obs").update(dtype="|O"), r"dtype object is not a plain numeric dtype"),
        (lambda m: _entry(m, "obs").update(dtype="<f8"), r"data/obs.npy is described as .* spec says"),
        (lambda m: _entry(m, "obs").update(shape=[8, 4]), r"spec says \(\*, 3\) float32"),
        (lambda m: _entry(m, "obs").update(shape=[9, 3]), r"first dim must be the capacity 8"),
        (lambda m: _entry(m, "obs").update(checksum="abc"), r"malformed 'checksum'"),
        (
            lambda m: m["buffer"].update(sampler={"name": "evil.module", "config": {}}),
            r"'buffer' cannot be rebuilt: sampler 'evil.module' is not registered",
        ),
        (lambda m: m["state"]["ring"].update(next_id=3), r"'state.ring' disagrees"),
        (lambda m: m.update(state={"ring": 1}), r"'state.ring' disagrees"),
    ],
)
def test_manifest_entries_are_checked_field_by_field(
    bank: Path, opener: Callable[[Path], Any], edit: Callable[[dict[str, Any]], None], match: str
) -> None:
    edit_manifest(bank, edit)
    with pytest.raises(CorruptBankError, match=match):
        opener(bank)


def test_missing_and_truncated_data_files(bank: Path, opener: Callable[[Path], Any]) -> None:
    path = bank / "data" / "reward.npy"
    raw = path.read_bytes()
    path.write_bytes(raw[:-5])
    with pytest.raises(CorruptBankError, match=r"data/reward.npy: is \d+ bytes, expected \d+ .*truncated"):
        opener(bank)
    path.unlink()
    with pytest.raises(CorruptBankError, match=r"data/reward.npy: missing \(listed in manifest.json\)"):
        opener(bank)


def test_data_file_shape_or_dtype_disagrees_with_manifest(bank: Path, opener: Callable[[Path], Any]) -> None:
    path = bank / "data" / "reward.npy"
    np.save(path, np.zeros(8, np.int32), allow_pickle=False)  # same bytes per row, other dtype
    with pytest.raises(CorruptBankError, match=r"reward.npy: holds \[8\] <i4, the manifest says \[8\] <f4"):
        opener(bank)
    np.save(path, np.zeros((4, 2), np.float32), allow_pickle=False)
    with pytest.raises(CorruptBankError, match=r"holds \[4, 2\] <f4, the manifest says \[8\] <f4"):
        opener(bank)
    path.write_bytes(b"not an npy file at all")
    with pytest.raises(CorruptBankError, match=r"reward\.npy: not a valid \.npy file"):
        opener(bank)


def test_checksum_mismatch(bank: Path) -> None:
    path = bank / "data" / "obs.npy"
    raw = bytearray(path.read_bytes())
    raw[-8 * 12 + 5] ^= 0xFF  # inside the counted rows
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBankError, match=r"data/obs.npy: checksum mismatch .* the data is damaged"):
        xpbank.load(bank)
    with pytest.raises(CorruptBankError, match="checksum mismatch"):
        xpbank.open_bank(bank, verify=True)
    assert len(xpbank.load(bank, verify=False)) == 8  # explicitly unchecked
    assert len(xpbank.open_bank(bank)) == 8  # open_bank reads no data by default


def test_state_file_checksum_is_always_checked(bank: Path) -> None:
    path = bank / "state" / "g0_0.npy"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 1
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBankError, match=r"state/g0_0.npy: checksum mismatch"):
        xpbank.load(bank, verify=False)


_MARKER = Path(os.environ.get("TMPDIR", "/tmp")) / "xpbank-pickle-ran"


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (_MARKER,))


def test_object_dtype_npy_is_refused_and_never_unpickled(bank: Path, opener: Callable[[Path], Any]) -> None:
    _MARKER.unlink(missing_ok=True)
    arr = np.empty(8, dtype=object)
    arr[:] = [_Payload() for _ in range(8)]
    np.save(bank / "data" / "reward.npy", arr, allow_pickle=True)
    with pytest.raises(CorruptBankError, match=r"reward.npy: holds Python objects \(dtype object\)"):
        opener(bank)
    assert not _MARKER.exists()


def test_nothing_on_the_load_path_unpickles(bank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle was used on the load path")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    assert len(xpbank.load(bank)) == 8
    assert len(xpbank.open_bank(bank, "r")) == 8
    assert len(xpbank.open_bank(bank, "r+")) == 8
    assert [b.size for b in xpbank.list_banks(bank.parent)] == [8]


@pytest.mark.parametrize(
    ("key", "path"),
    [
        (["..", "outside"], "data/../outside.npy"),
        (["/etc", "passwd"], "data//etc/passwd.npy"),
        (["obs"], "../obs.npy"),
        (["obs"], "/tmp/obs.npy"),
    ],
)
def test_field_paths_that_escape_the_bank(
    bank: Path, opener: Callable[[Path], Any], key: list[str], path: str
) -> None:
    edit_manifest(bank, lambda m: _entry(m, "obs").update(key=key, path=path))
    with pytest.raises(CorruptBankError, match=r"escape|must be stored at"):
        opener(bank)


def test_state_paths_that_escape_the_bank(bank: Path, opener: Callable[[Path], Any]) -> None:
    edit_manifest(bank, lambda m: m["state_files"][0].update(path="state/../../g0_0.npy"))
    with pytest.raises(
        CorruptBankError, match=r"state file 'state/../../g0_0.npy' is not named state/g<N>_<i>"
    ):
        opener(bank)


def test_symlinks_out_of_the_bank(bank: Path, tmp_path: Path, opener: Callable[[Path], Any]) -> None:
    outside = tmp_path / "outside.npy"
    os.replace(bank / "data" / "reward.npy", outside)
    os.symlink(outside, bank / "data" / "reward.npy")
    with pytest.raises(CorruptBankError, match=r"reward.npy: file is a link that leaves the bank directory"):
        opener(bank)
    os.replace(bank / "data", tmp_path / "data_outside")
    os.symlink(tmp_path / "data_outside", bank / "data")
    with pytest.raises(CorruptBankError, match="leaves the bank directory"):
        opener(bank)


def test_symlink_inside_the_bank_is_refused_too(bank: Path, opener: Callable[[Path], Any]) -> None:
    target = bank / "data" / "reward_copy.npy"
    os.replace(bank / "data" / "reward.npy", target)
    os.symlink("reward_copy.npy", bank / "data" / "reward.npy")
    with pytest.raises(CorruptBankError, match=r"reward.npy: is a symbolic link; banks hold plain files"):
        opener(bank)


def test_unknown_buffer_option_is_corrupt_not_passed_blindly(
    bank: Path, opener: Callable[[Path], Any]
) -> None:
    edit_manifest(bank, lambda m: m["buffer"].update(no_such_option=3))
    with pytest.raises(CorruptBankError, match=r"'buffer' cannot be rebuilt: .*no_such_option"):
        opener(bank)
