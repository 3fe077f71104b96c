"""One entry of an item: :class:`Field` (its per-item shape and dtype).

Shapes are per item: a batch of ``B`` items of field ``Field((4, 84, 84), torch.uint8)``
is a ``(B, 4, 84, 84)`` uint8 tensor.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from xpbank.errors import SpecError

__all__ = ["UNSTORABLE", "Field", "check_storable", "dtype_name", "field_str"]

# torch has no indexing kernels (index_select, index_copy_) for these: a field of one
# could be written once but neither updated nor read back from every storage.
UNSTORABLE = frozenset({torch.uint16, torch.uint32, torch.uint64})


def check_storable(dtype: torch.dtype, what: str) -> None:
    """Raise a :class:`SpecError` naming ``what`` when a field cannot have ``dtype``.

    Storable: bool, uint8, the signed ints, the floats (float16, bfloat16, float32,
    float64, float8) and complex. Not storable: uint16, uint32, uint64 (torch cannot
    index them); convert them to a wider signed int (``cast=True`` does so safely for
    uint16 -> int32/int64 and uint32 -> int64).

    Example:
        >>> try:
        ...     check_storable(torch.uint32, "field 'ids'")
        ... except SpecError as exc:
        ...     print(str(exc)[:42])
        field 'ids': dtype uint32 cannot be stored
    """
    if dtype in UNSTORABLE:
        raise SpecError(
            f"{what}: dtype {dtype_name(dtype)} cannot be stored (torch has no indexing ops for "
            "uint16/32/64); storable: bool, uint8, int8/16/32/64, floats, complex; convert it to "
            "a signed int such as int64"
        )


def dtype_name(dtype: torch.dtype) -> str:
    """``'uint8'`` for ``torch.uint8``."""
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
        check_storable(dtype, "a field")
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
        return field_str(self, 1)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form (used by the bank manifest)."""
        return {"shape": list(self.shape), "dtype": dtype_name(self.dtype)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Field:
        """Inverse of :meth:`to_dict`; never evaluates anything from ``data``."""
        name = data.get("dtype")
        dtype = getattr(torch, name, None) if isinstance(name, str) else None
        if not isinstance(dtype, torch.dtype):
            raise SpecError(f"unknown dtype {name!r} in field description {dict(data)!r}")
        return cls(data.get("shape", ()), dtype)


def field_str(field: Field, batch_ndim: int) -> str:
    """The shape a batch of ``field`` has, ``batch_ndim`` leading ``*`` dims, and its dtype.

    Example:
        >>> field_str(Field((3,), torch.uint8), 2), field_str(Field((3,)), 0)
        ('(*, *, 3) uint8', '(3,) float32')
    """
    lead = ", ".join(["*"] * batch_ndim) if batch_ndim else ""
    dims = ", ".join([lead, *map(str, field.shape)]) if lead else ", ".join(map(str, field.shape))
    if batch_ndim == 0 and len(field.shape) == 1:
        dims += ","
    return f"({dims}) {dtype_name(field.dtype)}"
