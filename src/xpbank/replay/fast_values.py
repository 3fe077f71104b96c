"""How the write fast path reads a batch's values: one function per signature, its checks
written out field by field (:mod:`xpbank.replay.fast_write` keeps the signature).

A signature's ``entries`` say, per field in record order, which kind of value came when
the signature was made (the kinds below) and what it must be again: ``(key, kind, want,
shape, bound)``. :func:`reader` turns them into ``read(src) -> values or None`` (``src``:
the batch's own dict). A loop over the entries that branches on each kind costs
~0.1 µs a field more (a tuple unpacked, the kind compared, an append), a sixth of an
``add`` of six fields, so the reader is made once per signature as one function whose
text holds each field's checks in a row. Only names appear in the text (``k0``, ``w0``,
...): keys, dtypes, shapes and bounds are the function's globals, never text, so a key
is never code.

Each field is read as the loop would read it, in the same order of checks: a value of
another type, dtype or shape, a tensor on a device other than CPU or CUDA, a number
outside its bound (NaN included) returns ``None`` (the full path takes the batch); a
torch tensor's ``tolist()`` / ``numpy()`` that raises (sparse, mkldnn, meta, nested,
requires grad) too. Nothing here raises for bad input.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import CodeType
from typing import Any

import numpy as np
import torch

__all__ = ["ARRAY", "ARRAY_NARROW", "BOUNDED", "NUMBER", "TENSOR", "TENSOR0", "TENSOR_LIST", "made", "reader"]

# how a field's value is taken (the kind of the value seen when the signature was made)
ARRAY = 0  # np.ndarray of the field's dtype and the batch's shape: stored as it is
TENSOR0 = 1  # a 0-d torch tensor of the field's dtype: its .tolist(), a number (exact)
TENSOR_LIST = 2  # a small 1-d torch tensor of the field's dtype and shape: its .tolist()
TENSOR = 3  # a CPU torch tensor of the field's dtype and shape: its NumPy view
NUMBER = 4  # a Python / NumPy scalar of one type, stored as it is (exact)
BOUNDED = 5  # a Python / NumPy scalar stored only within +-bound (exact / finite there)
ARRAY_NARROW = 6  # a float64 array into a float32 field, within +-bound

_TOLIST = """\
    if type(v{i}) is not tensor or v{i}.dtype is not w{i} or not (v{i}.is_cpu or v{i}.is_cuda):
        return None
    try:  # raise: a nested tensor's shape, tolist() of a sparse, mkldnn or meta tensor
{shape}        v{i} = v{i}.tolist()  # ~0.2 µs; .numpy() is ~0.55 µs, .item() + .dim() ~0.25
    except (RuntimeError, TypeError, NotImplementedError):
        return None
"""

# each kind's checks of field i's value v{i} against w{i} (want), s{i} (shape), b{i} (bound)
_CHECKS = {
    ARRAY: """\
    if type(v{i}) is not ndarray or v{i}.shape != s{i} or ((d := v{i}.dtype) is not w{i} and d != w{i}):
        return None
""",
    TENSOR0: _TOLIST.replace("{shape}", "")
    + """\
    if type(v{i}) is list:  # not 0-d
        return None
""",
    TENSOR_LIST: _TOLIST.replace("{shape}", "        if v{i}.shape != s{i}:\n            return None\n"),
    TENSOR: """\
    if type(v{i}) is not tensor or v{i}.dtype is not w{i}:
        return None
    try:  # a dense CPU tensor without grad: a view (raises for any other)
        v{i} = v{i}.numpy()
    except (RuntimeError, TypeError):
        return None
    if v{i}.shape != s{i}:
        return None
""",
    NUMBER: """\
    if type(v{i}) is not w{i}:
        return None
""",
    BOUNDED: """\
    if type(v{i}) is not w{i} or not -b{i} <= v{i} <= b{i}:
        return None
""",
    ARRAY_NARROW: """\
    if type(v{i}) is not ndarray or v{i}.dtype != w{i} or v{i}.shape != s{i}:
        return None
    if v{i}.size and not np_abs(v{i}).max() <= b{i}:  # NaN fails too: the full path takes it
        return None
""",
}


def reader(entries: list[tuple[Any, ...]]) -> Callable[[Any], list[Any] | None]:
    """``read(src)``: the values of ``src`` (a batch's own dict) to store, in the order
    of ``entries``, or ``None``: a value does not match its entry."""
    names: dict[str, Any] = {"ndarray": np.ndarray, "tensor": torch.Tensor, "np_abs": np.abs}
    body = []
    for i, (key, kind, want, shape, bound) in enumerate(entries):
        names.update({f"k{i}": key, f"w{i}": want, f"s{i}": shape, f"b{i}": bound})
        body.append(f"    v{i} = get(k{i})\n" + _CHECKS[kind].replace("{i}", str(i)))
    values = "".join(f"v{i}, " for i in range(len(entries)))
    text = "def read(src):\n    get = src.get\n" + "".join(body) + f"    return [{values}]\n"
    return made(text, f"<fast_values.reader of {len(entries)} fields>", "read", names)


@functools.lru_cache(maxsize=256)
def _code(text: str, filename: str) -> CodeType:
    return compile(text, filename, "exec")


def made(text: str, filename: str, name: str, names: dict[str, Any]) -> Any:
    """The function ``name`` that ``text`` defines, its globals ``names``. The text holds
    no keys (only names and the kinds' checks), so a signature made again (a buffer
    whose batches the fast path declines every call re-keys every call: a CUDA tensor of
    more than 8 values) reuses the compiled code: a compile is ~0.3 ms, an exec of its
    code ~2 µs. The function is taken out of its globals: a function kept there is a
    reference cycle, freed only by the cycle collector (never, where a loop turned it off)."""
    exec(_code(text, filename), names)
    return names.pop(name)
