"""Crash safety of banks: SIGKILL during save, disk full, read-only targets, and
opening a bank while another process saves over it."""

from __future__ import annotations

import errno
import os
import random
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
from helpers import item_numbers, make_batch, transition_spec
from xpbank import BankError, ReplayBuffer

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


def _fork(target: Any) -> int:
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        try:
            torch.set_num_threads(1)  # OpenMP's pool does not survive fork: a parallel op would hang
            target()
        finally:
            os._exit(0)
    return pid


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
    rng = random.Random(1234)
    seen: list[int] = []
    # at least 24 kills; more (up to 80) until both versions were seen, so that kills
    # landed before and after commits even when a loaded machine slows the child down
    while len(seen) < 24 or (len(set(seen)) < 2 and len(seen) < 80):
        pid = _fork(lambda: _save_forever(versions, path))
        time.sleep(rng.uniform(0, 3 * one_save))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        assert path.is_dir()  # never nothing
        seen.append(_which(path, versions))
    assert set(seen) == {1, 2}, seen
    xpbank.save(versions[1], path)  # the next save clears what killed saves left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bank"]


def test_open_bank_during_a_concurrent_save_sees_old_or_new(tmp_path: Path) -> None:
    versions = {1: _version(1, rows=5000), 2: _version(2, rows=5000)}
    path = tmp_path / "bank"
    xpbank.save(versions[1], path)
    pid = _fork(lambda: _save_forever(versions, path))
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
