"""The pickle-free state codec: nested structures, tensors of several dtypes, bad input."""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch

from xpbank import BankError, CorruptBankError
from xpbank.bank.codec import decode, encode


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


def test_round_trip_nested_structure_with_every_dtype() -> None:
    state = {
        "version": 1,
        "ring": {"capacity": 10, "next_id": 13, "size": 10},
        "generator": torch.Generator().manual_seed(3).get_state(),
        "sampler": {
            "tree": np.arange(15, dtype=np.float64) / 7,
            "min_tree": np.full(7, np.inf, dtype=np.float32),
            "alpha": 0.6,
            "levels": [np.arange(3, dtype=np.int32), None, (1, "two", 3.5)],
        },
        "tensors": [
            torch.arange(6, dtype=torch.int64).reshape(2, 3),
            torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
            torch.tensor([True, False]),
            torch.tensor(7, dtype=torch.int8),
            torch.zeros(0, 4, dtype=torch.float16),
            torch.arange(4.0)[::2],  # non-contiguous
        ],
        "flags": {"empty": {}, "none": None, "yes": True, "text": "é"},
    }
    tree, arrays = encode(state)
    tree = json.loads(json.dumps(tree))  # what the manifest holds
    decoded = decode(tree, arrays)
    assert _same(decoded, {**state, "tensors": [t.contiguous() for t in state["tensors"]]})
    assert len(arrays) == 10
    assert all(isinstance(a, np.ndarray) and not a.dtype.hasobject for a in arrays)


def test_decoded_tensors_do_not_alias_the_arrays() -> None:
    tree, arrays = encode({"t": torch.zeros(3)})
    out = decode(tree, arrays)["t"]
    out += 1
    assert arrays[0].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"f": lambda: 0}, r"state\.f: a function cannot be stored"),
        ({1: 2}, r"key 1 cannot be stored"),
        ({"__array__": 0}, r"key '__array__' cannot be stored"),
        ({"o": np.array([object()], dtype=object)}, r"state\.o: object arrays"),
        ({"s": {1, 2}}, r"a set cannot be stored"),
    ],
)
def test_encode_refuses_what_it_cannot_store(value: object, match: str) -> None:
    with pytest.raises(BankError, match=match):
        encode(value)


@pytest.mark.parametrize(
    ("tree", "match"),
    [
        (
            {"a": {"__array__": 5, "kind": "torch", "dtype": "uint8", "shape": [3]}},
            r"state\.a: malformed array",
        ),
        ({"a": {"__array__": 0, "kind": "pickle", "dtype": "uint8", "shape": [3]}}, r"malformed array"),
        ({"a": {"__array__": 0, "kind": "torch", "dtype": "uint8", "shape": [4]}}, r"has shape \(3,\)"),
        ({"a": {"__array__": 0, "kind": "torch", "dtype": "float32", "shape": [3]}}, r"does not hold torch"),
        (
            {"a": {"__array__": 0, "kind": "torch", "dtype": "os.system", "shape": [3]}},
            r"does not hold torch",
        ),
        ({"a": {"__array__": 0, "kind": "numpy", "dtype": "<f8", "shape": [3]}}, r"manifest says <f8"),
        ({"a": {"__tuple__": 3}}, r"state\.a: malformed tuple"),
        ({"a": {"__array__": True, "kind": "torch", "dtype": "uint8", "shape": [3]}}, r"malformed array"),
    ],
)
def test_decode_checks_every_reference(tree: object, match: str) -> None:
    with pytest.raises(CorruptBankError, match=match):
        decode(tree, [np.zeros(3, np.uint8)])


def test_both_checksum_algorithms_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Banks written with xxh3_64 (xxhash installed) and with CRC-32 (without it) load and
    detect damage; reading an xxh3 bank without xxhash names the extra to install."""
    import xpbank
    import xpbank.bank.checksum as checksum

    rb = xpbank.ReplayBuffer(8, seed=0)
    rb.extend({"x": torch.arange(5.0)})
    fast = xpbank.save(rb, tmp_path / "fast")
    assert json.loads((fast / "manifest.json").read_text())["data"][0]["checksum"]["algorithm"] == "xxh3_64"
    monkeypatch.setattr(checksum, "new_hasher", checksum._Crc32)
    slow = xpbank.save(rb, tmp_path / "slow")
    entry = json.loads((slow / "manifest.json").read_text())["data"][0]["checksum"]
    assert entry == {"algorithm": "crc32", "bytes": 20, "value": zlib.crc32(np.arange(5.0, dtype=np.float32))}
    for path in (fast, slow):
        assert xpbank.load(path).sample_all()["x"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        raw = bytearray((path / "data" / "x.npy").read_bytes())
        raw[-8 * 4 + 1] ^= 1  # inside row 0
        (path / "data" / "x.npy").write_bytes(bytes(raw))
        with pytest.raises(CorruptBankError, match="checksum mismatch"):
            xpbank.load(path)
    monkeypatch.setitem(sys.modules, "xxhash", None)  # not installed
    with pytest.raises(xpbank.MissingExtraError, match=r"install -e '\.\[bank\]'.*'xpbank\[bank\]'"):
        xpbank.load(fast)
