"""A consistent, read-checked view of one bank directory.

A :class:`Snapshot` holds the bank directory by a file descriptor and opens every file
relative to it, so all files come from the same directory even while another process
swaps a new bank into place (:func:`snapshot` retries when that happens). Every file is
checked against the manifest (header shape and dtype, exact size, no symlinks) before
it is used.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from xpbank.bank.checksum import CHUNK_BYTES, checksum_file
from xpbank.bank.codec import decode
from xpbank.bank.format import (
    MANIFEST,
    as_bank_error,
    bank_file,
    read_manifest,
    read_npy_header,
    recover,
)
from xpbank.bank.manifest import FileEntry, Manifest
from xpbank.bank.manifest_check import FREE_SLOTS
from xpbank.bank.safeio import open_regular
from xpbank.errors import BankError, CorruptBankError, XpbankError

__all__ = [
    "FREE_SLOTS",
    "Snapshot",
    "snapshot",
    "read_state",
    "read_checked",
    "algorithm_to_check",
    "check_value",
]

T = TypeVar("T")


class Snapshot:
    """A bank directory held by a file descriptor, so that every file read comes from
    the same directory even while another process swaps a new bank into place."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            self.manifest = Manifest.parse(read_manifest(path, self.fd), path)
            self._check_files()
        except BaseException:
            if self.replaced():  # swapped out and being deleted while we read it
                os.close(self.fd)
                raise _Replaced from None
            os.close(self.fd)
            raise

    def _check_files(self) -> None:
        """Every listed file's header and exact size, then the capacity against the bytes the
        files really hold: all before anything is allocated for the bank."""
        m, on_disk = self.manifest, 0
        for entry in [*m.data, *m.state_files]:
            f, _ = self.open(entry)
            f.close()
            on_disk += entry.nbytes  # checked against fstat by open
        if m.capacity > max(FREE_SLOTS, on_disk):
            raise CorruptBankError(
                f"{self.path / MANIFEST}: 'capacity' {m.capacity:,} is not backed by the bank's files "
                f"({on_disk:,} bytes); a bank of more than {FREE_SLOTS:,} slots holds at least a byte a slot"
            )

    def replaced(self) -> bool:
        """Whether ``path`` now names another directory than the one held."""
        try:
            return os.stat(self.path).st_ino != os.fstat(self.fd).st_ino
        except FileNotFoundError:
            return True

    def open(self, entry: FileEntry, writable: bool = False) -> tuple[Any, int]:
        """Open one file of the bank and check its header; ``(file, data offset)``."""
        name = self.path / entry.path
        bank_file(self.path, entry.path, "file")  # .., absolute, symlink out
        try:
            fd = open_regular(self.fd, entry.path, str(name), writable)
        except FileNotFoundError as exc:
            raise CorruptBankError(f"{name}: missing (listed in {MANIFEST})") from exc
        f = os.fdopen(fd, "r+b" if writable else "rb", buffering=0)
        try:
            info = read_npy_header(f, str(name))
            if info.shape != entry.shape or info.dtype != entry.dtype:
                raise CorruptBankError(
                    f"{name}: holds {list(info.shape)} {info.dtype.str}, the manifest says "
                    f"{list(entry.shape)} {entry.dtype.str}"
                )
            actual = os.fstat(fd).st_size
            if actual != info.offset + info.data_bytes or actual != entry.nbytes:
                raise CorruptBankError(
                    f"{name}: is {actual} bytes, expected {info.offset + info.data_bytes} "
                    f"(manifest: {entry.nbytes}); truncated or altered"
                )
        except BaseException:
            f.close()
            raise
        return f, info.offset

    def close(self) -> None:
        os.close(self.fd)


class _Replaced(Exception):
    """The directory was swapped out by a concurrent save while being opened."""


