"""The bank format on disk: layout, ``.npy`` files with checksums, manifest, atomic commit.

Everything here is about bytes and files; :mod:`xpbank.bank.bank` builds buffers on top.
The format is documented for readers in any language in ``docs/bank-format.md``.

A bank is a directory::

    manifest.json          the JSON manifest (see docs/bank-format.md)
    data/obs.npy           one plain .npy per field; ("next", "obs") -> data/next/obs.npy
    state/g3_0.npy         arrays of the non-data state (sampler, RNG), per generation

Nothing on the read path unpickles: ``.npy`` headers are parsed by NumPy's literal
parser, object dtypes are refused, and every manifest entry is type-checked.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import shutil
import tokenize
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from xpbank.bank.manifest_check import (  # re-exported: the torch-free half of the format
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    check_spec_key,
    data_relpath,
    read_manifest,
    state_relpath,
)
from xpbank.errors import BankError, CorruptBankError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST",
    "NpyInfo",
    "bank_file",
    "commit_dir",
    "not_open_for_writing",
    "remove_dead_temporaries",
    "fsync_dir",
    "read_manifest",
    "read_npy_header",
    "write_json_atomic",
    "write_npy_header",
    "check_spec_key",
    "data_relpath",
    "state_relpath",
]

DATA_DIR = "data"
STATE_DIR = "state"


# -- paths -------------------------------------------------------------------------
def bank_file(root: Path, rel: str, what: str) -> Path:
    """``root / rel``, refused when it could leave the bank (``..``, absolute, symlink out).

    Raises:
        CorruptBankError: naming ``what`` and the offending path.
    """
    if rel.startswith("/") or "\\" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise CorruptBankError(f"{root / MANIFEST}: {what} path {rel!r} escapes the bank directory")
    path = root / rel
    real_root = root.resolve()
    try:
        inside = path.resolve().is_relative_to(real_root)
    except (OSError, RuntimeError) as exc:  # a symlink loop (RuntimeError before Python 3.13)
        raise CorruptBankError(f"{path}: {what} cannot be resolved ({exc})") from exc
    if not inside:
        raise CorruptBankError(f"{path}: {what} is a link that leaves the bank directory {root}")
    return path


# -- .npy headers ------------------------------------------------------------------
class NpyInfo:
    """What a ``.npy`` header says: shape, dtype, and where the data starts."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype, offset: int):
        self.shape, self.dtype, self.offset = shape, dtype, offset

    @property
    def data_bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * self.dtype.itemsize


def write_npy_header(f: BinaryIO, shape: tuple[int, ...], dtype: np.dtype) -> int:
    """Write a version 1.0 (2.0 if needed) ``.npy`` header; returns the data offset."""
    header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    try:
        np.lib.format.write_array_header_1_0(f, header)
    except ValueError:  # header too long for version 1.0
        np.lib.format.write_array_header_2_0(f, header)
    return f.tell()


def read_npy_header(f: BinaryIO, name: str) -> NpyInfo:
    """Parse a ``.npy`` header (a literal, never evaluated as code).

    Raises:
        CorruptBankError: not a ``.npy`` file, Fortran order, or an object dtype.
    """
    try:
        major, _ = np.lib.format.read_magic(f)
        _check_header_length(f, major)
        if major == 1:
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif major in (2, 3):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {major}")
    except (ValueError, OSError, SyntaxError, tokenize.TokenError) as exc:  # TokenError: an unclosed bracket
        raise CorruptBankError(f"{name}: not a valid .npy file ({exc})") from exc
    if dtype.hasobject:
        raise CorruptBankError(f"{name}: holds Python objects (dtype {dtype}); banks hold plain arrays only")
    if fortran:
        raise CorruptBankError(f"{name}: Fortran-ordered arrays are not part of the bank format")
    return NpyInfo(tuple(int(d) for d in shape), dtype, f.tell())


_NPY_HEADER_MAX = 1 << 16


def _check_header_length(f: BinaryIO, major: int) -> None:
    """Refuse a header length past the file's end (or 64 KiB) before NumPy reads (and
    allocates) that many bytes."""
    width = 2 if major == 1 else 4
    start = f.tell()
    raw = f.read(width)
    f.seek(start)
    if len(raw) != width:
        raise ValueError("the header ends early")
    length = int.from_bytes(raw, "little")
    if length > _NPY_HEADER_MAX or start + width + length > os.fstat(f.fileno()).st_size:
        raise ValueError(f"a header of {length:,} bytes does not fit the file")


