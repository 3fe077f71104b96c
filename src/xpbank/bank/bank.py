"""Banks of experience on disk: save a full copy, load it back into memory.

``save`` writes a full copy beside the target and swaps it into place; ``load`` reads
a bank back into a memory :class:`~xpbank.ReplayBuffer`, bit for bit. Banks used in
place (``open_bank``, ``checkpoint``) are in :mod:`xpbank.bank.opened`.
The format is in :mod:`xpbank.bank.format` and ``docs/bank-format.md``.

What a bank needs from a buffer: ``ReplayBuffer.config()`` (JSON-able constructor
options; :func:`new_buffer` passes every key but the capacity and the sampler and
storage choices on as keyword arguments, so a new option is one more key),
``state_dict(data=False)`` (through :mod:`~xpbank.bank.codec`), a sampler registered by
name (:mod:`xpbank.sampler.registry`), and optionally the storage's ``host_view``
(``save`` writes from it without a gather). ``save`` copies under the buffer's lock.
"""

from __future__ import annotations

import os
import secrets
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from xpbank.bank.checksum import CHUNK_BYTES, ChecksumWriter
from xpbank.bank.codec import encode
from xpbank.bank.fill import fill
from xpbank.bank.format import (
    MANIFEST,
    STATE_DIR,
    as_bank_error,
    commit_dir,
    data_relpath,
    fsync_dir,
    not_open_for_writing,
    remove_dead_temporaries,
    write_json_atomic,
    write_npy_header,
)
from xpbank.bank.manifest import FileEntry, Manifest, check_metadata, new_session_id, utc_now
from xpbank.bank.prefault import prefault
from xpbank.bank.rebuild import new_buffer, restore
from xpbank.bank.snapshot import Snapshot, read_state, snapshot
from xpbank.errors import BankError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.storage import TensorStorage
from xpbank.storage.dtypes import numpy_dtype, to_numpy

__all__ = [
    "save",
    "load",
    "bank_of",
    "bank_metadata",
    "ORIGINS",
    "Origin",
    "new_buffer",
    "restore",
    "write_state",
]


@dataclass
class Origin:
    """Where a buffer came from: its bank's path, mode, session and manifest."""

    path: Path
    mode: str  # "memory" (load), "r" or "r+" (open_bank)
    manifest: Manifest
    lock_fd: int | None = None

    def __del__(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)


ORIGINS: weakref.WeakKeyDictionary[ReplayBuffer, Origin] = weakref.WeakKeyDictionary()


def bank_of(buffer: ReplayBuffer) -> tuple[Path, str, str] | None:
    """``(path, mode, session_id)`` of the bank a buffer was loaded or opened from, or ``None``."""
    origin = ORIGINS.get(buffer)
    return None if origin is None else (origin.path, origin.mode, origin.manifest.session_id)