def snapshot(path: str | os.PathLike[str], use: Callable[[Snapshot], T]) -> T:
    """Run ``use(snapshot)`` on a consistent view of the bank, retrying while another
    process is swapping a new bank into place."""
    root = Path(os.fspath(path))
    for attempt in range(20):
        with contextlib.suppress(OSError):
            recover(root)
        try:
            snap = Snapshot(root)
        except FileNotFoundError as exc:
            raise BankError(f"{root}: no such bank") from exc
        except _Replaced:
            continue
        except OSError as exc:
            raise as_bank_error(exc, "cannot open the bank", root) from exc
        try:
            return use(snap)
        except (XpbankError, OSError) as exc:
            if attempt < 19 and snap.replaced():
                continue
            if not isinstance(exc, XpbankError):
                raise as_bank_error(exc, "cannot open the bank", root) from exc
            raise
        finally:
            snap.close()
    raise BankError(f"{root}: kept changing while being opened")  # pragma: no cover


def read_state(snap: Snapshot) -> dict[str, Any]:
    """The decoded non-data state of the bank (state files always checksummed)."""
    arrays = []
    wanted = _referenced(snap.manifest.state)
    for i, entry in enumerate(snap.manifest.state_files):
        if i not in wanted:  # nothing refers to it: not read (decode never looks at it)
            arrays.append(np.empty(0, np.uint8))
            continue
        f, offset = snap.open(entry)  # its size checked: the allocation is what the file holds
        with f:
            nbytes = entry.nbytes - offset
            out = np.empty(nbytes, np.uint8)
            read_checked(snap, entry, f, nbytes, True, _copy_into(out))  # small: always checked
        arrays.append(out.view(entry.dtype).reshape(entry.shape))
    try:
        state = decode(snap.manifest.state, arrays)
    except RecursionError as exc:
        raise CorruptBankError(f"{snap.path / MANIFEST}: 'state' is nested too deeply") from exc
    except CorruptBankError as exc:  # decode names the entry, not the file
        raise CorruptBankError(f"{snap.path / MANIFEST}: {exc}") from exc
    ring = state.get("ring") if isinstance(state, dict) else None
    m = snap.manifest
    if not isinstance(ring, dict) or (ring.get("next_id"), ring.get("size")) != (m.next_id, m.size):
        raise CorruptBankError(f"{snap.path / MANIFEST}: 'state.ring' disagrees with next_id/size")
    return state


def _referenced(tree: Any) -> set[int]:
    """The state file indices ``tree`` refers to (``{"__array__": i, ...}`` nodes)."""
    found, stack = set(), [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
        elif isinstance(node, dict):
            ref = node.get("__array__")
            if isinstance(ref, int) and not isinstance(ref, bool):
                found.add(ref)
            else:
                stack.extend(node.values())
    return found


def _copy_into(out: np.ndarray) -> Callable[[int, np.ndarray], None]:
    def copy(at: int, chunk: np.ndarray) -> None:
        out[at : at + len(chunk)] = chunk

    return copy


def read_checked(
    snap: Snapshot,
    entry: FileEntry,
    f: BinaryIO,
    nbytes: int,
    verify: bool,
    into: Any = None,
    chunk_bytes: int = CHUNK_BYTES,
) -> None:
    """Read ``nbytes`` data bytes of ``entry`` (passing chunks to ``into``), checking
    the manifest's checksum when ``verify`` and the file has one.

    Raises:
        CorruptBankError: a checksum mismatch, naming the file.
    """
    algorithm = algorithm_to_check(entry, verify)
    if algorithm is None and into is None:
        return
    check_value(snap, entry, checksum_file(f, nbytes, algorithm, into, chunk_bytes), nbytes, verify)


def algorithm_to_check(entry: FileEntry, verify: bool) -> str | None:
    """The checksum algorithm to compute while reading ``entry`` (``None``: none)."""
    return entry.checksum["algorithm"] if verify and entry.checksum is not None else None


def check_value(snap: Snapshot, entry: FileEntry, value: int, nbytes: int, verify: bool) -> None:
    """Compare a computed checksum with the manifest's.

    Raises:
        CorruptBankError: a checksum mismatch, naming the file.
    """
    algorithm = algorithm_to_check(entry, verify)
    if algorithm is None or entry.checksum is None:
        return
    if entry.checksum["bytes"] != nbytes or entry.checksum["value"] != value:
        raise CorruptBankError(
            f"{snap.path / entry.path}: checksum mismatch ({algorithm} {value:#x} over {nbytes} bytes, "
            f"manifest: {entry.checksum['value']:#x} over {entry.checksum['bytes']}); the data is damaged"
        )
