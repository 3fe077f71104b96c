"""The manifest of a bank: built from a buffer's parts, and checked field by field on read.

Every entry read from ``manifest.json`` is type-checked here before anything uses it;
a wrong type or value is a :class:`~xpbank.errors.CorruptBankError` naming the file and
the entry. The layout is documented in ``docs/bank-format.md``.
"""

from __future__ import annotations

import datetime as _dt
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xpbank.bank.checksum import ALGORITHMS
from xpbank.bank.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MANIFEST,
    check_spec_key,
    data_relpath,
    state_relpath,
)
from xpbank.errors import BankError, CorruptBankError, SpecError
from xpbank.spec.spec import NestedKey, Spec
from xpbank.storage.dtypes import numpy_dtype

__all__ = ["FileEntry", "Manifest", "check_metadata", "json_problem", "new_session_id", "utc_now"]


def new_session_id() -> str:
    """A fresh session id ``YYYYmmdd_HHMMSS_<8 hex>`` (UTC time, random suffix).

    Example:
        >>> import re
        >>> bool(re.fullmatch(r"[0-9]{8}_[0-9]{6}_[0-9a-f]{8}", new_session_id()))
        True
    """
    return f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%d_%H%M%S}_{secrets.token_hex(4)}"


def json_problem(value: Any) -> str | None:
    """Why ``value`` is not a dict that comes back unchanged through JSON, or ``None``.

    Example:
        >>> json_problem({"a": [1, "x", None]}) is None, json_problem({"a": (1, 2)})[:21]
        (True, 'does not survive JSON')
    """
    if not isinstance(value, dict):
        return f"expected a dict, got {type(value).__name__}"
    try:
        same = json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError) as exc:
        return f"must be JSON-able (str keys; str, number, bool, None, list, dict): {exc}"
    return (
        None if same else "does not survive JSON unchanged (tuples or non-str keys?); use lists and str keys"
    )


def check_metadata(metadata: Any) -> dict[str, Any]:
    """``metadata`` if it is a dict that JSON writes and reads back unchanged."""
    problem = json_problem(metadata)
    if problem is not None:
        raise BankError(f"metadata: {problem}")
    return metadata


