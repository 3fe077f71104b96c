"""What a buffer holds: a :class:`Spec` maps each key to a :class:`Field` (shape, dtype).

Shapes are per item: a batch of ``B`` items of field ``Field((4, 84, 84), torch.uint8)``
is a ``(B, 4, 84, 84)`` uint8 tensor. Keys are strings or tuples of strings for nested
entries, TorchRL style: ``("next", "obs")``. A one-element tuple is the same key as its
string.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import torch

from xpbank.errors import SpecError
from xpbank.spec.cast import is_safe_cast

__all__ = ["Field", "Spec", "NestedKey", "is_next_key", "normalize_key", "key_str"]

NestedKey: TypeAlias = "str | tuple[str, ...]"


def normalize_key(key: Any) -> NestedKey:
    """Return ``key`` as a str, or a tuple of two or more strs."""
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and all(isinstance(part, str) for part in key):
        return key[0] if len(key) == 1 else key
    raise SpecError(f"a key must be a str or a non-empty tuple of str, got {key!r}")


def key_str(key: NestedKey) -> str:
    """A key as people read it: ``'obs'``, ``'next.obs'``."""
    return key if isinstance(key, str) else ".".join(key)


_FLAT_NEXT = frozenset(("terminated", "truncated", "done"))


def is_next_key(key: NestedKey) -> bool:
    """Whether a field belongs to the step's outcome (the next step) by its name: with
    TorchRL keys everything under ``"next"``; with flat keys ``next_*`` and
    ``terminated``, ``truncated``, ``done`` (a flat ``reward`` is the step's own).

    Example:
        >>> [is_next_key(k) for k in ("obs", "next_obs", "done", ("next", "reward"))]
        [False, True, True, True]
    """
    if isinstance(key, tuple):
        return key[0] == "next"
    return key.startswith("next_") or key in _FLAT_NEXT


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


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@dataclass(frozen=True)
class Field:
    """The per-item shape and dtype of one entry.

    Example:
        >>> Field((4, 84, 84), torch.uint8)
        Field(shape=(4, 84, 84), dtype=torch.uint8)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype

    def __init__(self, shape: Sequence[int] | int = (), dtype: torch.dtype = torch.float32):
        given: Any = (shape,) if isinstance(shape, int) and not isinstance(shape, bool) else shape
        try:
            if isinstance(given, (str, bytes, bool)) or any(isinstance(d, bool) for d in given):
                raise TypeError
            dims = tuple(operator.index(d) for d in given)
        except TypeError as exc:
            raise SpecError(f"a field shape must be a sequence of ints, got {shape!r}") from exc
        if any(d < 0 for d in dims):
            raise SpecError(f"a field shape must have non-negative dims, got {dims}")
        if not isinstance(dtype, torch.dtype):
            raise SpecError(f"a field dtype must be a torch.dtype, got {dtype!r}")
        object.__setattr__(self, "shape", dims)
        object.__setattr__(self, "dtype", dtype)

    @property
    def numel(self) -> int:
        """Elements per item."""
        n = 1
        for d in self.shape:
            n *= d
        return n

    def describe(self) -> str:
        """``(*, 4, 84, 84) uint8``: the shape with a leading batch wildcard, and dtype."""
        return _expected(self, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (used by the bank manifest)."""
        return {"shape": list(self.shape), "dtype": _dtype_name(self.dtype)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Field:
        """Inverse of :meth:`to_dict`; never evaluates anything from ``data``."""
        name = data.get("dtype")
        dtype = getattr(torch, name, None) if isinstance(name, str) else None
        if not isinstance(dtype, torch.dtype):
            raise SpecError(f"unknown dtype {name!r} in field description {dict(data)!r}")
        return cls(data.get("shape", ()), dtype)


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

        Raises:
            SpecError: a key is missing or unknown, or a field's trailing shape, dtype or
                leading shape differs; the message names the field, expected and got.
        """
        keys = batch.keys()
        if keys != self._keyset and not (partial and keys <= self._keyset):
            self._raise_key_mismatch(keys, partial)
        if batch_ndim == 1 and batch:  # the hot path: accept quickly, explain below
            fields, n = self._fields, -1
            for key, value in batch.items():
                field, shape = fields[key], value.shape
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
        return self._validate_fields(batch, batch_ndim)

    def conform(
        self, batch: dict[NestedKey, torch.Tensor], batch_ndim: int = 1, partial: bool = False
    ) -> tuple[tuple[int, ...], dict[NestedKey, torch.Tensor]]:
        """:meth:`validate`, converting dtypes that :func:`~xpbank.spec.cast.is_safe_cast` allows.

        The whole batch is checked first; only then are values converted, so an error
        leaves nothing half done. When every dtype already matches, ``batch`` itself is
        returned (no copy, no extra pass).

        Returns:
            The leading (batch) shape, and ``batch`` or a new dict with converted values.

        Raises:
            SpecError: as :meth:`validate`, for a wrong shape or a dtype that cannot be
                converted safely (float to int, int to bool, a narrowing int).

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
            return lead, {k: v.to(casts[k]) if k in casts else v for k, v in batch.items()}

    def _validate_fields(
        self,
        batch: Mapping[NestedKey, torch.Tensor],
        batch_ndim: int,
        casts: dict[NestedKey, torch.dtype] | None = None,
    ) -> tuple[int, ...]:
        """Check every field; with ``casts`` given, record safe dtype casts there instead of failing."""
        lead: tuple[int, ...] | None = None
        lead_key: NestedKey = ""
        for key, value in batch.items():
            field = self._fields[key]
            shape = value.shape
            castable = casts is not None and is_safe_cast(value.dtype, field.dtype)
            if (
                (value.dtype != field.dtype and not castable)
                or len(shape) != batch_ndim + len(field.shape)
                or shape[batch_ndim:] != field.shape
            ):
                raise SpecError(
                    f"field {key_str(key)!r}: expected {_expected(field, batch_ndim)}, "
                    f"got {tuple(shape)} {_dtype_name(value.dtype)}"
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
        """Infer a spec from a flat batch: trailing shapes and dtypes (lazy layout)."""
        if len(batch) == 0:
            raise SpecError("cannot infer a spec from an empty batch (no fields)")
        for key, value in batch.items():
            if value.dim() < batch_ndim:
                raise SpecError(
                    f"field {key_str(key)!r}: expected at least {batch_ndim} batch dim(s), "
                    f"got shape {tuple(value.shape)}"
                )
        spec = cls({k: Field(tuple(v.shape[batch_ndim:]), v.dtype) for k, v in batch.items()})
        spec.validate(batch, batch_ndim)  # same leading dims everywhere
        return spec

    @classmethod
    def merge(cls, *specs: Spec, names: Sequence[str] | None = None) -> Spec:
        """Union of specs. A key present in several must have the same field in each.

        Args:
            *specs: the specs to merge, in order.
            names: a name per spec for error messages (default ``"spec 0"``, ...).

        Raises:
            SpecError: the same key with a different shape or dtype, naming both sources.
                (A later spec never silently wins.)
        """
        labels = list(names) if names is not None else [f"spec {i}" for i in range(len(specs))]
        if len(labels) != len(specs):
            raise SpecError(f"merge: expected {len(specs)} names, got {len(labels)}")
        merged: dict[NestedKey, Field] = {}
        origin: dict[NestedKey, str] = {}
        for label, spec in zip(labels, specs, strict=True):
            if not isinstance(spec, Spec):
                raise SpecError(f"merge: {label} is a {type(spec).__name__}, expected Spec")
            for key, field in spec.items():
                if key in merged and merged[key] != field:
                    raise SpecError(
                        f"field {key_str(key)!r} is {merged[key].describe()} in {origin[key]} "
                        f"but {field.describe()} in {label}; rename one or make them agree"
                    )
                merged.setdefault(key, field)
                origin.setdefault(key, label)
        return cls(merged)

    @classmethod
    def from_gymnasium(cls, observation_space: Any, action_space: Any) -> Spec:
        """The transition spec of a gymnasium env (see :mod:`xpbank.spec.spaces`)."""
        from xpbank.spec.spaces import spec_from_gymnasium

        return spec_from_gymnasium(observation_space, action_space)

    @classmethod
    def from_torchrl(cls, composite: Any) -> Spec:
        """A spec from a ``torchrl.data.Composite`` (its batch dims are dropped)."""
        from xpbank.spec.spaces import spec_from_torchrl

        return spec_from_torchrl(composite)

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


def _expected(field: Field, batch_ndim: int) -> str:
    lead = ", ".join(["*"] * batch_ndim) if batch_ndim else ""
    dims = ", ".join([lead, *map(str, field.shape)]) if lead else ", ".join(map(str, field.shape))
    if batch_ndim == 0 and len(field.shape) == 1:
        dims += ","
    return f"({dims}) {_dtype_name(field.dtype)}"


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