# -- save ----------------------------------------------------------------------------
def save(
    buffer: ReplayBuffer,
    path: str | os.PathLike[str] | None = None,
    *,
    session_id: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a full copy of ``buffer`` as a bank at ``path``; returns the bank's path.

    The copy is written into a hidden sibling directory, every file and directory is
    fsynced, and only then is it swapped into place in one atomic rename, so a crash at
    any moment leaves the old bank or the new one at ``path``, never a mix and never
    nothing. Data files hold rows in slot order (slot = id % capacity), so ids,
    cursor, sampler and RNG state come back exactly with :func:`load`.

    Args:
        buffer: any :class:`~xpbank.ReplayBuffer` (memory on any device, or memmap).
        path: the bank directory; default ``./bank_<session id>``. An existing bank
            there is replaced; an existing non-empty directory that is not a bank is not.
        session_id: default: the session of the bank ``buffer`` came from, else a new
            ``YYYYmmdd_HHMMSS_<8 hex>`` (UTC).
        metadata: the caller's own JSON-able dict, written into the manifest as is and
            given back by :func:`bank_metadata` on the loaded buffer; default: that of
            the bank ``buffer`` came from, if any.

    Raises:
        BankError: the target cannot be written (disk full, read-only, permissions);
            the previous bank at ``path`` is left as it was.

    Example:
        >>> import tempfile, torch, xpbank
        >>> rb = xpbank.ReplayBuffer(100, seed=0)
        >>> rb.extend({"obs": torch.arange(6.0).reshape(3, 2)})
        range(0, 3)
        >>> path = xpbank.save(rb, tempfile.mkdtemp() + "/bank")
        >>> xpbank.load(path).sample_all()["obs"][-1]
        tensor([4., 5.])
    """
    if not isinstance(buffer, ReplayBuffer):
        raise BankError(f"save: expected a ReplayBuffer, got {type(buffer).__name__}")
    origin = ORIGINS.get(buffer)
    session = session_id or (origin.manifest.session_id if origin else new_session_id())
    if not isinstance(session, str) or not session or "/" in session:
        raise BankError(f"session_id: expected a non-empty string without '/', got {session!r}")
    target = Path(os.fspath(path)) if path is not None else Path(f"bank_{session}")
    if origin is not None and origin.mode != "memory" and _same_dir(origin.path, target):
        raise BankError(
            f"save: {target} is the bank this buffer is open on; call buffer.checkpoint() instead"
        )
    _check_target(target)
    meta = check_metadata(metadata if metadata is not None else (origin.manifest.metadata if origin else {}))
    created = origin.manifest.created if origin and origin.manifest.session_id == session else utc_now()
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    remove_dead_temporaries(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        with buffer.lock:  # one consistent copy while other threads use the buffer
            manifest = _write_files(buffer, tmp, session, created)
        manifest.metadata = meta
        write_json_atomic(tmp, manifest.to_json())
        with not_open_for_writing(target):
            old = commit_dir(tmp, target)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise as_bank_error(exc, "save: cannot write the bank", target) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target


def bank_metadata(buffer: ReplayBuffer) -> dict[str, Any]:
    """The ``metadata`` saved with the bank ``buffer`` was loaded or opened from (``{}``: none).

    Example:
        >>> import tempfile, torch, xpbank
        >>> rb = xpbank.ReplayBuffer(4)
        >>> _ = rb.extend({"x": torch.zeros(2)})
        >>> path = xpbank.save(rb, tempfile.mkdtemp() + "/b", metadata={"owner": "me"})
        >>> bank_metadata(xpbank.load(path)), bank_metadata(rb)
        ({'owner': 'me'}, {})
    """
    origin = ORIGINS.get(buffer)
    return dict(origin.manifest.metadata) if origin is not None else {}


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _check_target(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise BankError(f"save: {target} exists and is not a directory; refusing to replace it")
    if target.is_dir() and not (target / MANIFEST).exists() and any(target.iterdir()):
        raise BankError(f"save: {target} is a non-empty directory that is not a bank; refusing to replace it")


def _write_files(buffer: ReplayBuffer, root: Path, session: str, created: str) -> Manifest:
    """Write the data and state files of ``buffer`` under ``root``; return the manifest."""
    spec, size = buffer.spec, len(buffer)
    data = _write_data(buffer, root) if spec is not None else []
    state_files, tree = write_state(buffer, root, generation=0)
    return Manifest(
        session_id=session,
        created=created,
        updated=utc_now(),
        capacity=buffer.capacity,
        size=size,
        next_id=int(buffer.state_dict(data=False)["ring"]["next_id"]),
        spec=spec,
        buffer=buffer.config(),
        state=tree,
        generation=0,
        data=data,
        state_files=state_files,
        rows=_data_rows(buffer),
    )


def _data_rows(buffer: ReplayBuffer) -> int:
    """The rows holding every live item: ``[0, len)``, or a Table's ``[0, rows)`` (its live
    slots may have holes between them)."""
    return int(buffer.state_dict(data=False)["ring"].get("rows", len(buffer)))


def _write_data(buffer: ReplayBuffer, root: Path) -> list[FileEntry]:
    """One ``.npy`` per field: header, rows of slots ``[0, size)``, a sparse tail."""
    spec, size, capacity = buffer.spec, _data_rows(buffer), buffer.capacity
    if spec is None:
        return []
    host_view = getattr(buffer.storage, "host_view", None)
    entries = []
    for key, field in spec.items():
        rel = data_relpath(key)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        dtype = numpy_dtype(field.dtype)
        row = field.numel * dtype.itemsize
        f = open(root / rel, "wb")  # noqa: SIM115 -- closed by ChecksumWriter
        writer = ChecksumWriter(f)
        try:
            offset = write_npy_header(f, (capacity, *field.shape), dtype)
            os.ftruncate(f.fileno(), offset + capacity * row)  # rows past size: a sparse hole
            view = host_view(key) if host_view is not None else None
            step = max(1, CHUNK_BYTES // max(row, 1))
            for start in range(0, size if row else 0, step):
                stop = min(size, start + step)
                if view is not None:  # host memory: no gather (one copy at most, if strided)
                    writer.write(view[start:stop])
                else:  # CUDA or another storage: gather the rows, then copy them over
                    rows = buffer.storage.gather(torch.arange(start, stop), [key])[key]
                    writer.write(to_numpy(rows.cpu()))
        finally:
            writer.close()
        entries.append(
            FileEntry(
                rel,
                (capacity, *field.shape),
                dtype,
                offset + capacity * row,
                writer.entry(),
                key,
                str(field.dtype).removeprefix("torch."),
            )
        )
    for directory in {(root / e.path).parent for e in entries}:
        fsync_dir(directory)
    return entries


def write_state(buffer: ReplayBuffer, root: Path, generation: int) -> tuple[list[FileEntry], Any]:
    """The non-data state: a JSON tree plus ``state/g<generation>_<i>.npy`` arrays."""
    state = buffer.state_dict(data=False)
    tree, arrays = encode(state)
    (root / STATE_DIR).mkdir(exist_ok=True)
    entries = []
    for i, array in enumerate(arrays):
        rel = f"{STATE_DIR}/g{generation}_{i}.npy"
        f = open(root / rel, "wb")  # noqa: SIM115 -- closed by ChecksumWriter
        write_npy_header(f, array.shape, array.dtype)
        writer = ChecksumWriter(f)
        writer.write(array.reshape(-1))
        writer.close()
        entries.append(
            FileEntry(
                rel,
                array.shape,
                array.dtype,
                os.path.getsize(root / rel),
                writer.entry(),
            )
        )
    fsync_dir(root / STATE_DIR)
    return entries, tree


# -- load ------------------------------------------------------------------------------
def load(
    path: str | os.PathLike[str], *, device: Any = "cpu", verify: bool = True, pack: bool = True
) -> ReplayBuffer:
    """Read a bank into a memory :class:`~xpbank.ReplayBuffer`, restored bit for bit.

    Same items in the same slots, same ids (indices sampled before the save still
    ``update`` the right items), same cursor, sampler state and RNG state: the loaded
    buffer samples exactly what the saved one would have.

    Args:
        path: the bank directory.
        device: where the loaded buffer keeps its data.
        verify: check every data file's checksum against the manifest (computed in the
            same pass as the copy, while the bytes are in cache). Files modified in
            place by an ``"r+"`` bank carry no checksum; their shapes and sizes are
            checked either way.
        pack: the loaded buffer's layout (``TensorStorage(pack=...)``). ``True``: all
            fields of an item in one row (faster sampling; the rows are assembled from
            the per-field files). ``False``: one block per field, read straight from
            the files into the buffer's memory (a faster load). The contents, ids and
            samples are the same either way.

    Raises:
        BankError: ``path`` is not a bank.
        CorruptBankError: a malformed manifest, a missing, truncated or altered file,
            a checksum mismatch, naming the file and what is wrong.

    Example:
        >>> import tempfile, torch, xpbank
        >>> rb = xpbank.ReplayBuffer(10, seed=0)
        >>> rb.extend({"x": torch.arange(12.0)})  # wraps: ids 2..11 live
        range(0, 12)
        >>> back = xpbank.load(xpbank.save(rb, tempfile.mkdtemp() + "/b"))
        >>> back.sample_all()["index"][[0, -1]], torch.equal(back.sample(4)["index"], rb.sample(4)["index"])
        (tensor([ 2, 11]), True)
    """
    root = Path(os.fspath(path))

    def use(snap: Snapshot) -> ReplayBuffer:
        m = snap.manifest
        buffer = new_buffer(m, root, TensorStorage(m.capacity, m.spec, device=device, pack=pack))
        filler = prefault(buffer.storage, m.spec) if m.spec is not None else None
        try:
            if m.spec is not None:
                fill(snap, buffer.storage, m.spec, verify)
        finally:
            if filler is not None:
                filler.join()
        restore(buffer, read_state(snap), root, m)
        ORIGINS[buffer] = Origin(root, "memory", m)
        return buffer

    return snapshot(root, use)