def utc_now() -> str:
    """The time now in UTC, ISO 8601 with microseconds: ``2026-11-22T06:01:02.123456+00:00``."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat()


@dataclass
class FileEntry:
    """One ``.npy`` file of a bank as the manifest describes it.

    ``checksum`` is ``None`` for files modified in place (banks opened ``"r+"``).
    """

    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
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


@dataclass
class Manifest:
    """A bank's manifest, checked (see :meth:`parse`) or about to be written (:meth:`to_json`)."""

    session_id: str
    created: str
    updated: str
    capacity: int
    size: int
    next_id: int
    spec: Spec | None
    buffer: dict[str, Any]
    state: Any
    generation: int = 0
    data: list[FileEntry] = field(default_factory=list)
    state_files: list[FileEntry] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)  # the caller's JSON, kept as is
    rows: int | None = None  # data rows [0, rows) hold every live item; None: size (a FIFO ring)

    @property
    def data_rows(self) -> int:
        """The rows of each data file that hold items: ``[0, size)`` for a FIFO ring, more
        for a :class:`~xpbank.Table` whose live slots have holes between them."""
        return self.size if self.rows is None else self.rows

    def to_json(self) -> dict[str, Any]:
        out = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "session_id": self.session_id,
            "created": self.created,
            "updated": self.updated,
            "capacity": self.capacity,
            "size": self.size,
            "next_id": self.next_id,
            "cursor": self.next_id % self.capacity,
            "generation": self.generation,
            "spec": None if self.spec is None else self.spec.to_dict(),
            "buffer": self.buffer,
            "state": self.state,
            "state_files": [f.to_json() for f in self.state_files],
            "data": [f.to_json() for f in self.data],
        }
        if self.metadata:  # only when given: banks without it keep their exact bytes
            out["metadata"] = self.metadata
        if self.rows is not None and self.rows != self.size:  # likewise
            out["rows"] = self.rows
        return out

    @classmethod
    def parse(cls, raw: dict[str, Any], root: Path) -> Manifest:
        """Check ``raw`` (already JSON, format and version checked) field by field.

        Raises:
            CorruptBankError: naming ``manifest.json`` and the bad entry.
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
        rows = get.int("rows", low=0) if "rows" in raw else None
        if rows is not None and not size <= rows <= capacity:
            raise CorruptBankError(f"{where}: 'rows' {rows} outside [size {size}, capacity {capacity}]")
        spec = None
        if raw.get("spec") is not None:
            spec = _spec(get.typed("spec", dict), where)
        data = [_data_entry(e, where, capacity) for e in get.typed("data", list)]
        if spec is None and (size or data):
            raise CorruptBankError(
                f"{where}: 'spec' is null (no fields) but the bank claims size {size} "
                f"and {len(data)} data file(s)"
            )
        keys = [e.key for e in data]
        if spec is not None and keys != list(spec):
            raise CorruptBankError(f"{where}: 'data' lists fields {keys}, the spec has {list(spec)}")
        for entry in data:
            if spec is not None and entry.key is not None:
                _check_field(entry, spec, where)
        return cls(
            session_id=get.typed("session_id", str),
            created=get.typed("created", str),
            updated=get.typed("updated", str),
            capacity=capacity,
            size=size,
            next_id=next_id,
            spec=spec,
            buffer=get.typed("buffer", dict),
            state=raw.get("state"),
            generation=get.int("generation", low=0),
            data=data,
            state_files=[_state_entry(e, where) for e in get.typed("state_files", list)],
            metadata=get.typed("metadata", dict) if "metadata" in raw else {},
            rows=rows,
        )


def _spec(raw: dict[str, Any], where: str) -> Spec:
    """The manifest's ``spec``, every field's dtype one a bank stores."""
    try:
        spec = Spec.from_dict(raw)
        for key, fld in spec.items():
            try:
                numpy_dtype(fld.dtype)
            except (TypeError, ValueError, KeyError) as exc:
                raise SpecError(f"field {key!r}: dtype {fld.dtype} cannot be stored in a bank") from exc
    except (SpecError, TypeError, ValueError, KeyError, OverflowError) as exc:
        raise CorruptBankError(f"{where}: 'spec' is malformed: {exc}") from exc
    return spec


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


def _file_entry(raw: Any, where: str) -> tuple[_Getter, tuple[int, ...], np.dtype]:
    if not isinstance(raw, dict):
        raise CorruptBankError(f"{where}: a file entry must be an object, got {raw!r:.80}")
    get = _Getter(raw, f"{where} (file {raw.get('path')!r})")
    shape = get.typed("shape", list)
    if len(shape) > 32 or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise CorruptBankError(
            f"{get.where}: 'shape' must be a list of at most 32 non-negative ints, got {shape!r:.200}"
        )
    try:
        dtype = np.dtype(get.typed("dtype", str))
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
    if _data_bytes(shape) * dtype.itemsize > nbytes:
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


_MAX_BYTES = 1 << 62  # no file (and no array) is larger


def _data_bytes(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _data_entry(raw: Any, where: str, capacity: int) -> FileEntry:
    get, shape, dtype = _file_entry(raw, where)
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


def _state_entry(raw: Any, where: str) -> FileEntry:
    _, shape, dtype = _file_entry(raw, where)
    path = state_relpath(raw.get("path"), where)
    return FileEntry(path, shape, dtype, raw["nbytes"], raw.get("checksum"))


def _check_field(entry: FileEntry, spec: Spec, where: str) -> None:
    if entry.key is None:
        return
    want = spec[entry.key]
    if (
        entry.shape[1:] != want.shape
        or entry.dtype != numpy_dtype(want.dtype)
        or entry.torch_dtype != str(want.dtype).removeprefix("torch.")
    ):
        raise CorruptBankError(
            f"{where}: {entry.path} is described as {list(entry.shape)} {entry.dtype} "
            f"({entry.torch_dtype}), but the spec says {want.describe()}"
        )
