"""Crash safety of banks: SIGKILL during save, disk full, read-only targets, and
opening a bank while another process saves over it."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import xpbank
import xpbank.bank.bank as bank_module
from bank_cases import fork_child, kill_at_random_moments
from helpers import item_numbers, make_batch, transition_spec
from xpbank import BankError, ReplayBuffer
from xpbank.tools.commands import verify_bank
from xpbank.tools.import_bank import merge_banks

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _version(tag: int, rows: int = 20_000) -> ReplayBuffer:
    """Bank content ``tag``: a different size, item numbers and ring for each tag."""
    spec = transition_spec(obs_shape=(16,))
    rb = ReplayBuffer(rows, spec, seed=tag)
    n = rows - rows // 20 * tag
    rb.extend(make_batch(spec, n, start=100_000 * tag))
    return rb


def _which(path: Path, versions: dict[int, ReplayBuffer], reader: Any = xpbank.load) -> int:
    """The tag of the version the bank at ``path`` holds entirely, else fail."""
    got = reader(path)
    numbers = item_numbers(got.sample_all())
    for tag, rb in versions.items():
        if len(got) == len(rb) and torch.equal(numbers, item_numbers(rb.sample_all())):
            assert torch.equal(got.sample_all()["obs"], rb.sample_all()["obs"])
            assert got.state_dict(data=False)["ring"] == rb.state_dict(data=False)["ring"]
            return tag
    raise AssertionError(f"bank holds neither version: {len(got)} items, first {numbers[:3].tolist()}")


def _save_forever(versions: dict[int, ReplayBuffer], path: Path) -> None:
    tags = sorted(versions)
    i = 0
    while True:
        xpbank.save(versions[tags[i % len(tags)]], path)
        i += 1


def test_sigkill_at_random_moments_leaves_old_or_new_bank(tmp_path: Path) -> None:
    versions = {1: _version(1), 2: _version(2)}
    path = tmp_path / "bank"
    xpbank.save(versions[1], path)
    start = time.perf_counter()
    xpbank.save(versions[2], path)
    one_save = time.perf_counter() - start

    def outcome() -> int:
        assert path.is_dir()  # never nothing
        return _which(path, versions)

    seen = kill_at_random_moments(
        lambda: _save_forever(versions, path),
        outcome,
        step_s=one_save,
        seed=1234,
        done=lambda seen: len(set(seen)) == 2,  # kills landed before and after commits
    )
    assert set(seen) == {1, 2}, seen
    xpbank.save(versions[1], path)  # the next save clears what killed saves left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]


def test_open_bank_during_a_concurrent_save_sees_old_or_new(tmp_path: Path) -> None:
    versions = {1: _version(1, rows=5000), 2: _version(2, rows=5000)}
    path = tmp_path / "bank"
    xpbank.save(versions[1], path)
    pid = fork_child(lambda: _save_forever(versions, path))
    try:
        seen: list[int] = []
        start = time.perf_counter()
        # 3 s, or longer (up to 20 s) until both versions were seen on a slow machine
        while (elapsed := time.perf_counter() - start) < 3.0 or (len(set(seen)) < 2 and elapsed < 20.0):
            seen.append(_which(path, versions, lambda p: xpbank.open_bank(p, "r")))
            seen.append(_which(path, versions))
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert set(seen) == {1, 2}, seen[:20]


# -- disk full and read-only targets ---------------------------------------------------
def _small_bank(tmp: Path) -> tuple[Path, ReplayBuffer]:
    spec = transition_spec()
    rb = ReplayBuffer(16, spec, seed=0)
    rb.extend(make_batch(spec, 5))
    return xpbank.save(rb, tmp / "bank"), rb


class _FullDisk:
    """A file that accepts ``budget`` bytes, then fails with ENOSPC."""

    def __init__(self, f: Any, budget: list[int]):
        self._f, self._budget = f, budget

    def write(self, data: Any) -> int:
        n = memoryview(data).nbytes
        if n > self._budget[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self._f.name)
        self._budget[0] -= n
        return self._f.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


@pytest.mark.parametrize("budget", [0, 100, 5000])
def test_disk_full_injected_gives_bank_error_and_keeps_old_bank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget: int
) -> None:
    path, old = _small_bank(tmp_path)
    bigger = _version(1, rows=2000)
    left = [budget]

    def full_disk_open(name: Path, mode: str) -> _FullDisk:
        return _FullDisk(open(name, mode), left)

    monkeypatch.setattr(bank_module, "open", full_disk_open, raising=False)
    with pytest.raises(BankError, match=r"save: cannot write the bank .*bank: no space left on the device"):
        xpbank.save(bigger, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]  # the temporary is gone
    back = xpbank.load(path)
    assert item_numbers(back.sample_all()).tolist() == item_numbers(old.sample_all()).tolist()


def test_read_only_target_injected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, old = _small_bank(tmp_path)

    def read_only(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(bank_module, "commit_dir", read_only)
    with pytest.raises(BankError, match="the file system is read-only"):
        xpbank.save(_version(1, rows=100), path)
    assert len(xpbank.load(path)) == len(old)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_read_only_directory(tmp_path: Path) -> None:
    path, old = _small_bank(tmp_path)
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(BankError, match="permission denied"):
            xpbank.save(_version(1, rows=100), path)
    finally:
        tmp_path.chmod(0o755)
    assert len(xpbank.load(path)) == len(old)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (needs the right to mount; skipped elsewhere)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("cannot run mount here")
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=10)


def test_disk_full_on_a_small_file_system(small_fs: Path) -> None:
    path, old = _small_bank(small_fs)
    with pytest.raises(BankError, match="no space left on the device"):
        xpbank.save(_version(1, rows=40_000), path)  # ~6 MB of rows
    assert sorted(p.name for p in small_fs.iterdir()) == ["bank"]
    assert item_numbers(xpbank.load(path).sample_all()).tolist() == item_numbers(old.sample_all()).tolist()


def test_read_only_file_system(small_fs: Path) -> None:
    path, old = _small_bank(small_fs)
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True, capture_output=True, timeout=10)
    with pytest.raises(BankError, match="the file system is read-only"):
        xpbank.save(_version(1, rows=100), path)
    assert len(xpbank.load(path)) == len(old)
    with pytest.raises(BankError, match="read-only"):
        xpbank.open_bank(path, "r+")
    assert len(xpbank.open_bank(path, "r")) == len(old)


# -- SIGKILL during checkpoint and merge -------------------------------------------------
_STEP = 500  # items appended between two checkpoints


def _checkpoint_forever(path: Path) -> None:
    bank = xpbank.open_bank(path, "r+")
    spec = bank.spec
    assert spec is not None
    while True:
        bank.extend(make_batch(spec, _STEP, start=bank.state_dict(data=False)["ring"]["next_id"]))
        bank.checkpoint()


def _committed_items(path: Path) -> int:
    """The bank holds items ``0 .. n-1`` of whole checkpoints, verifies and loads; ``n``."""
    files, _, state = verify_bank(path)  # shapes, sizes, the state files' checksums
    assert files == 6 and state >= 1
    got = xpbank.load(path)
    n = len(got)
    assert n % _STEP == 0, f"{n} items: not a whole number of checkpointed batches"
    assert item_numbers(got.sample_all()).tolist() == list(range(n))
    assert got.state_dict(data=False)["ring"]["next_id"] == n
    return n


def test_sigkill_during_checkpoints_leaves_the_last_committed_bank(tmp_path: Path) -> None:
    spec = transition_spec(obs_shape=(16,))
    path = xpbank.save(ReplayBuffer(200_000, spec, seed=0), tmp_path / "bank")  # no wrap: no slot rewritten
    bank = xpbank.open_bank(path, "r+")
    start = time.perf_counter()
    bank.extend(make_batch(spec, _STEP))
    bank.checkpoint()
    one_step = time.perf_counter() - start
    del bank
    counts = [_STEP]

    def outcome() -> int:
        n = _committed_items(path)
        assert n >= counts[-1]  # a commit is never undone
        counts.append(n)
        return n

    seen = kill_at_random_moments(
        lambda: _checkpoint_forever(path),
        outcome,
        step_s=one_step,
        seed=4321,
        done=lambda seen: len(set(seen)) >= 3,  # kills before a commit and after several
    )
    assert len(set(seen)) >= 3, seen
    bank = xpbank.open_bank(path, "r+")  # the next checkpoint clears what killed ones left
    bank.checkpoint()
    listed = {e["path"] for e in json.loads((path / "manifest.json").read_text())["state_files"]}
    assert sorted(p.name for p in path.iterdir()) == ["data", "manifest.json", "state"]
    assert {f"state/{p.name}" for p in (path / "state").iterdir()} == listed


def test_a_dead_checkpoints_manifest_temporary_is_cleared_by_the_next(tmp_path: Path) -> None:
    """Found by the checkpoint kill test: a checkpoint killed while writing the manifest
    leaves ``.manifest.json.tmp-<pid>``; the next checkpoint deletes it (a live one's stays)."""
    path, _ = _small_bank(tmp_path)
    child = subprocess.Popen(["true"])
    child.wait()
    dead, alive = path / f".manifest.json.tmp-{child.pid}", path / f".manifest.json.tmp-{os.getppid()}"
    dead.write_text("{")
    alive.write_text("{")
    bank = xpbank.open_bank(path, "r+")
    bank.checkpoint()
    assert not dead.exists() and alive.exists()


@pytest.mark.slow
def test_sigkill_during_merge_leaves_no_bank_or_the_whole_merged_bank(tmp_path: Path) -> None:
    a = xpbank.save(_version(1, rows=3000), tmp_path / "a")
    b = xpbank.save(_version(2, rows=3000), tmp_path / "b")
    out = tmp_path / "out"
    start = time.perf_counter()
    merge_banks(a, b, out)
    one_merge = time.perf_counter() - start
    want = item_numbers(xpbank.load(out).sample_all())
    shutil.rmtree(out)

    def outcome() -> bool:
        merged = out.exists()
        if merged:  # committed: the whole merged bank, checksums and all
            verify_bank(out)
            assert torch.equal(item_numbers(xpbank.load(out).sample_all()), want)
            shutil.rmtree(out)
        merge_banks(a, b, out)  # the next merge to the same name clears what the killed one left
        assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "out"]
        shutil.rmtree(out)
        return merged

    seen = kill_at_random_moments(
        lambda: merge_banks(a, b, out),
        outcome,
        step_s=one_merge / 2,  # kills in [0, 1.5 merges): most land inside one
        seed=99,
        done=lambda seen: len(set(seen)) == 2,
    )
    assert set(seen) == {False, True}, seen
