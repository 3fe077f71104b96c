"""The bridge between torch and NumPy dtypes, shared by every CPU storage.

NumPy has no bfloat16 or float8: such fields are held as same-width integers on the
NumPy side (and in ``.npy`` files) and viewed back as their torch dtype, bit for bit.
"""

from __future__ import annotations

import numpy as np
import torch

from xpbank.errors import SpecError

__all__ = ["numpy_dtype", "numpy_native", "to_numpy", "as_torch"]

# dtypes NumPy lacks are stored as same-width integers and viewed back on read.
_BITS_AS = {torch.bfloat16: torch.int16}
for _name, _as in (("float8_e4m3fn", torch.uint8), ("float8_e5m2", torch.uint8)):
    if hasattr(torch, _name):
        _BITS_AS[getattr(torch, _name)] = _as


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """The NumPy dtype a field of torch ``dtype`` is held as (in RAM and on disk)."""
    stored = _BITS_AS.get(dtype, dtype)
    try:
        return np.dtype(torch.empty((), dtype=stored).numpy().dtype)
    except TypeError as exc:
        raise SpecError(f"dtype {dtype} cannot be stored in a .npy file") from exc


def numpy_native(dtype: torch.dtype) -> bool:
    """Whether NumPy holds ``dtype`` as itself (bfloat16 and float8 it holds as integers).

    Example:
        >>> numpy_native(torch.float32), numpy_native(torch.bfloat16)
        (True, False)
    """
    return dtype not in _BITS_AS


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A NumPy view (no copy) of a CPU tensor, dtypes NumPy lacks as same-width ints.

    A tensor with its conjugate or negative bit set (``z.conj()``, ``z.conj().imag``),
    which NumPy cannot view, is resolved first (a copy), so a write never fails on it
    part-way.
    """
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    stored = _BITS_AS.get(tensor.dtype)
    return tensor.numpy() if stored is None else tensor.view(stored).numpy()


def as_torch(array: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A torch view (no copy) of a stored array, as the field's torch ``dtype``."""
    tensor = torch.from_numpy(array)
    return tensor.view(dtype) if dtype in _BITS_AS else tensor
