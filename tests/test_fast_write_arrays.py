"""The write fast path's compiled copy of NumPy arrays (replay/raw_rows.py ``copy_arrays``):
an ``extend`` whose fields are all NumPy arrays of their fields' dtypes (a gymnasium
vector env's step). Every case runs into two buffers, one with the fast path switched
off, and compares results and stored bytes; arrays the copy must not take
(non-contiguous, Fortran order, reversed, broadcast, a view of the buffer's own rows)
go to the NumPy stores or the full path with the same result. The same tests run
without numba (``XPBANK_NO_NUMBA=1``), where the copy is never planned.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_fast_write import assert_same, call, pair
from xpbank import BatchTypeError, Field, ReplayBuffer, Spec
from xpbank.replay import raw_rows

COMPILED = raw_rows._array_kernel is not None

DTYPES = {
    "b": (torch.bool, np.bool_),
    "u8": (torch.uint8, np.uint8),
    "i8": (torch.int8, np.int8),
    "i16": (torch.int16, np.int16),
    "i32": (torch.int32, np.int32),
    "i64": (torch.int64, np.int64),
    "f16": (torch.float16, np.float16),
    "f32": (torch.float32, np.float32),
    "f64": (torch.float64, np.float64),
}


def _values(dtype: type, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype is np.bool_:
        return rng.random(shape) < 0.5
    if np.issubdtype(dtype, np.floating):
        x = (rng.standard_normal(shape) * 1e3).astype(dtype)
        flat = x.reshape(-1)
        flat[: min(3, flat.size)] = np.array([np.nan, -0.0, np.inf], dtype)[: min(3, flat.size)]
        return x
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max, shape, dtype=np.int64, endpoint=True).astype(dtype)
    x.reshape(-1)[0] = info.max
    return x


def _spec(shape: tuple[int, ...]) -> Spec:
    return Spec({k: Field(shape, t) for k, (t, _) in DTYPES.items()})


@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
@pytest.mark.parametrize("n", [1, 4, 9])
def test_every_stored_dtype_lands_as_the_full_paths_bytes(shape, n):
    fast, slow = pair(20, _spec(shape))
    rng = np.random.default_rng(n)
    for _ in range(7):  # wraps the ring twice: the wrap goes to the full path
        batch = {k: _values(d, (n, *shape), rng) for k, (_, d) in DTYPES.items()}
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
        assert_same(fast, slow)
    sig = fast.__dict__["_signature"]
    assert (sig.arrays is not None) == COMPILED
    assert sig.raw is None  # not the torch copy's


def _odd(kind: str, a: np.ndarray) -> np.ndarray:
    """``a``'s values in an array the copy must decline (or may take: ``readonly``)."""
    if kind == "strided":  # every other row of a larger array
        return np.repeat(a, 2, axis=0)[::2]
    if kind == "fortran":
        return np.asfortranarray(a)
    if kind == "reversed":  # negative strides
        return a[::-1].copy()[::-1]
    if kind == "broadcast":  # stride 0, read-only
        return np.broadcast_to(a[:1], a.shape)
    if kind == "readonly":  # C-contiguous, not writeable: the copy reads it as any other
        b = a.copy()
        b.flags.writeable = False
        return b
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["strided", "fortran", "reversed", "broadcast", "readonly"])
def test_other_arrays_fall_back_with_the_same_result(kind):
    spec = Spec({"obs": Field((4,)), "action": Field((), torch.int64), "flag": Field((), torch.bool)})
    fast, slow = pair(16, spec)
    rng = np.random.default_rng(0)
    for i in range(8):
        batch = {
            "obs": rng.standard_normal((3, 4)).astype(np.float32),
            "action": rng.integers(-9, 9, 3),
            "flag": rng.random(3) < 0.5,
        }
        if i % 2:  # every other call: one field of this kind (after a good call)
            key = ["obs", "action"][i % 4 // 2]
            batch[key] = _odd(kind, batch[key])
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
        assert_same(fast, slow)


def test_a_view_of_the_buffers_own_rows_and_other_dtypes_go_elsewhere():
    spec = Spec({"obs": Field((4,))})  # one field: a view of the rows is contiguous
    fast, slow = pair(16, spec)
    for rb in (fast, slow):
        rb.extend({"obs": np.arange(32, dtype=np.float32).reshape(8, 4)})
        rb.extend({"obs": np.ones((4, 4), np.float32)})
    assert (fast.__dict__["_signature"].arrays is not None) == COMPILED
    for rb in (fast, slow):  # rows 10..13 from rows 8..11 (the source overlaps the rows written)
        rows = rb._storage.host_block.np_views["obs"]
        assert rows[8:12].flags.c_contiguous
        assert call(rb, "extend", {"obs": rows[8:12]}) == ("ok", [12, 13, 14, 15])
    assert_same(fast, slow)
    # another dtype of the same item size (int32 for float32), the other byte order:
    # never copied as bytes (the signature's check sends them to the full path)
    for odd in (np.arange(16, dtype=np.int32).reshape(4, 4), np.ones((4, 4), ">f4")):
        outcome = call(fast, "extend", {"obs": odd})
        assert outcome == call(slow, "extend", {"obs": odd})
        assert_same(fast, slow)


@pytest.mark.parametrize("envs", [None, 4])
def test_a_lockstep_step_matches_the_full_path(envs):
    spec = Spec({"obs": Field((3,)), "reward": Field(()), "terminated": Field((), torch.bool)})
    fast, slow = pair(16, spec, **({"num_envs": envs} if envs else {}))
    rng = np.random.default_rng(1)
    for _ in range(9):
        batch = {
            "obs": rng.standard_normal((4, 3)).astype(np.float32),
            "reward": rng.standard_normal(4).astype(np.float32),
            "terminated": rng.random(4) < 0.3,
        }
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
        assert_same(fast, slow)
    assert (fast.__dict__["_signature"].arrays is not None) == COMPILED


@pytest.mark.skipif(not COMPILED, reason="numba off: the copy is never planned")
def test_the_array_copy_moves_words_or_bytes_and_refuses_what_it_cannot_take():
    block = np.zeros((4, 24), np.uint8)
    # fields of 8 (words), 4 (half words) and 3 bytes (bytes), at aligned offsets
    fields = [[0, 8], [8, 4], [12, 3]]
    layout = np.array([*fields, [block.ctypes.data, 24], [4, 0]], np.int64)
    src = (
        np.array([[1, -2]], np.int64).T.copy(),  # [2, 1] int64: 8 bytes a row
        np.array([1.5, -0.0], np.float32),  # [2] float32
        np.arange(6, dtype=np.uint8).reshape(2, 3) + 200,  # [2, 3] uint8
    )
    entries = [(k, 0, a.dtype, a.shape) for k, a in zip("abc", src, strict=True)]
    plan = raw_rows.plan_arrays(_Block(block, fields), entries, 0)
    assert plan is not None
    copy, planned = plan
    assert np.array_equal(planned, layout)
    assert copy(layout, 1, 2, src)
    want = np.zeros_like(block)
    for (at, size), a in zip(fields, src, strict=True):
        want[1:3, at : at + size] = a.reshape(2, -1).view(np.uint8)
    assert np.array_equal(block, want)
    before = block.copy()
    inside = block[3, :8].view(np.int64).reshape(1, 1)  # a view of the block's own bytes
    strided = np.zeros(4, np.float32)[::2]
    gaps = np.zeros((1, 6), np.uint8)[:, ::2]  # one row, its bytes 2 apart
    for bad in ((inside, src[1][:1], src[2][:1]), (src[0][:1], src[1][:1], gaps)):
        assert not copy(layout, 0, 1, bad)
    assert not copy(layout, 0, 2, (src[0], strided, src[2]))
    assert np.array_equal(block, before)


class _Block:
    """What plan_arrays reads of a storage's block: its bytes and where each field lies."""

    def __init__(self, data: np.ndarray, fields: list[list[int]]):
        self.np_data = data
        self.members = [_Member(k, at, size) for k, (at, size) in zip("abc", fields, strict=True)]


class _Member:
    def __init__(self, key: str, start: int, nbytes: int):
        self.key, self.start, self.nbytes = key, start, nbytes


def test_a_reversed_or_byte_swapped_array_is_stored_by_value():
    """Torch shares neither a negative stride nor the other byte order: the full path
    copies them (it raised torch's ValueError before), the fast path stores them alike."""
    a = np.arange(8, dtype=np.float32).reshape(2, 4) - 3.5
    for rb in pair(16, Spec({"obs": Field((4,))})):
        rb.extend({"obs": a})  # the fast path's signature
        for odd in (a[::-1], a[:, ::-1], a.astype(">f4"), a[::-1].astype(">f4")):
            ids = rb.extend({"obs": odd})
            stored = rb.sample_all()
            got = stored["obs"][torch.as_tensor(list(ids)) - int(stored["index"][0])]
            assert np.array_equal(got.numpy(), odd)


@pytest.mark.parametrize("dtype", ["V4", "datetime64[s]", np.longdouble, [("a", "<f4")]])
def test_an_array_of_a_dtype_torch_cannot_hold_is_a_clear_error_and_writes_nothing(dtype):
    fast, slow = pair(8, Spec({"obs": Field((4,))}))
    for rb in (fast, slow):  # after a good batch: the fast path has its signature
        rb.extend({"obs": np.ones((2, 4), np.float32)})
    for rb in (fast, slow, ReplayBuffer(8)):  # the last one lays out on its first write
        before = len(rb)
        with pytest.raises(BatchTypeError, match=r"field 'obs': cannot store a NumPy array of dtype"):
            rb.extend({"obs": np.zeros((2, 4), dtype)})
        assert len(rb) == before
