"""Opening the files of a bank, which is untrusted input: regular files only, no links.

:func:`open_regular` opens ``rel`` (``data/next/obs.npy``) relative to a descriptor of
the bank directory one path component at a time, each with ``O_NOFOLLOW``, so no
symbolic link anywhere in the bank (file, ``data/``, ``state/``, a nested field's
directory) is followed. Each component is ``lstat``-ed first and refused unless it is a
plain directory (inner components) or a regular file (the last one): a FIFO, socket or
device is never opened, so nothing blocks. The file itself is opened ``O_NONBLOCK`` (in
case it was swapped for a FIFO between the check and the open) and checked again with
``fstat`` before ``O_NONBLOCK`` is cleared. Every descriptor is closed on every failure.

:func:`read_bounded` reads a whole small file (the manifest) after checking its size
with ``fstat``, so a huge or endless file is refused before any memory is allocated.

Example:
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(root, "manifest.json"))
    >>> dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    >>> try:
    ...     open_regular(dir_fd, "manifest.json", "bank/manifest.json")
    ... except CorruptBankError as exc:
    ...     print(exc)
    bank/manifest.json: is a FIFO, not a regular file; a bank holds regular files only
    >>> os.close(dir_fd)
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from xpbank.errors import CorruptBankError

__all__ = ["MANIFEST_MAX_BYTES", "open_regular", "read_bounded", "check_dir", "kind_of"]

# The largest manifest.json a reader accepts (checked with fstat before reading).
MANIFEST_MAX_BYTES = 16 << 20

_KINDS = (
    (stat.S_ISDIR, "directory"),
    (stat.S_ISLNK, "symbolic link"),
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
    (stat.S_ISREG, "regular file"),
)


def kind_of(mode: int) -> str:
    """``"FIFO"``, ``"directory"``, ... for an ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "special file")


def _lstat(dir_fd: int, part: str) -> os.stat_result:
    return os.stat(part, dir_fd=dir_fd, follow_symlinks=False)


def check_dir(dir_fd: int, part: str, name: str) -> bool:
    """Whether ``part`` exists under ``dir_fd`` as a plain directory (``False``: absent).

    Raises:
        CorruptBankError: it exists and is something else (a symbolic link, a file ...).
    """
    try:
        mode = _lstat(dir_fd, part).st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(mode):
        raise CorruptBankError(f"{name}: is a {kind_of(mode)}, not a directory; a bank holds no links")
    return True


def _open_dir(dir_fd: int, part: str, name: str) -> int:
    if not check_dir(dir_fd, part, name):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", name)
    try:
        return os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):  # replaced since the lstat
            raise CorruptBankError(f"{name}: is not a plain directory; a bank holds no links") from exc
        raise


def open_regular(dir_fd: int, rel: str, name: str, writable: bool = False) -> int:
    """A descriptor of the regular file ``rel`` under ``dir_fd``, no link followed.

    Args:
        dir_fd: the bank directory.
        rel: ``/``-separated, already checked to have no ``..`` or empty parts.
        name: the path to name in errors.
        writable: open read-write (an ``"r+"`` bank's data files).

    Raises:
        FileNotFoundError: ``rel`` (or a directory on its way) does not exist.
        CorruptBankError: a component is a link, or ``rel`` is not a regular file.
    """
    parts = rel.split("/")
    opened: list[int] = []
    try:
        where = dir_fd
        for part in parts[:-1]:
            where = _open_dir(where, part, name)
            opened.append(where)
        mode = _lstat(where, parts[-1]).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(name, mode)
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
        try:
            fd = os.open(parts[-1], flags | os.O_CLOEXEC, dir_fd=where)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR):  # replaced since the lstat
                raise CorruptBankError(f"{name}: is not a regular file") from exc
            raise
    finally:
        for fd_ in opened:
            os.close(fd_)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(name, mode)
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _not_regular(name: str, mode: int) -> CorruptBankError:
    if stat.S_ISLNK(mode):
        return CorruptBankError(f"{name}: is a symbolic link; banks hold plain files")
    return CorruptBankError(
        f"{name}: is a {kind_of(mode)}, not a regular file; a bank holds regular files only"
    )


def read_bounded(fd: int, name: str, limit: int) -> bytes:
    """The whole content of the regular file ``fd`` (closed here), at most ``limit`` bytes.

    Raises:
        CorruptBankError: the file is larger than ``limit`` (checked before reading), or
            grows while being read.
    """
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise CorruptBankError(f"{name}: is {size:,} bytes; the limit is {limit:,} bytes")
        chunks, got = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
            if got > limit:
                raise CorruptBankError(f"{name}: grew past the limit of {limit:,} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(fd)
