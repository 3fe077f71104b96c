"""Which dtype conversions a buffer makes on its own when a batch's dtype differs.

Hand-written RL loops hand NumPy's ``float64`` to a ``float32`` field, ``int32`` actions
to an ``int64`` one, Python numbers and bools everywhere. A buffer built with
``cast=True`` (the default) converts those, after the whole batch has been checked; a
conversion that loses what matters in RL (a fraction, a sign, a large count, a truth
value made from a number) is refused with the usual :class:`~xpbank.SpecError`.
"""

from __future__ import annotations

import torch

__all__ = ["is_safe_cast"]


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
                         uint8 -> int16; not int64 ->
                         int32, not int8 -> uint8)
    float        no      no                              yes    yes
    complex      no      no                              no     yes
    ===========  ======  ==============================  =====  =======

    Float to float is safe in both directions (float64 -> float32 keeps what RL needs;
    a ``float16`` or ``bfloat16`` field says its owner chose the precision). Int to
    float is safe because rewards and counts written as Python ints are common.

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
        return b in ("float", "complex") or (b == "int" and torch.promote_types(src, dst) == dst)
    if a == "float":
        return b in ("float", "complex")
    return b == "complex"
