"""What a buffer holds: a :class:`Spec` maps each key to a :class:`~xpbank.spec.field.Field`
(shape, dtype).

Keys are strings or tuples of strings for nested entries (:mod:`xpbank.spec.keys`);
fields are per item (:mod:`xpbank.spec.field`). Both are importable from here too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from xpbank.errors import SpecError
from xpbank.spec.batch import check_tensor
from xpbank.spec.cast import check_cast, is_safe_cast
from xpbank.spec.field import UNSTORABLE, Field, check_storable, dtype_name, field_str
from xpbank.spec.keys import NestedKey, is_next_key, key_str, normalize_key
from xpbank.spec.merge import SpecMerge
from xpbank.spec.space_fields import gymnasium_fields, torchrl_fields

__all__ = [
    "Field",
    "NestedKey",
    "Spec",
    "check_fields",
    "is_next_key",
    "key_str",
    "normalize_key",
    "reject_reserved",
]


class Spec(Mapping[NestedKey, Field]):
    """An ordered mapping ``key -> Field`` describing one item of experience.

    Args:
        fields: ``{key: Field}``; a key is a str or a tuple of strs (nested). Nested
            dicts are flattened: ``{"next": {"obs": f}}`` is ``{("next", "obs"): f}``.

    Example:
        >>> spec = Spec({"obs": Field((3,)), "action": Field((), torch.int64),
        ...              ("next", "obs"): Field((3,))})
        >>> spec[("next", "obs")].shape
        (3,)

        Specs combine (a key in several must have the same field in each): ``a.merge(b)``,
        ``Spec.merge(a, b)`` and ``a | b`` are the same union; ``with_field`` adds one.

        >>> extra = Spec({"env_id": Field((), torch.int64)})
        >>> list(spec.merge(extra)) == list(Spec.merge(spec, extra)) == list(spec | extra)
        True
        >>> list(spec | extra)
        ['obs', 'action', ('next', 'obs'), 'env_id']
    """

    def __init__(self, fields: Mapping[Any, Any] | None = None):
        flat: dict[NestedKey, Field] = {}
        _flatten_fields(fields or {}, (), flat)
        self._fields = flat
        self._keyset = frozenset(flat)

    # -- Mapping ---------------------------------------------------------------
    def __getitem__(self, key: Any) -> Field:
        return self._fields[normalize_key(key)]

    def __iter__(self) -> Iterator[NestedKey]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Spec):
            return NotImplemented
        return self._fields == other._fields

    def __hash__(self) -> int:
        return hash(frozenset(self._fields.items()))  # == ignores order, so must hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{key_str(k)!r}: {f.describe()}" for k, f in self._fields.items())
        return f"Spec({{{inner}}})"

    @property
    def keyset(self) -> frozenset[NestedKey]:
        """The keys as a frozenset (for fast comparison with a batch's keys)."""
        return self._keyset

    def select(self, keys: Sequence[Any]) -> Spec:
        """The sub-spec of ``keys``; an unknown key is a :class:`SpecError`."""
        chosen = {}
        for key in keys:
            k = normalize_key(key)
            if k not in self._fields:
                raise SpecError(f"field {key_str(k)!r} is not in the spec; known: {self._names()}")
            chosen[k] = self._fields[k]
        return Spec(chosen)

    def _names(self) -> str:
        return ", ".join(repr(key_str(k)) for k in self._fields)

    # -- validation ------------------------------------------------------------
    def validate(
        self, batch: Mapping[NestedKey, torch.Tensor], batch_ndim: int = 1, partial: bool = False
    ) -> tuple[int, ...]:
        """Check a flat batch against the spec and return its leading (batch) shape.

        Args:
            batch: ``{key: tensor}`` with normalized keys (see :func:`xpbank.spec.batch.flatten`).
            batch_ndim: how many leading dims are batch dims (1 for ``[B, ...]``).
            partial: allow a subset of the keys (for in-place updates).

        Everything a storage's copy could fail on is checked here, so that a write that
        passes never stops halfway: each value must be a dense (strided, not nested)
        tensor on the CPU or a CUDA device (:func:`~xpbank.spec.batch.check_tensor`).

        Raises:
            SpecError: a key is missing or unknown, or a field's trailing shape, dtype or
                leading shape differs; the message names the field, expected and got.
            BatchTypeError: a sparse, mkldnn or nested tensor (naming the field).
            DeviceError: a tensor on a device no storage copies from (``meta``).
        """
        keys = batch.keys()
        if keys != self._keyset and not (partial and keys <= self._keyset):
            self._raise_key_mismatch(keys, partial)
        if batch_ndim == 1 and batch:  # the hot path: accept quickly, explain below
            fields, n, strided = self._fields, -1, torch.strided
            try:
                for key, value in batch.items():
                    if (
                        value.layout is not strided
                        or not (value.is_cpu or value.is_cuda)
                        or value._is_zerotensor()
                    ):
                        break
                    field, shape = fields[key], value.shape  # a nested tensor raises here
                    if (
                        value.dtype != field.dtype
                        or len(shape) != 1 + len(field.shape)
                        or shape[1:] != field.shape
                    ):
                        break
                    if shape[0] != n and n != -1:
                        break
                    n = shape[0]
                else:
                    return (n,)
            except RuntimeError:
                pass
        return self._validate_fields(batch, batch_ndim)

    def conform(
        self, batch: dict[NestedKey, torch.Tensor], batch_ndim: int = 1, partial: bool = False
    ) -> tuple[tuple[int, ...], dict[NestedKey, torch.Tensor]]:
        """:meth:`validate`, converting dtypes that :func:`~xpbank.spec.cast.is_safe_cast` allows.

        The whole batch is checked first; only then are values converted, so an error
        leaves nothing half done. When every dtype already matches, ``batch`` itself is
        returned (no copy, no extra pass). A conversion that could overflow (float64 to
        float32, int32 to float16 ...) is checked after it is made: a finite value that
        became infinite is refused (:func:`~xpbank.spec.cast.check_cast`).

        Returns:
            The leading (batch) shape, and ``batch`` or a new dict with converted values.

        Raises:
            SpecError: as :meth:`validate`, for a wrong shape or a dtype that cannot be
                converted safely (float to int, int to bool, a narrowing int, uint64 to
                int64), or a value the conversion would turn into infinity.
            BatchTypeError, DeviceError: as :meth:`validate`.

        Example:
            >>> import numpy as np
            >>> spec = Spec({"obs": Field((2,), torch.float32)})
            >>> lead, flat = spec.conform({"obs": torch.from_numpy(np.zeros((5, 2)))})
            >>> lead, flat["obs"].dtype
            ((5,), torch.float32)
        """
        try:
            return self.validate(batch, batch_ndim, partial), batch
        except SpecError:
            if batch.keys() != self._keyset and not (partial and batch.keys() <= self._keyset):
                raise  # wrong keys: nothing to convert
            casts: dict[NestedKey, torch.dtype] = {}
            lead = self._validate_fields(batch, batch_ndim, casts)
            return lead, {k: check_cast(k, v, casts[k]) if k in casts else v for k, v in batch.items()}

    def _validate_fields(
        self,
        batch: Mapping[NestedKey, torch.Tensor],
        batch_ndim: int,
        casts: dict[NestedKey, torch.dtype] | None = None,
    ) -> tuple[int, ...]:
        """Check every field; with ``casts`` given, record safe dtype casts there instead of failing."""
        lead: tuple[int, ...] | None = None
        lead_key: NestedKey = ""
        strided = torch.strided
        for key, value in batch.items():
            if (
                value.layout is not strided
                or not (value.is_cpu or value.is_cuda)
                or value.is_nested
                or value._is_zerotensor()  # autograd's zeros without storage
            ):
                check_tensor(key, value)
            field = self._fields[key]
            shape = value.shape
            castable = casts is not None and is_safe_cast(value.dtype, field.dtype)
            if (
                (value.dtype != field.dtype and not castable)
                or len(shape) != batch_ndim + len(field.shape)
                or shape[batch_ndim:] != field.shape
            ):
                hint = ""
                if value.dtype in UNSTORABLE and value.dtype != field.dtype:
                    hint = "; uint16/32/64 are not storable: convert to a signed int (or the field's dtype)"
                raise SpecError(
                    f"field {key_str(key)!r}: expected {field_str(field, batch_ndim)}, "
                    f"got {tuple(shape)} {dtype_name(value.dtype)}{hint}"
                )
            if casts is not None and value.dtype != field.dtype:
                casts[key] = field.dtype
            if lead is None:
                lead, lead_key = tuple(shape[:batch_ndim]), key
            elif tuple(shape[:batch_ndim]) != lead:
                raise SpecError(
                    f"field {key_str(key)!r}: batch shape {tuple(shape[:batch_ndim])} differs "
                    f"from field {key_str(lead_key)!r}'s {lead}; every field of a batch "
                    f"needs the same leading {batch_ndim} dim(s)"
                )
        return lead if lead is not None else ()

    def _raise_key_mismatch(self, keys: Any, partial: bool) -> None:
        got = set(keys)
        missing = [key_str(k) for k in self._fields if k not in got]
        extra = sorted(key_str(k) for k in got - self._keyset)
        parts = []
        if missing and not partial:
            parts.append(f"missing field(s) {missing}")
        if extra:
            parts.append(f"unknown field(s) {extra}")
        raise SpecError(f"batch keys do not match the spec: {'; '.join(parts)}; expected {self._names()}")

    # -- construction ----------------------------------------------------------
    @classmethod
    def from_batch(cls, batch: Mapping[NestedKey, torch.Tensor], batch_ndim: int = 1) -> Spec:
        """Infer a spec from a flat batch: trailing shapes and dtypes (lazy layout).

        Raises:
            SpecError: no fields, too few dims, a uint16/32/64 value, or leading dims
                that differ. BatchTypeError, DeviceError: as :meth:`validate`.
        """
        if len(batch) == 0:
            raise SpecError("cannot infer a spec from an empty batch (no fields)")
        for key, value in batch.items():
            check_tensor(key, value)
            check_storable(value.dtype, f"field {key_str(key)!r}")
            if value.dim() < batch_ndim:
                raise SpecError(
                    f"field {key_str(key)!r}: expected at least {batch_ndim} batch dim(s), "
                    f"got shape {tuple(value.shape)}"
                )
        spec = cls({k: Field(tuple(v.shape[batch_ndim:]), v.dtype) for k, v in batch.items()})
        spec.validate(batch, batch_ndim)  # same leading dims everywhere
        return spec

    merge = SpecMerge()

    def __or__(self, other: object) -> Spec:
        """``a | b``: :meth:`merge` of the two (a key in both must have the same field)."""
        if not isinstance(other, Spec):
            return NotImplemented
        return Spec.merge(self, other)

    def with_field(self, key: Any, field: Field) -> Spec:
        """This spec with one more field (after the others).

        Raises:
            SpecError: ``key`` is already in the spec with another field.

        Example:
            >>> Spec({"obs": Field((2,))}).with_field("env_id", Field((), torch.int64))
            Spec({'obs': (*, 2) float32, 'env_id': (*) int64})
        """
        return self.merge(Spec({normalize_key(key): field}))

    @classmethod
    def from_gymnasium(cls, observation_space: Any, action_space: Any) -> Spec:
        """The transition spec of a gymnasium env (see :mod:`xpbank.spec.space_fields`)."""
        return cls(gymnasium_fields(observation_space, action_space))

    @classmethod
    def from_torchrl(cls, composite: Any) -> Spec:
        """A spec from a ``torchrl.data.Composite`` (its batch dims are dropped).

        Raises:
            SpecError: ``composite`` is not a Composite (or torchrl's old CompositeSpec).
        """
        return cls(torchrl_fields(composite))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form: ``{"fields": [{"key": [...], "shape": [...], "dtype": ...}]}``."""
        return {
            "fields": [
                {"key": [k] if isinstance(k, str) else list(k), **f.to_dict()}
                for k, f in self._fields.items()
            ]
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Spec:
        """Inverse of :meth:`to_dict`."""
        entries = data.get("fields")
        if not isinstance(entries, list):
            raise SpecError(f"a spec description needs a 'fields' list, got {type(entries).__name__}")
        fields: dict[NestedKey, Field] = {}
        for entry in entries:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("key"), list):
                raise SpecError(f"malformed field entry {entry!r}")
            fields[normalize_key(tuple(entry["key"]))] = Field.from_dict(entry)
        return cls(fields)


def _flatten_fields(fields: Mapping[Any, Any], prefix: tuple[str, ...], out: dict[NestedKey, Field]) -> None:
    for key, value in fields.items():
        full = normalize_key(prefix + (key if isinstance(key, tuple) else (key,)))
        if isinstance(value, Mapping):
            _flatten_fields(value, full if isinstance(full, tuple) else (full,), out)
        elif isinstance(value, Field):
            out[full] = value
        else:
            raise SpecError(f"field {key_str(full)!r}: expected a Field, got {type(value).__name__}")


def check_fields(spec: Spec | None, fields: Sequence[Any] | None) -> list[NestedKey] | None:
    """The keys ``fields`` names (one key or several), each checked against ``spec``.

    Raises:
        SpecError: a field the spec does not have (the message lists the known ones).

    Example:
        >>> import torch
        >>> check_fields(Spec({"obs": Field((2,), torch.float32)}), "obs")
        ['obs']
    """
    if fields is None:
        return None
    if isinstance(fields, (str, tuple)):
        fields = [fields]
    keys = [normalize_key(f) for f in fields]
    spec = spec if spec is not None else Spec()
    unknown = [key_str(k) for k in keys if k not in spec]
    if unknown:
        raise SpecError(f"fields: unknown field(s) {unknown}; known: {[key_str(k) for k in spec]}")
    return keys


def reject_reserved(spec: Spec, reserved: frozenset[Any], why: str) -> Spec:
    """``spec``, or a :class:`SpecError` naming its first field under a ``reserved`` name
    (``why``: what the front-end puts under those names).

    Example:
        >>> reject_reserved(Spec({"obs": Field((2,))}), frozenset({"index"}), "ids go there")
        Spec({'obs': (*, 2) float32})
    """
    clash = sorted(key_str(k) for k in spec if k in reserved)
    if clash:
        raise SpecError(f"field {clash[0]!r} is reserved: {why}; rename it")
    return spec
