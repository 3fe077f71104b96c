"""A bank as a ``.npz`` archive and back, streaming: one chunk of rows in memory at a time.

The archive holds one array per field, ``[items, *shape]``, oldest item first; a nested
key is a path (``("next", "obs")`` → ``next/obs``), which ``numpy.load`` reads as is.
Each member is written as an ``.npy`` header and then the rows chunk by chunk (zip64,
not compressed), and read back the same way, so neither direction loads a field whole.

Example:
    >>> import tempfile, torch, numpy as np, xpbank
    >>> rb = xpbank.ReplayBuffer(10)
    >>> _ = rb.extend({"obs": torch.arange(6.0).reshape(3, 2), ("next", "obs"): torch.ones(3, 2)})
    >>> out = export_npz(rb, tempfile.mkdtemp() + "/x.npz")
    >>> sorted(np.load(out).files), np.load(out)["obs"][-1].tolist()
    (['next/obs', 'obs'], [4.0, 5.0])
    >>> xpbank.load(import_npz(out, tempfile.mkdtemp() + "/b")).sample_all()["next", "obs"].shape
    torch.Size([3, 2])
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from xpbank.errors import BankError, SpecError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.spec.spec import NestedKey
from xpbank.storage.dtypes import to_numpy
from xpbank.tools.episode_scan import CHUNK
from xpbank.tools.import_bank import check_new_bank_path, write_bank

__all__ = ["export_npz", "import_npz", "member_name"]


def member_name(key: NestedKey) -> str:
    """The archive name of a field: ``("next", "obs")`` → ``"next/obs"``."""
    return key if isinstance(key, str) else "/".join(key)


def export_npz(
    buffer: ReplayBuffer,
    path: str | os.PathLike[str],
    *,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write every stored item of ``buffer`` (oldest first) to a new ``.npz`` at ``path``.

    Raises:
        BankError: ``path`` exists; the buffer holds nothing.
    """
    target = Path(os.fspath(path))
    if target.exists():
        raise BankError(f"output: {target} already exists; choose a new path or remove it first")
    spec, n = buffer.spec, len(buffer)
    if spec is None or n == 0:
        raise BankError("export: the bank holds no items; nothing to export")
    target.parent.mkdir(parents=True, exist_ok=True)  # like save and merge: parents are made
    try:
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for key in spec:
                with zf.open(member_name(key) + ".npy", "w", force_zip64=True) as f:
                    _write_member(buffer, key, f, n, chunk, progress)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


def _write_member(
    buffer: ReplayBuffer, key: NestedKey, f: IO[bytes], n: int, chunk: int, progress: Any
) -> None:
    header_written = False
    for lo in range(0, n, chunk):
        rows = to_numpy(buffer.sample_by_index(np.arange(lo, min(n, lo + chunk)), fields=[key])[key])
        if not header_written:
            header = {"descr": np.lib.format.dtype_to_descr(rows.dtype), "fortran_order": False}
            np.lib.format.write_array_header_2_0(f, {**header, "shape": (n, *rows.shape[1:])})
            header_written = True
        f.write(np.ascontiguousarray(rows).tobytes())
        if progress is not None:
            progress(rows.shape[0])


def _read_header(f: IO[bytes], name: str) -> tuple[tuple[int, ...], np.dtype]:
    try:
        version = np.lib.format.read_magic(f)
        read = (
            np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        )
        shape, fortran, dtype = read(f)
    except ValueError as exc:
        raise BankError(f"{name}: not an .npy array ({exc})") from exc
    if fortran or not shape or dtype.hasobject:
        raise BankError(f"{name}: expected a C-ordered array of numbers with a leading item axis")
    return tuple(shape), dtype


def _batches(path: Path, names: list[str], n: int, chunk: int) -> Iterator[dict[NestedKey, np.ndarray]]:
    with zipfile.ZipFile(path) as zf:
        files = [zf.open(name) for name in names]
        try:
            meta = [_read_header(f, name) for f, name in zip(files, names, strict=True)]
            for lo in range(0, n, chunk):
                rows = min(chunk, n - lo)
                out: dict[NestedKey, np.ndarray] = {}
                for f, name, (shape, dtype) in zip(files, names, meta, strict=True):
                    count = rows * int(np.prod(shape[1:], dtype=np.int64))
                    data = f.read(count * dtype.itemsize)
                    arr = np.frombuffer(data, dtype=dtype, count=count).reshape(rows, *shape[1:])
                    parts = tuple(name.removesuffix(".npy").split("/"))
                    out[parts[0] if len(parts) == 1 else parts] = arr.copy()
                yield out
        finally:
            for f in files:
                f.close()


def import_npz(
    path: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    capacity: int | None = None,
    chunk: int = CHUNK,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """A new bank at ``out`` with the rows of every array in the ``.npz`` at ``path``.

    Args:
        path: an ``.npz`` whose arrays all have the same leading length (items).
        out: the new bank (must not exist).
        capacity: of the bank; default the number of items.
        chunk: rows read per step.
        progress: called with each chunk's row count.

    Raises:
        BankError: ``path`` is missing or not an ``.npz`` of arrays; ``out`` exists.
        SpecError: the arrays disagree on the number of items.
    """
    src = Path(os.fspath(path))
    check_new_bank_path(out)
    if not src.is_file():
        raise BankError(f"source: {src} is not a file")
    try:
        with zipfile.ZipFile(src) as zf:
            names = [name for name in zf.namelist() if name.endswith(".npy")]
            lengths = {}
            for name in names:
                with zf.open(name) as f:
                    lengths[name] = _read_header(f, name)[0][0]
    except zipfile.BadZipFile as exc:
        raise BankError(f"source: {src} is not an .npz archive ({exc})") from exc
    if not names:
        raise BankError(f"source: {src} holds no arrays")
    if len(set(lengths.values())) != 1:
        raise SpecError(f"source: every array needs the same number of items, got {lengths}")
    n = next(iter(lengths.values()))
    if n == 0:
        raise BankError(f"source: {src} holds 0 items")
    return write_bank(out, capacity or n, _batches(src, names, n, chunk), progress=progress)
