"""A pickle-free codec for the non-data state of a buffer (ring, sampler, RNG, ...).

:func:`encode` splits a nested structure into a JSON-able tree and a list of arrays:
dicts with string keys, lists, tuples, ``None``, bools, ints, floats and strings stay in
the tree; every ``torch.Tensor`` and ``numpy.ndarray`` becomes a reference
``{"__array__": i, "kind": "torch" | "numpy", "dtype": ..., "shape": [...]}`` to
``arrays[i]``, which the bank writes as its own ``.npy`` file. :func:`decode` is the
inverse; it checks every node's type and never evaluates or unpickles anything.

So new buffer state (an episode index, a sum-tree) put in ``state_dict()`` as such
values is saved and restored by banks without a change here.

Example:
    >>> import torch
    >>> tree, arrays = encode({"ring": {"next_id": 5}, "rng": torch.arange(3, dtype=torch.uint8)})
    >>> tree["rng"]["__array__"], arrays[0].tolist()
    (0, [0, 1, 2])
    >>> decode(tree, arrays)["rng"]
    tensor([0, 1, 2], dtype=torch.uint8)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from xpbank.errors import BankError, CorruptBankError, SpecError
from xpbank.storage.dtypes import numpy_dtype, to_numpy

__all__ = ["encode", "decode"]

_MARKERS = frozenset({"__array__", "__tuple__"})


def encode(state: Any) -> tuple[Any, list[np.ndarray]]:
    """``(tree, arrays)``: a JSON-able tree and the arrays it references by position.

    Raises:
        BankError: a value of a type the codec does not store, naming where it is.
    """
    arrays: list[np.ndarray] = []
    return _encode(state, "state", arrays), arrays


def _encode(value: Any, where: str, arrays: list[np.ndarray]) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (np.integer, np.floating, np.bool_)):
        return value.item()
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        arrays.append(to_numpy(tensor).copy())
        return _ref(len(arrays) - 1, "torch", str(tensor.dtype).removeprefix("torch."), tensor.shape)
    if isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise BankError(f"{where}: object arrays cannot be stored in a bank")
        arrays.append(np.ascontiguousarray(value))
        return _ref(len(arrays) - 1, "numpy", value.dtype.str, value.shape)
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str) or key in _MARKERS:
                raise BankError(
                    f"{where}: key {key!r} cannot be stored (keys are strings, not {sorted(_MARKERS)})"
                )
            out[key] = _encode(item, f"{where}.{key}", arrays)
        return out
    if isinstance(value, list):
        return [_encode(item, f"{where}[{i}]", arrays) for i, item in enumerate(value)]
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(item, f"{where}[{i}]", arrays) for i, item in enumerate(value)]}
    raise BankError(f"{where}: a {type(value).__name__} cannot be stored in a bank (no pickle)")


def _ref(index: int, kind: str, dtype: str, shape: Sequence[int]) -> dict[str, Any]:
    return {"__array__": index, "kind": kind, "dtype": dtype, "shape": list(shape)}


def decode(tree: Any, arrays: Sequence[np.ndarray], where: str = "state") -> Any:
    """Inverse of :func:`encode`; ``arrays`` as loaded (``allow_pickle=False``).

    Raises:
        CorruptBankError: a node of the wrong type, a bad reference, or an array whose
            dtype or shape disagrees with its reference, naming where.
    """
    if tree is None or isinstance(tree, (bool, int, float, str)):
        return tree
    if isinstance(tree, list):
        return [decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(tree)]
    if not isinstance(tree, dict):
        raise CorruptBankError(f"{where}: unexpected {type(tree).__name__} in the encoded state")
    if "__tuple__" in tree:
        items = tree["__tuple__"]
        if len(tree) != 1 or not isinstance(items, list):
            raise CorruptBankError(f"{where}: malformed tuple entry {tree!r}")
        return tuple(decode(item, arrays, f"{where}[{i}]") for i, item in enumerate(items))
    if "__array__" in tree:
        return _decode_array(tree, arrays, where)
    return {key: decode(item, arrays, f"{where}.{key}") for key, item in tree.items()}


def _decode_array(ref: dict[str, Any], arrays: Sequence[np.ndarray], where: str) -> Any:
    index, kind, dtype, shape = (ref.get(k) for k in ("__array__", "kind", "dtype", "shape"))
    if (
        set(ref) != {"__array__", "kind", "dtype", "shape"}
        or not isinstance(index, int)
        or isinstance(index, bool)
        or not 0 <= index < len(arrays)
        or kind not in ("torch", "numpy")
        or not isinstance(dtype, str)
        or not isinstance(shape, list)
        or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape)
    ):
        raise CorruptBankError(f"{where}: malformed array reference {ref!r}")
    array = arrays[index]
    if tuple(array.shape) != tuple(shape):
        raise CorruptBankError(f"{where}: array {index} has shape {array.shape}, the manifest says {shape}")
    if kind == "numpy":
        if array.dtype.str != dtype:
            raise CorruptBankError(f"{where}: array {index} is {array.dtype.str}, the manifest says {dtype}")
        return array
    torch_dtype = getattr(torch, dtype, None)
    try:  # a torch dtype NumPy cannot hold (uint1, qint8 ...) is no array of a bank either
        held = numpy_dtype(torch_dtype) if isinstance(torch_dtype, torch.dtype) else None
    except SpecError:
        held = None
    if not isinstance(torch_dtype, torch.dtype) or held != array.dtype:
        raise CorruptBankError(f"{where}: array {index} is {array.dtype}, which does not hold torch {dtype}")
    tensor = torch.from_numpy(np.array(array, copy=True))
    return tensor.view(torch_dtype) if tensor.dtype != torch_dtype else tensor
