"""Opening banks does not leak: 1,000 failed and 1,000 successful opens and loads leave
the number of open file descriptors where it started and the resident memory within a
stated tolerance (issue 18, section 4)."""

from __future__ import annotations

import gc
import os
import resource
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import xpbank
from bank_cases import small_bank
from xpbank import CorruptBankError

# RSS may grow this much over 1,000 operations (allocator caches, interned strings, the
# first use of a code path); a leaked buffer, mapping or manifest per operation is more.
RSS_TOLERANCE = 6 << 20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _broken_banks(root: Path) -> dict[str, Path]:
    """A bank damaged each way a reader must refuse: a flipped byte, a FIFO, a directory in
    place of a file, a missing file."""
    banks = {name: small_bank(root / name) for name in ("flipped", "fifo", "directory", "missing")}
    obs = banks["flipped"] / "data" / "obs.npy"
    raw = bytearray(obs.read_bytes())
    raw[-1] ^= 0xFF
    obs.write_bytes(bytes(raw))
    (banks["fifo"] / "manifest.json").unlink()
    os.mkfifo(banks["fifo"] / "manifest.json")
    (banks["directory"] / "data" / "reward.npy").unlink()
    (banks["directory"] / "data" / "reward.npy").mkdir()
    shutil.rmtree(banks["missing"] / "state")
    return banks


def _steady(op: Callable[[int], Any], count: int) -> tuple[int, int]:
    """Run ``op(i)`` ``count`` times after a warm-up; (fd change, RSS growth in bytes)."""
    for i in range(50):
        op(i)
    gc.collect()
    fds, rss = _fds(), _rss()
    for i in range(count):
        op(i)
    gc.collect()
    return _fds() - fds, _rss() - rss


def test_failed_opens_leak_no_descriptor_and_bounded_memory(tmp_path: Path) -> None:
    banks = list(_broken_banks(tmp_path).values())
    readers = (
        xpbank.load,
        lambda p: xpbank.open_bank(p, "r", verify=True),
        lambda p: xpbank.open_bank(p, "r+"),
    )

    def fail(i: int) -> None:
        bank = banks[i % len(banks)]
        with pytest.raises(CorruptBankError, match=str(bank)):
            readers[i // len(banks) % len(readers)](bank)

    fds, rss = _steady(fail, 1000)
    print(f"1,000 failed opens: fds {fds:+d}, RSS {rss / 2**20:+.1f} MiB")
    assert fds == 0, f"{fds} descriptors leaked over 1,000 failed opens"
    assert rss < RSS_TOLERANCE, f"RSS grew {rss / 2**20:.1f} MiB over 1,000 failed opens"


def test_successful_opens_leak_no_descriptor_and_bounded_memory(tmp_path: Path) -> None:
    bank = small_bank(tmp_path / "bank")
    readers = (xpbank.load, xpbank.open_bank, lambda p: xpbank.open_bank(p, "r+"))

    def read(i: int) -> None:
        buffer = readers[i % len(readers)](bank)
        assert len(buffer) == 8
        buffer.sample(4)

    fds, rss = _steady(read, 1000)
    print(f"1,000 opens: fds {fds:+d}, RSS {rss / 2**20:+.1f} MiB")
    assert fds == 0, f"{fds} descriptors leaked over 1,000 opens"
    assert rss < RSS_TOLERANCE, f"RSS grew {rss / 2**20:.1f} MiB over 1,000 opens"
