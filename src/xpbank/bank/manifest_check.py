"""The entries of ``manifest.json`` checked one by one, without torch or NumPy.

:func:`check_manifest` is the one implementation of the manifest's checks: what
:meth:`Manifest.parse <xpbank.bank.manifest.Manifest.parse>` (load, open, merge,
``list_banks``) and the quick listing of ``xpbank ls`` (:mod:`xpbank.bank.summary`)
both run. The only part that differs is how a dtype name becomes a dtype, given as
:class:`Dtypes`: NumPy and torch for the full check, a table of the dtypes banks hold
for the quick one (which gives up, :class:`Undecided`, on any name it does not know).
A wrong type or value is a :class:`~xpbank.errors.CorruptBankError` naming the file
and the entry.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from xpbank._paths import safe_file_parts
from xpbank.bank.safeio import MANIFEST_MAX_BYTES, open_regular, read_bounded
from xpbank.errors import BankError, CorruptBankError, SpecError

__all__ = [
    "ALGORITHMS",
    "FORMAT_NAME",
    "FREE_SLOTS",
    "FORMAT_VERSION",
    "MANIFEST",
    "Dtypes",
    "FileEntry",
    "Undecided",
    "check_manifest",
    "check_spec_key",
    "data_relpath",
    "describe",
    "read_manifest",
    "state_relpath",
]

FORMAT_NAME = "xpbank-bank"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
ALGORITHMS = ("xxh3_64", "crc32")  # the data checksums a bank may carry
_STATE_NAME = re.compile(r"^state/g[0-9]+_[0-9]+\.npy$")
_MAX_BYTES = 1 << 62  # no file (and no array) is larger
# Slots a bank may claim without bytes on disk behind them (fields of zero bytes, no spec
# yet): a buffer keeps some bookkeeping per slot (ids, episode links: ~25 bytes), so a
# larger capacity must be backed by at least one byte a slot in the bank's files.
FREE_SLOTS = 1 << 24

NestedKey = Any  # str | tuple[str, ...] (spec.keys.NestedKey, which imports torch)
Fields = list[tuple[NestedKey, tuple[int, ...], str]]  # (key, shape, torch dtype name)


class Undecided(Exception):
    """Raised by a :class:`Dtypes` that cannot tell (the full check decides instead)."""


class Dtypes(Protocol):
    """How the check turns names into dtypes."""

    def npy(self, text: str) -> Any:
        """The NumPy dtype (or an object with its ``str``, ``itemsize``, ``hasobject``,
        ``fields``, ``subdtype``) named by a file entry; TypeError/ValueError/SyntaxError
        when there is none."""

    def spec(
        self, raw: dict[str, Any], where: str
    ) -> tuple[Any, list[tuple[NestedKey, tuple[int, ...], str]]]:
        """The manifest's ``spec`` and its fields as ``(key, shape, torch dtype name)``;
        CorruptBankError when malformed."""

    def stored(self, torch_name: str) -> Any:
        """The NumPy dtype a field of that torch dtype is stored as."""


def read_manifest(root: Path, dir_fd: int | None = None) -> dict[str, Any]:
    """The manifest of the bank at ``root`` as a dict, after checking its format header.

    The caller checks the other entries field by field (:func:`check_manifest`).

    Raises:
        BankError: there is no manifest (``root`` is not a bank).
        CorruptBankError: not JSON, not an object, or an unknown format/version.
    """
    name = root / MANIFEST
    own = dir_fd is None
    try:
        if dir_fd is None:
            dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            raw = read_bounded(open_regular(dir_fd, MANIFEST, str(name)), str(name), MANIFEST_MAX_BYTES)
        finally:
            if own:
                os.close(dir_fd)
    except FileNotFoundError as exc:
        raise BankError(f"{root}: not a bank (no {MANIFEST})") from exc
    except BankError:
        raise
    except OSError as exc:
        raise BankError(f"{name}: cannot be read ({exc.strerror or exc})") from exc
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:  # JSONDecodeError, an int past the digit limit
        raise CorruptBankError(f"{name}: is not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise CorruptBankError(f"{name}: is nested too deeply to be a bank manifest") from exc
    if not isinstance(data, dict):
        raise CorruptBankError(f"{name}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != FORMAT_NAME:
        raise CorruptBankError(f"{name}: 'format' is {data.get('format')!r}, expected {FORMAT_NAME!r}")
    version = data.get("format_version")
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        raise CorruptBankError(
            f"{name}: unknown 'format_version' {version!r}; this xpbank reads versions 1..{FORMAT_VERSION}"
        )
    return data


# -- paths and keys ------------------------------------------------------------------
def data_relpath(key: NestedKey) -> str:
    """``data/next/obs.npy`` for ``("next", "obs")`` (a key part that is not a plain
    file name raises :class:`SpecError`)."""
    parts = safe_file_parts(key)  # the rule storage.memmap.field_path applies
    return "/".join(("data", *parts[:-1], parts[-1] + ".npy"))


def check_spec_key(key: Any, where: str) -> NestedKey:
    """A manifest key (list of str) as a spec key, or :class:`CorruptBankError`."""
    if not isinstance(key, list) or not key or not all(isinstance(p, str) for p in key):
        raise CorruptBankError(f"{where}: a field key must be a non-empty list of strings, got {key!r}")
    try:
        data_relpath(tuple(key))
    except SpecError as exc:
        raise CorruptBankError(f"{where}: {exc}; the field path would escape the bank directory") from exc
    return key[0] if len(key) == 1 else tuple(key)


def state_relpath(rel: Any, where: str) -> str:
    """Check a state file name from the manifest (``state/g<gen>_<i>.npy``)."""
    if not isinstance(rel, str) or not _STATE_NAME.fullmatch(rel):
        raise CorruptBankError(f"{where}: state file {rel!r} is not named state/g<N>_<i>.npy")
    return rel


def describe(shape: tuple[int, ...], dtype_name: str) -> str:
    """A field as ``Field.describe`` writes it: ``(*, 4, 84) uint8``."""
    return f"({', '.join(['*', *map(str, shape)])}) {dtype_name}"


# -- entries ---------------------------------------------------------------------------
@dataclass
class FileEntry:
    """One ``.npy`` file of a bank as the manifest describes it.

    ``checksum`` is ``None`` for files modified in place (banks opened ``"r+"``).
    """

    path: str
    shape: tuple[int, ...]
    dtype: Any  # np.dtype
    nbytes: int
    checksum: dict[str, Any] | None
    key: NestedKey | None = None  # data files only
    torch_dtype: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.key is not None:
            out["key"] = [self.key] if isinstance(self.key, str) else list(self.key)
        out.update(
            path=self.path,
            shape=list(self.shape),
            dtype=self.dtype.str,
            nbytes=self.nbytes,
            checksum=self.checksum,
        )
        if self.torch_dtype is not None:
            out["torch_dtype"] = self.torch_dtype
        return out


class _Getter:
    def __init__(self, raw: dict[str, Any], where: str):
        self.raw, self.where = raw, where

    def typed(self, name: str, kind: type) -> Any:
        value = self.raw.get(name)
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise CorruptBankError(
                f"{self.where}: {name!r} must be a {kind.__name__}, got {type(value).__name__} {value!r:.60}"
            )
        return value

    def int(self, name: str, low: int) -> int:
        value = self.typed(name, int)
        if value < low:
            raise CorruptBankError(f"{self.where}: {name!r} must be >= {low}, got {value}")
        return int(value)


def check_manifest(raw: dict[str, Any], root: Path, dtypes: Dtypes) -> dict[str, Any]:
    """Check ``raw`` (already JSON, format and version checked) field by field; returns
    the :class:`~xpbank.bank.manifest.Manifest` fields (``spec`` as ``dtypes`` gives it).

    Raises:
        CorruptBankError: naming ``manifest.json`` and the bad entry.
        Undecided: ``dtypes`` cannot tell (the quick check only).
    """
    where = str(root / MANIFEST)
    get = _Getter(raw, where)
    capacity = get.int("capacity", low=1)
    size = get.int("size", low=0)
    next_id = get.int("next_id", low=0)
    if size > capacity or size > next_id or get.int("cursor", low=0) != next_id % capacity:
        raise CorruptBankError(
            f"{where}: inconsistent ring: size {size}, next_id {next_id}, cursor "
            f"{raw.get('cursor')!r} for capacity {capacity}"
        )
    rows = get.int("rows", low=0) if "rows" in raw else None  # a table's rows: see Manifest.rows
    if rows is not None and not size <= rows <= capacity:
        raise CorruptBankError(f"{where}: 'rows' {rows} outside [size {size}, capacity {capacity}]")
    spec: Any = None
    fields: Fields = []
    if raw.get("spec") is not None:
        spec, fields = dtypes.spec(get.typed("spec", dict), where)
    data = [_data_entry(e, where, capacity, dtypes) for e in get.typed("data", list)]
    if spec is None and (size or data):
        raise CorruptBankError(
            f"{where}: 'spec' is null (no fields) but the bank claims size {size} "
            f"and {len(data)} data file(s)"
        )
    keys = [e.key for e in data]
    if spec is not None and keys != [f[0] for f in fields]:
        raise CorruptBankError(f"{where}: 'data' lists fields {keys}, the spec has {[f[0] for f in fields]}")
    by_key = {key: (shape, name) for key, shape, name in fields}
    for entry in data:
        if spec is not None and entry.key is not None:
            _check_field(entry, *by_key[entry.key], where, dtypes)
    return {
        "session_id": get.typed("session_id", str),
        "created": get.typed("created", str),
        "updated": get.typed("updated", str),
        "capacity": capacity,
        "size": size,
        "next_id": next_id,
        "spec": spec,
        "buffer": get.typed("buffer", dict),
        "state": raw.get("state"),
        "generation": get.int("generation", low=0),
        "data": data,
        "state_files": [_state_entry(e, where, dtypes) for e in get.typed("state_files", list)],
        "metadata": get.typed("metadata", dict) if "metadata" in raw else {},
        "rows": rows,
    }


def _file_entry(raw: Any, where: str, dtypes: Dtypes) -> tuple[_Getter, tuple[int, ...], Any]:
    if not isinstance(raw, dict):
        raise CorruptBankError(f"{where}: a file entry must be an object, got {raw!r:.80}")
    get = _Getter(raw, f"{where} (file {raw.get('path')!r})")
    shape = get.typed("shape", list)
    if len(shape) > 32 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CorruptBankError(
            f"{get.where}: 'shape' must be a list of at most 32 non-negative ints, got {shape!r:.200}"
        )
    try:
        dtype = dtypes.npy(get.typed("dtype", str))
    except (TypeError, ValueError, SyntaxError) as exc:
        raise CorruptBankError(f"{get.where}: unknown dtype {raw.get('dtype')!r:.80}") from exc
    if dtype.hasobject or dtype.fields is not None or dtype.subdtype is not None or dtype.itemsize == 0:
        raise CorruptBankError(f"{get.where}: dtype {dtype} is not a plain numeric dtype")
    nbytes = get.int("nbytes", low=0)
    elements = 1
    for d in shape:
        elements *= max(d, 1)
    if elements * dtype.itemsize > _MAX_BYTES:
        raise CorruptBankError(f"{get.where}: 'shape' {shape!r:.200} is too large for any file")
    count = 1
    for d in shape:
        count *= d
    if count * dtype.itemsize > nbytes:
        raise CorruptBankError(
            f"{get.where}: 'nbytes' {nbytes:,} is less than the {list(shape)} {dtype.str} data it holds"
        )
    checksum = raw.get("checksum")
    if checksum is not None and not (
        isinstance(checksum, dict)
        and checksum.get("algorithm") in ALGORITHMS
        and all(
            isinstance(checksum.get(k), int) and not isinstance(checksum.get(k), bool)
            for k in ("bytes", "value")
        )
    ):
        raise CorruptBankError(f"{get.where}: malformed 'checksum' {checksum!r:.200}")
    return get, tuple(shape), dtype


def _data_entry(raw: Any, where: str, capacity: int, dtypes: Dtypes) -> FileEntry:
    get, shape, dtype = _file_entry(raw, where, dtypes)
    key = check_spec_key(raw.get("key"), where)
    path = get.typed("path", str)
    if path != data_relpath(key):
        raise CorruptBankError(
            f"{where}: field {key!r} must be stored at {data_relpath(key)!r}, not {path!r}"
        )
    if not shape or shape[0] != capacity:
        raise CorruptBankError(
            f"{where}: {path} has shape {list(shape)}; its first dim must be the capacity {capacity}"
        )
    return FileEntry(
        path, shape, dtype, raw["nbytes"], raw.get("checksum"), key, get.typed("torch_dtype", str)
    )


def _state_entry(raw: Any, where: str, dtypes: Dtypes) -> FileEntry:
    _, shape, dtype = _file_entry(raw, where, dtypes)
    path = state_relpath(raw.get("path"), where)
    return FileEntry(path, shape, dtype, raw["nbytes"], raw.get("checksum"))


def _check_field(entry: FileEntry, shape: tuple[int, ...], name: str, where: str, dtypes: Dtypes) -> None:
    if entry.shape[1:] != shape or entry.dtype != dtypes.stored(name) or entry.torch_dtype != name:
        raise CorruptBankError(
            f"{where}: {entry.path} is described as {list(entry.shape)} {entry.dtype} "
            f"({entry.torch_dtype}), but the spec says {describe(shape, name)}"
        )