# -- manifest ----------------------------------------------------------------------
def write_json_atomic(root: Path, data: dict[str, Any]) -> None:
    """Replace ``root/manifest.json`` atomically: temp file, fsync, rename, fsync dir."""
    tmp = root / f".{MANIFEST}.tmp-{os.getpid()}"
    raw = json.dumps(data, indent=1, allow_nan=True).encode("utf-8")
    with open(tmp, "wb") as f:
        f.write(raw)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / MANIFEST)
    fsync_dir(root)
    _remove_dead(root, (f".{MANIFEST}.tmp-",))  # of checkpoints killed while writing it


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- committing a new bank directory -----------------------------------------------
_RENAME_EXCHANGE = 2


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2(RENAME_EXCHANGE)``); False where the
    system or file system lacks it."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def commit_dir(tmp: Path, target: Path) -> Path | None:
    """Put the finished directory ``tmp`` at ``target`` in one atomic step.

    Returns the path now holding the previous bank (to delete), or ``None``. With an
    existing ``target`` the two are swapped with ``RENAME_EXCHANGE``; where that is not
    available the old one is renamed aside first (a short window in which ``target``
    is missing, which :func:`recover` repairs).
    """
    parent = target.parent
    if not target.exists() and not target.is_symlink():
        os.rename(tmp, target)
        fsync_dir(parent)
        return None
    if not target.is_dir() or target.is_symlink():
        raise BankError(f"{target}: exists and is not a bank directory; refusing to replace it")
    if _exchange(tmp, target):
        fsync_dir(parent)
        return tmp
    aside = parent / f".{target.name}.old"
    os.rename(target, aside)
    os.rename(tmp, target)
    fsync_dir(parent)
    return aside


@contextlib.contextmanager
def not_open_for_writing(target: Path) -> Iterator[None]:
    """Hold the lock an ``"r+"`` bank takes, so a save never swaps out a bank that a
    buffer is writing to (its next checkpoint would land in the new bank)."""
    try:
        fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise BankError(
                f"save: {target} is open with mode='r+' by a buffer; checkpoint and close it first"
            ) from exc
        yield
    finally:
        os.close(fd)


def remove_dead_temporaries(target: Path) -> None:
    """Delete ``.<name>.tmp-<pid>-*`` (a save) and ``.<name>.import-<pid>-*`` (a merge or
    import, and ``..<name>.import-<pid>-*``: the save of one) left next to ``target`` by
    processes that are gone (killed mid-save, or after the swap but before deleting the
    old copy). Names are compared as plain prefixes, never as glob patterns (a bank may
    be named ``lr=1e-3**2`` or ``run[1]``)."""
    parent = target.parent if str(target.parent) else Path(".")
    if parent.is_dir():
        kinds = (f".{target.name}.tmp-", f".{target.name}.import-", f"..{target.name}.import-")
        _remove_dead(parent, kinds)


def _remove_dead(parent: Path, prefixes: tuple[str, ...]) -> None:
    """Delete the entries of ``parent`` named ``<prefix><pid>[-...]`` whose process is gone."""
    with os.scandir(parent) as entries:
        names = [e.name for e in entries if e.name.startswith(prefixes)]
    for name in names:
        rest = name[len(next(p for p in prefixes if name.startswith(p))) :]
        pid = rest.partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            path = parent / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    path.unlink()
        except OSError:  # alive (another user's): leave it
            continue


def recover(target: Path) -> None:
    """Undo a rename-aside interrupted by a crash (only on systems without exchange)."""
    aside = target.parent / f".{target.name}.old"
    if not target.exists() and (aside / MANIFEST).exists():
        os.rename(aside, target)


def as_bank_error(exc: OSError, what: str, path: Path) -> BankError:
    """A :class:`BankError` for an ``OSError`` met while ``what`` at ``path``."""
    if isinstance(exc, BankError):
        return exc
    reason = {
        errno.ENOSPC: "no space left on the device",
        errno.EDQUOT: "disk quota exceeded",
        errno.EROFS: "the file system is read-only",
        errno.EACCES: "permission denied",
        errno.EPERM: "operation not permitted",
    }.get(exc.errno or 0, exc.strerror or str(exc))
    return BankError(f"{what} {path}: {reason} ({getattr(exc, 'filename', None) or path})")
