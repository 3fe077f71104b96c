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
import torch

from xpbank.bank.manifest_check import FORMAT_NAME, FORMAT_VERSION, FileEntry, check_manifest
from xpbank.errors import BankError, CorruptBankError, SpecError
from xpbank.spec.field import dtype_name
from xpbank.spec.spec import Spec
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
        """Check ``raw`` (already JSON, format and version checked) field by field
        (:func:`~xpbank.bank.manifest_check.check_manifest`, dtypes by NumPy and torch).

        Raises:
            CorruptBankError: naming ``manifest.json`` and the bad entry.
        """
        return cls(**check_manifest(raw, root, NUMPY_DTYPES))


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


class _NumpyDtypes:
    """The full check's dtypes (:class:`~xpbank.bank.manifest_check.Dtypes`): NumPy
    parses a file's dtype, torch a field's."""

    def npy(self, text: str) -> np.dtype:
        return np.dtype(text)

    def spec(self, raw: dict[str, Any], where: str) -> tuple[Spec, list[tuple[Any, tuple[int, ...], str]]]:
        spec = _spec(raw, where)
        return spec, [(key, fld.shape, dtype_name(fld.dtype)) for key, fld in spec.items()]

    def stored(self, torch_name: str) -> np.dtype:
        return numpy_dtype(getattr(torch, torch_name))


NUMPY_DTYPES = _NumpyDtypes()
