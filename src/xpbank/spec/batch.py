"""Turning what users pass in into flat ``{key: tensor}`` dicts, and back into TensorDicts.

A batch may be a ``TensorDict``, a (nested) mapping of tensors, NumPy arrays or Python
numbers, with nested keys either as nested mappings or as tuple keys. Internally every
batch is a flat dict keyed by normalized keys (see :func:`xpbank.spec.keys.normalize_key`).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from xpbank.errors import BatchTypeError, DeviceError, SpecError
from xpbank.spec.cast import check_cast, is_safe_cast
from xpbank.spec.keys import NestedKey, key_str, normalize_key

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = ["flatten", "as_tensor", "check_tensor", "is_tensordict", "to_tensordict", "flat_tensordict"]


def check_tensor(key: NestedKey, value: torch.Tensor) -> None:
    """Raise unless a storage can copy from ``value``: a dense (strided, not nested)
    tensor on the CPU or a CUDA device (a ``meta`` tensor holds no data).

    Raises:
        BatchTypeError: a sparse, mkldnn or nested tensor, or an efficient zero tensor (the
            message names the field).
        DeviceError: a tensor on another device, e.g. ``meta``.

    Example:
        >>> try:
        ...     check_tensor("obs", torch.zeros(2, device="meta"))
        ... except DeviceError as exc:
        ...     print(str(exc)[:58])
        field 'obs': expected a tensor on the CPU or a CUDA device
    """
    if value.is_nested or value.layout is not torch.strided:
        kind = "nested" if value.is_nested else f"{value.layout} layout"
        raise BatchTypeError(
            f"field {key_str(key)!r}: expected a dense (strided) tensor, got a {kind} tensor; "
            "convert it first (e.g. .to_dense())"
        )
    if value._is_zerotensor():  # torch._efficientzerotensor: autograd's zeros, no storage
        raise BatchTypeError(
            f"field {key_str(key)!r}: expected a tensor with data, got an efficient zero tensor "
            "(no storage); materialize it first (e.g. torch.zeros_like(t))"
        )
    if not (value.is_cpu or value.is_cuda):
        why = " (a meta tensor holds no data)" if value.is_meta else ""
        raise DeviceError(
            f"field {key_str(key)!r}: expected a tensor on the CPU or a CUDA device, "
            f"got device {str(value.device)!r}{why}"
        )


def as_tensor(value: Any, key: NestedKey, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor view of ``value`` when possible (NumPy arrays share memory).

    Python numbers, bools and (nested) lists of them have no dtype of their own: given
    the field's ``dtype`` they become that dtype straight from their exact value (a
    float64 field keeps ``0.1`` as the float64 ``0.1``, never a float32-rounded one), and
    a finite value that would overflow it is refused. Without a ``dtype`` (a lazily laid
    out buffer's first write) they take torch's default dtypes, as ``torch.tensor`` does.

    Raises:
        BatchTypeError: ``value`` is not tensor-like (an object array, a string, a NumPy
            dtype torch has no type for ...).
        SpecError: a Python number overflows the dtype it must take.

    Example:
        >>> as_tensor(0.1, "reward", torch.float64).item() == 0.1
        True
        >>> as_tensor(0.1, "reward").dtype
        torch.float32
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            raise BatchTypeError(f"field {key_str(key)!r}: object arrays cannot be stored")
        if not value.dtype.isnative:  # the same values in this machine's byte order
            value = value.astype(value.dtype.newbyteorder("="))
        elif not value.flags.writeable or any(s < 0 for s in value.strides):
            value = value.copy()  # torch shares neither (a reversed view: a[::-1])
        try:
            return torch.from_numpy(value)
        except TypeError as exc:  # a dtype torch has no type for (structured, datetime64, longdouble)
            raise BatchTypeError(
                f"field {key_str(key)!r}: cannot store a NumPy array of dtype {value.dtype} "
                "(torch has no dtype for it: store bool, integer or floating values)"
            ) from exc
    if isinstance(value, np.generic):  # before float: np.float64 is a Python float too
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise BatchTypeError(f"field {key_str(key)!r}: cannot make a tensor of {value!r}") from exc
    if isinstance(value, (bool, int, float, list, tuple)):
        return _python_numbers(value, key, dtype)
    raise BatchTypeError(
        f"field {key_str(key)!r}: expected a tensor, array or number, got {type(value).__name__}"
    )


def _python_numbers(value: Any, key: NestedKey, dtype: torch.dtype | None) -> torch.Tensor:
    """Python numbers (or nested lists of them) as a tensor of ``dtype`` (see :func:`as_tensor`)."""
    try:
        exact = np.asarray(value)  # float64 / int64 / bool: every Python value exactly
    except (TypeError, ValueError, OverflowError):
        exact = np.asarray(None)
    if exact.dtype.kind not in "bif":  # ragged, huge ints, strings, tensors inside a list
        try:
            return torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise BatchTypeError(f"field {key_str(key)!r}: cannot make a tensor of {value!r}") from exc
    src = torch.from_numpy(exact)
    if dtype is None:
        dtype = torch.get_default_dtype() if exact.dtype.kind == "f" else src.dtype
    if src.dtype == dtype:
        return src
    if is_safe_cast(src.dtype, dtype):
        try:
            return check_cast(key, src, dtype)  # a finite value that overflows is refused
        except SpecError as exc:
            why = str(exc).split(";")[0]
            raise SpecError(
                f"{why}; a Python number takes its field's dtype: convert or clip it yourself"
            ) from None
    if src.dtype == torch.int64 and _kind_is_int(dtype):
        info = torch.iinfo(dtype)
        if exact.size == 0 or (info.min <= exact.min() and exact.max() <= info.max):
            return src.to(dtype)  # Python ints that fit a narrower int field
    return src  # not convertible: the spec's check refuses it with its usual message


def _kind_is_int(dtype: torch.dtype) -> bool:
    return not (dtype == torch.bool or dtype.is_floating_point or dtype.is_complex)


def is_tensordict(value: Any) -> bool:
    """Whether ``value`` is a TensorDict, without importing tensordict (~1 s of import
    time that ``xpbank ls`` and ``import xpbank.bank`` do not need): an instance
    exists only once its module is imported.

    Example:
        >>> from tensordict import TensorDict
        >>> is_tensordict(TensorDict({}, batch_size=[])), is_tensordict({})
        (True, False)
    """
    td = sys.modules.get("tensordict")
    return td is not None and isinstance(value, td.TensorDictBase)


def _import_tensordict() -> Any:
    import tensordict  # on first use (see is_tensordict); sys.modules has it afterwards

    return tensordict


def flatten(batch: Any, spec: Mapping[NestedKey, Any] | None = None) -> dict[NestedKey, torch.Tensor]:
    """``batch`` as a flat ``{key: tensor}`` dict. Tensors are not copied; Python
    numbers take their field's dtype in ``spec`` exactly (see :func:`as_tensor`).

    Raises:
        BatchTypeError: ``batch`` is not a TensorDict or mapping, or a value is not
            tensor-like.
    """
    if is_tensordict(batch):
        return {
            (k if isinstance(k, str) else normalize_key(k)): v
            for k, v in batch.items(include_nested=True, leaves_only=True)
        }
    if isinstance(batch, Mapping):
        out: dict[NestedKey, torch.Tensor] = {}
        _flatten_mapping(batch, (), out, spec)
        return out
    raise BatchTypeError(
        f"a batch must be a TensorDict or a mapping of tensors/arrays, got {type(batch).__name__}"
    )


def _flatten_mapping(
    batch: Mapping[Any, Any],
    prefix: tuple[str, ...],
    out: dict[NestedKey, torch.Tensor],
    spec: Mapping[NestedKey, Any] | None = None,
) -> None:
    for key, value in batch.items():
        if type(value) is torch.Tensor and type(key) is str and not prefix:  # the common case
            out[key] = value
            continue
        if not prefix and isinstance(key, str):
            full: NestedKey = key
        else:
            full = normalize_key(prefix + (key if isinstance(key, tuple) else (key,)))
        if isinstance(value, torch.Tensor):
            out[full] = value
        elif isinstance(value, Mapping) or is_tensordict(value):
            sub = value if isinstance(value, Mapping) else value.to_dict()
            _flatten_mapping(sub, full if isinstance(full, tuple) else (full,), out, spec)
        else:
            field = spec.get(full) if spec is not None else None
            out[full] = as_tensor(value, full, field.dtype if field is not None else None)


def to_tensordict(
    flat: Mapping[NestedKey, torch.Tensor],
    batch_size: tuple[int, ...] | torch.Size,
    device: torch.device | None = None,
) -> TensorDict:
    """Build a (nested) TensorDict from a flat dict of already-checked tensors.

    The tensors are taken as they are (no copy, no shape check): callers pass tensors
    whose leading dims are ``batch_size``, all on ``device`` (when given).
    """
    size = batch_size if type(batch_size) is torch.Size else torch.Size(batch_size)
    if device is not None and type(device) is not torch.device:
        device = torch.device(device)
    root: dict[str, Any] = {}
    nested = False
    for key, value in flat.items():
        if isinstance(key, str):
            root[key] = value
            continue
        nested = True
        node = root
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = value
    # _new_unsafe skips TensorDict's per-entry checks (~10 us saved per batch); the
    # tensors were checked against the spec already. Public constructor as fallback.
    TensorDict = (sys.modules.get("tensordict") or _import_tensordict()).TensorDict
    new_unsafe = getattr(TensorDict, "_new_unsafe", None)
    if new_unsafe is None:
        return TensorDict(root, batch_size=size, device=device)
    if nested:
        return _assemble(new_unsafe, root, size, device)
    td = new_unsafe(root, batch_size=size)  # as _assemble does, without its walk for nested dicts
    td._device = device
    return td


def flat_tensordict(
    flat: dict[str, torch.Tensor], size: torch.Size, device: torch.device | None
) -> TensorDict:
    """:func:`to_tensordict` of a dict whose keys are all strings, for a caller that
    holds ``size`` as a ``torch.Size`` and ``device`` as a ``torch.device`` already (a
    sample's hot path): no walk of the keys, no conversions. ``flat`` becomes the
    TensorDict's (the caller passes a dict it made for it)."""
    new = _flat_new or _find_flat_new()
    td = new(flat, batch_size=size)
    td._device = device
    return td


# how flat_tensordict makes one: _new_unsafe told not to look for nested dicts where it
# takes that argument (newer tensordicts), found on first use
_flat_new: Any = None


def _find_flat_new() -> Any:
    global _flat_new
    TensorDict = (sys.modules.get("tensordict") or _import_tensordict()).TensorDict
    new_unsafe = getattr(TensorDict, "_new_unsafe", None)
    if new_unsafe is None:
        _flat_new = TensorDict
    elif "nested" in inspect.signature(new_unsafe).parameters:
        _flat_new = functools.partial(new_unsafe, nested=False)
    else:
        _flat_new = new_unsafe
    return _flat_new


def _assemble(
    new_unsafe: Any, node: dict[str, Any], size: torch.Size, device: torch.device | None
) -> TensorDict:
    """A TensorDict of ``node``, nested dicts first, its device set afterwards (the
    tensors are on it already): given a device, ``_new_unsafe`` converts it and asks torch
    about MPS again for every (nested) TensorDict it makes, on each sampled batch."""
    for key, value in node.items():
        if type(value) is dict:
            node[key] = _assemble(new_unsafe, value, size, device)
    td = new_unsafe(node, batch_size=size)
    td._device = device
    return td
