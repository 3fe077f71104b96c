"""Banks used in place: ``open_bank`` maps a bank's own files, ``checkpoint`` commits.

An ``"r"`` bank refuses writes; an ``"r+"`` bank writes through to its files and is
committed by :func:`checkpoint` (``buffer.checkpoint()``): flush, new state files, and
an atomically replaced manifest.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

import numpy as np

from xpbank.bank.bank import ORIGINS, Origin, write_state
from xpbank.bank.checksum import covered_bytes
from xpbank.bank.format import (
    DATA_DIR,
    STATE_DIR,
    as_bank_error,
    data_relpath,
    fsync_dir,
    write_json_atomic,
)
from xpbank.bank.manifest import FileEntry, Manifest, utc_now
from xpbank.bank.rebuild import new_buffer, restore
from xpbank.bank.safeio import check_dir, kind_of
from xpbank.bank.snapshot import Snapshot, read_checked, read_state, snapshot
from xpbank.errors import BankError, CorruptBankError, ReadOnlyError
from xpbank.replay.buffer import ReplayBuffer
from xpbank.storage import MemmapStorage
from xpbank.storage.dtypes import numpy_dtype

__all__ = ["open_bank", "checkpoint"]


def open_bank(path: str | os.PathLike[str], mode: str = "r", *, verify: bool | None = None) -> ReplayBuffer:
    """A :class:`~xpbank.ReplayBuffer` over the bank's own files, memory-mapped.

    No data is read: opening costs the same for 10 MB and 100 GB (the manifest, the
    file headers and the small state files). Pages are read when sampled. (Except the
    first ``"r+"`` open of a saved bank, which checks the checksums it drops.)

    Writes of an ``"r+"`` bank go in place, field after field, unchecksummed: a crash
    between checkpoints can tear a whole in-flight ``extend`` batch, or, on a machine
    crash, any counted slot written since the last checkpoint (see :func:`checkpoint`).

    Args:
        path: the bank directory.
        mode: ``"r"``: writes (``add``, ``extend``, ``update``) raise
            :class:`~xpbank.errors.ReadOnlyError`. ``"r+"``: they go to the files in
            place; :meth:`~xpbank.ReplayBuffer.checkpoint` commits them. Opening
            ``"r+"`` takes an exclusive lock on the bank, checks the data checksums
            the bank still has (see ``verify``) and only then marks them as not kept
            (files modified in place are checked by shape and size only from then on).
        verify: check the data checksums now (reads the stored rows of every file
            that has one). Default (``None``): not for ``"r"``; for ``"r+"`` yes,
            since opening drops the checksums (a bank already opened ``"r+"`` has
            none left: nothing is read). ``verify=False`` with ``"r+"`` drops them
            unchecked: an explicit opt-out.

    Raises:
        BankError: not a bank, a bad mode, or another process has it open ``"r+"``.
        CorruptBankError: as for :func:`load` (shapes, sizes, headers; checksums with
            ``verify=True``).

    Example:
        >>> import tempfile, torch, xpbank
        >>> rb = xpbank.ReplayBuffer(100)
        >>> _ = rb.extend({"x": torch.zeros(3)})
        >>> bank = xpbank.open_bank(xpbank.save(rb, tempfile.mkdtemp() + "/b"), "r+")
        >>> bank.extend({"x": torch.ones(2)})
        range(3, 5)
        >>> bank.checkpoint()  # committed: a crash from here on reopens with 5 items
        >>> type(bank.storage).__name__, len(bank)
        ('MemmapStorage', 5)
    """
    if mode not in ("r", "r+"):
        raise BankError(f"open_bank: mode must be 'r' or 'r+', got {mode!r}")
    root = Path(os.fspath(path))

    def use(snap: Snapshot) -> ReplayBuffer:
        m = snap.manifest
        lock = _lock(snap, root) if mode == "r+" else None
        check = verify if verify is not None else mode == "r+"  # r+: before the checksums go
        try:
            if mode == "r+":  # files will be created under these: no link may lead out
                _check_no_links(snap, root)
            arrays = {}
            for entry in m.data:
                arrays[entry.key] = _map(snap, entry, mode, check)
            if m.spec is None:
                storage = MemmapStorage(m.capacity, root / DATA_DIR)
                storage.mode = mode
            else:
                storage = MemmapStorage.from_arrays(m.capacity, m.spec, arrays, root / DATA_DIR, mode)  # type: ignore[arg-type]
            buffer = new_buffer(m, root, storage)
            restore(buffer, read_state(snap), root, m)
        except BaseException:
            if lock is not None:
                os.close(lock)
            raise
        ORIGINS[buffer] = Origin(root, mode, m, lock)
        if mode == "r+" and any(e.checksum is not None for e in m.data):
            for entry in m.data:
                entry.checksum = None  # modified in place from now on
            m.updated = utc_now()
            _commit_manifest(root, m)
        return buffer

    return snapshot(root, use)


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def _lock(snap: Snapshot, root: Path) -> int:
    fd = os.dup(snap.fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        raise BankError(
            f"open_bank: {root} is already open with mode='r+' (locked by another buffer)"
        ) from exc
    return fd


def _check_no_links(snap: Snapshot, root: Path) -> None:
    """Refuse a link (or anything but a plain directory or file) in ``data/`` and ``state/``,
    where an ``"r+"`` bank creates files (a bank without a spec lays its data out lazily)."""
    for top in (DATA_DIR, STATE_DIR):
        if not check_dir(snap.fd, top, str(root / top)):
            continue
        for where, dirs, files in os.walk(root / top):  # links are listed, never followed
            for name in [*dirs, *files]:
                mode = os.lstat(os.path.join(where, name)).st_mode
                if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                    raise CorruptBankError(
                        f"{os.path.join(where, name)}: is a {kind_of(mode)}; a bank opened 'r+' holds "
                        "plain files and directories only"
                    )


def _map(snap: Snapshot, entry: FileEntry, mode: str, verify: bool) -> np.ndarray:
    f, offset = snap.open(entry, writable=mode == "r+")
    with f:
        if verify:  # the rows the ring stores (one rule with load), never the entry's own count
            nbytes = covered_bytes(entry.shape, entry.dtype.itemsize, snap.manifest.data_rows)
            read_checked(snap, entry, f, nbytes, verify)
        if entry.nbytes == offset:  # a zero-size field: nothing to map
            return np.zeros(entry.shape, entry.dtype)
        return np.memmap(f, dtype=entry.dtype, mode=mode, offset=offset, shape=entry.shape)  # type: ignore[call-overload]


def _commit_manifest(root: Path, manifest: Manifest) -> None:
    try:
        write_json_atomic(root, manifest.to_json())
    except OSError as exc:
        raise as_bank_error(exc, "cannot write the manifest of", root) from exc


def checkpoint(buffer: ReplayBuffer) -> None:
    """Commit a bank opened with ``open_bank(path, "r+")``: flush, then a new manifest.

    The data pages are flushed to disk (``msync``), the non-data state (ring, sampler,
    RNG) is written to new state files, and the manifest is replaced atomically (temp
    file, fsync, rename, fsync of the directory). Its cost depends on what changed
    since the last checkpoint, not on the size of the bank.

    What a crash between checkpoints loses: the bank reopens at the last checkpoint's
    ring (size, next id, cursor, sampler, RNG). Rows appended after it into slots that
    were empty are simply not counted. But rows are written in place: once the ring
    has wrapped, appends after the checkpoint overwrite the oldest counted rows, and
    ``update`` rewrites counted rows; after a crash those slots hold the newer values
    under the checkpoint's ids. Checkpoint as often as losing that is not acceptable.

    What a crash can tear (rows are plain stores into the mapped files, field after
    field, none atomic): if the process is killed, the write call in flight, a whole
    ``extend`` batch and not just one row, can be part old and part new (some fields,
    any subset of a field's rows); calls that returned are in the page cache and
    reach the files. If the machine crashes, every counted slot written since the last
    checkpoint can be torn, by field and by memory page. These rows carry no checksum,
    so ``load`` and ``xpbank verify`` cannot detect it (``docs/bank-format.md``).

    Raises:
        BankError: ``buffer`` is not an open bank, or the manifest cannot be written.
        ReadOnlyError: the bank was opened with ``mode="r"``.
    """
    origin = ORIGINS.get(buffer)
    if origin is None or origin.mode == "memory":
        raise BankError(
            "checkpoint: this buffer is not an open bank; open one with xpbank.open_bank(path, 'r+') "
            "or write a copy with xpbank.save(buffer, path)"
        )
    if origin.mode != "r+":
        raise ReadOnlyError(f"checkpoint: the bank at {origin.path} was opened with mode='r'; use mode='r+'")
    root, old = origin.path, origin.manifest
    if origin.lock_fd is not None and _inode(root) != os.fstat(origin.lock_fd).st_ino:
        raise BankError(f"checkpoint: {root} is no longer the bank this buffer opened (replaced or moved)")
    storage = buffer.storage
    try:
        if isinstance(storage, MemmapStorage):
            storage.flush()
        generation = old.generation + 1
        state_files, tree = write_state(buffer, root, generation)
        data = old.data if old.spec is not None or buffer.spec is None else _data_in_place(buffer, root)
        ring = buffer.state_dict(data=False)["ring"]
        new = Manifest(
            session_id=old.session_id,
            created=old.created,
            updated=utc_now(),
            capacity=old.capacity,
            size=int(ring["size"]),
            next_id=int(ring["next_id"]),
            spec=buffer.spec,
            buffer=buffer.config(),
            state=tree,
            generation=generation,
            data=data,
            state_files=state_files,
            metadata=old.metadata,
            rows=int(ring.get("rows", ring["size"])),
        )
        write_json_atomic(root, new.to_json())
    except OSError as exc:
        raise as_bank_error(exc, "checkpoint: cannot commit the bank", root) from exc
    origin.manifest = new
    keep = {e.path for e in state_files}
    for name in os.listdir(root / STATE_DIR):  # this and crashed checkpoints' leftovers
        if f"{STATE_DIR}/{name}" not in keep:
            with contextlib.suppress(OSError):
                os.unlink(root / STATE_DIR / name)


def _data_in_place(buffer: ReplayBuffer, root: Path) -> list[FileEntry]:
    """Entries for data files a lazily laid out ``"r+"`` bank created since it was opened."""
    spec = buffer.spec
    entries = []
    for key, field in (spec or {}).items():
        rel = data_relpath(key)
        dtype = numpy_dtype(field.dtype)
        entries.append(
            FileEntry(
                rel,
                (buffer.capacity, *field.shape),
                dtype,
                os.path.getsize(root / rel),
                None,
                key,
                str(field.dtype).removeprefix("torch."),
            )
        )
        fsync_dir((root / rel).parent)
    return entries
