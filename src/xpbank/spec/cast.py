"""Which dtype conversions a buffer makes on its own when a batch's dtype differs.

Hand-written RL loops hand NumPy's ``float64`` to a ``float32`` field, ``int32`` actions
to an ``int64`` one, Python numbers and bools everywhere. A buffer built with
``cast=True`` (the default) converts those, after the whole batch has been checked; a
conversion that loses what matters in RL (a fraction, a sign, a large count, a truth
value made from a number, a finite value that overflows to infinity) is refused with the
usual :class:`~xpbank.SpecError`.

Python numbers, bools and lists of them have no dtype, so this table does not apply to
them: they take their field's dtype from their exact value, with or without ``cast``
(a float64 field stores ``0.1`` exactly, never a float32-rounded copy), and a finite
value that would overflow the field is refused (:func:`xpbank.spec.batch.as_tensor`).

Unsigned inputs: uint8 is an ordinary int; uint16/32/64 (which no field can hold, see
:func:`~xpbank.spec.field.check_storable`) convert by the same rule as every int, by
dtype, never by value: uint16 -> int32/int64 and uint32 -> int64 (every value fits),
uint64 -> no int at all (its values above int64's max do not fit), any of them -> float.
"""

from __future__ import annotations

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.spec.field import dtype_name
from xpbank.spec.keys import NestedKey, key_str

__all__ = ["NUMPY_DTYPES", "check_cast", "is_safe_cast"]

#: The field dtypes NumPy holds as themselves (not bfloat16, complex, unsigned > 8 bits):
#: the write fast paths store fields of these dtypes from NumPy arrays as they come.
NUMPY_DTYPES: dict[torch.dtype, np.dtype] = {
    torch.bool: np.dtype(bool),
    torch.uint8: np.dtype(np.uint8),
    torch.int8: np.dtype(np.int8),
    torch.int16: np.dtype(np.int16),
    torch.int32: np.dtype(np.int32),
    torch.int64: np.dtype(np.int64),
    torch.float16: np.dtype(np.float16),
    torch.float32: np.dtype(np.float32),
    torch.float64: np.dtype(np.float64),
}


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_complex:
        return "complex"
    if dtype.is_floating_point:
        return "float"
    return "int"


def is_safe_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether a value of dtype ``src`` may be stored in a field of dtype ``dst``.

    ===========  ======  ==============================  =====  =======
    from / to    bool    int                             float  complex
    ===========  ======  ==============================  =====  =======
    bool         yes     yes                             yes    yes
    int          no      only if ``dst`` holds every     yes    yes
                         ``src`` value (int32 -> int64,
                         uint8 -> int16, uint32 ->
                         int64; not int64 -> int32,
                         not int8 -> uint8, not
                         uint64 -> int64)
    float        no      no                              yes    yes
    complex      no      no                              no     yes
    ===========  ======  ==============================  =====  =======

    Float to float is safe in both directions (float64 -> float32 keeps what RL needs;
    a ``float16`` or ``bfloat16`` field says its owner chose the precision). Int to
    float is safe because rewards and counts written as Python ints are common. Both
    are by dtype; the values are checked when the conversion is made
    (:func:`check_cast`): a finite value that would become infinite (float64 ``1e300``
    into float32, int ``70000`` into float16) is refused.

    Example:
        >>> is_safe_cast(torch.float64, torch.float32), is_safe_cast(torch.int32, torch.int64)
        (True, True)
        >>> is_safe_cast(torch.float32, torch.int64), is_safe_cast(torch.int64, torch.bool)
        (False, False)
    """
    if src == dst:
        return True
    a, b = _kind(src), _kind(dst)
    if a == "bool":
        return True
    if a == "int":
        if b != "int":
            return b in ("float", "complex")
        have, want = torch.iinfo(src), torch.iinfo(dst)  # promote_types refuses uint16/32/64
        return want.min <= have.min and have.max <= want.max
    if a == "float":
        return b in ("float", "complex")
    return b == "complex"


def _max_of(dtype: torch.dtype) -> float:
    """The largest finite magnitude of ``dtype`` (of its real part for complex)."""
    if dtype == torch.bool:
        return 1.0
    if dtype.is_complex:
        return torch.finfo(dtype).max
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


def check_cast(key: NestedKey, value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``value`` converted to ``dtype`` (a cast :func:`is_safe_cast` allows), checked
    for overflow where ``dtype``'s range is narrower than ``value``'s: the values are
    looked at only then (float64 -> float32, int32 -> float16 ...), never for a widening.

    Raises:
        SpecError: a finite value became infinite (names the field and the first such value).

    Example:
        >>> check_cast("reward", torch.tensor([1.5], dtype=torch.float64), torch.float32)
        tensor([1.5000])
        >>> try:
        ...     check_cast("reward", torch.tensor([1e300], dtype=torch.float64), torch.float32)
        ... except SpecError as exc:
        ...     print(str(exc)[:67])
        field 'reward': value 1e+300 overflows float32 (largest 3.4028e+38)
    """
    out = value.to(dtype)
    if _max_of(dtype) >= _max_of(value.dtype):
        return out
    bad = torch.isinf(out)
    if bad.any():
        bad &= ~torch.isinf(value)  # an infinity passed in stays one: that is no overflow
        if bad.any():
            first = value[bad].reshape(-1)[0].item()
            raise SpecError(
                f"field {key_str(key)!r}: value {first:.5g} overflows {dtype_name(dtype)} "
                f"(largest {_max_of(dtype):.5g}); cast=True only makes conversions that keep "
                "finite values finite: convert or clip it yourself"
            )
    return out
