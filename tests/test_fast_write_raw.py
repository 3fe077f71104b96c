"""The write fast path's compiled copy of dense CPU torch tensors (replay/raw_rows.py):
an ``extend`` whose fields are all torch tensors. Every case runs into two buffers, one
with the fast path switched off, and compares results and stored bytes; tensors the copy
must not take (non-contiguous, expanded, negative bit, no storage, a view of the
buffer's own rows) go to the other readers or the full path with the same result. The
same tests run without numba (``XPBANK_NO_NUMBA=1``), where the copy is never planned.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from test_fast_write import assert_same, call, pair
from xpbank import Field, Spec
from xpbank.replay import raw_rows

COMPILED = raw_rows._kernel is not None

DTYPES = {
    "b": torch.bool,
    "u8": torch.uint8,
    "i8": torch.int8,
    "i16": torch.int16,
    "i32": torch.int32,
    "i64": torch.int64,
    "f16": torch.float16,
    "f32": torch.float32,
    "f64": torch.float64,
}


def _values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) < 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=g, dtype=torch.float64) * 1e3
        flat = x.view(-1)
        flat[: min(3, flat.numel())] = torch.tensor([float("nan"), -0.0, float("inf")], dtype=torch.float64)[
            : min(3, flat.numel())
        ]
        return x.to(dtype)
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, shape, generator=g, dtype=torch.int64).to(dtype)
    x.view(-1)[0] = info.max
    return x


def _spec(shape: tuple[int, ...]) -> Spec:
    return Spec({k: Field(shape, d) for k, d in DTYPES.items()})


@pytest.mark.parametrize("shape", [(), (3,), (2, 5)])
@pytest.mark.parametrize("n", [1, 4, 9])
def test_every_stored_dtype_lands_as_the_full_paths_bytes(shape, n):
    fast, slow = pair(20, _spec(shape))
    for i in range(7):  # wraps the ring twice: the wrap goes to the full path
        batch = {k: _values(d, (n, *shape), 10 * i + j) for j, (k, d) in enumerate(DTYPES.items())}
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
    sig = fast.__dict__["_signature"]
    assert (sig.raw is not None) == COMPILED
    assert_same(fast, slow)


def _odd(kind: str, t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a tensor the copy must decline (or may take: ``offset``)."""
    if kind == "strided":  # non-contiguous
        return t.repeat_interleave(2, dim=0)[::2]
    if kind == "offset":  # contiguous with a storage offset: its data_ptr() is the values'
        return torch.cat([t.new_zeros((1, *t.shape[1:])), t])[1:]
    if kind == "expanded":  # stride 0
        return t[:1].expand_as(t)
    if kind == "neg":  # the negative bit: values are -(stored bytes)
        return torch._neg_view(-t)
    if kind == "grad":
        return t.clone().requires_grad_(True) if t.dtype.is_floating_point else t
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["strided", "offset", "expanded", "neg", "grad"])
def test_other_tensors_fall_back_with_the_same_result(kind):
    spec = Spec({"obs": Field((4,)), "action": Field((), torch.int64), "flag": Field((), torch.bool)})
    fast, slow = pair(16, spec)
    rng = np.random.default_rng(0)
    for i in range(6):
        batch = {
            "obs": torch.from_numpy(rng.standard_normal((3, 4)).astype(np.float32)),
            "action": torch.from_numpy(rng.integers(-9, 9, 3)),
            "flag": torch.from_numpy(rng.random(3) < 0.5),
        }
        if i % 2:  # every other call: one field of this kind (after a good call)
            key = "obs" if kind in ("neg", "grad") else ["obs", "action"][i % 4 // 2]
            batch[key] = _odd(kind, batch[key])
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
    assert_same(fast, slow)


def _outcome(rb, batch) -> object:
    """``call``'s result, or the type of any other error (the full path's own)."""
    try:
        return call(rb, "extend", batch)
    except Exception as exc:
        return type(exc).__name__


def test_a_view_of_the_buffers_own_rows_and_a_tensor_without_storage_go_to_the_full_path():
    spec = Spec({"obs": Field((4,))})  # one field: a view of the rows is contiguous
    fast, slow = pair(16, spec)
    for rb in (fast, slow):
        rb.extend({"obs": torch.arange(32, dtype=torch.float32).reshape(8, 4)})
        rb.extend({"obs": torch.ones(4, 4)})
    assert (fast.__dict__["_signature"].raw is not None) == COMPILED
    for rb in (fast, slow):  # rows 10..13 from rows 8..11 (the source overlaps the rows written)
        rows = rb._storage.host_block.views["obs"]
        assert rows[8:12].is_contiguous()
        assert call(rb, "extend", {"obs": rows[8:12]}) == ("ok", [12, 13, 14, 15])
    zero = torch._efficientzerotensor((4, 4))  # no storage: data_ptr() is 0
    assert _outcome(fast, {"obs": zero}) == _outcome(slow, {"obs": zero})
    assert_same(fast, slow)


@pytest.mark.skipif(not COMPILED, reason="numba off: the copy is never planned")
def test_the_copy_moves_words_or_bytes_and_refuses_an_overlap_or_a_null_pointer():
    block = np.zeros((4, 24), np.uint8)
    # fields of 8 (words), 4 (half words) and 3 bytes (bytes), at aligned offsets
    fields = [[0, 8], [8, 4], [12, 3]]
    layout = np.array([*fields, [block.ctypes.data, 24], [4, 0]], np.int64)
    src = [
        torch.arange(2 * s, dtype=torch.int64).to(torch.uint8).reshape(2, s) + 16 * j
        for j, (_, s) in enumerate(fields)
    ]
    kernel = raw_rows._kernel
    assert kernel(layout, 1, 2, tuple(t.data_ptr() for t in src))
    want = np.zeros_like(block)
    for (at, size), t in zip(fields, src, strict=True):
        want[1:3, at : at + size] = t.numpy()
    assert np.array_equal(block, want)
    odd = torch.zeros(17, dtype=torch.uint8)[1:].reshape(2, 8)  # an address not a multiple of 8
    odd.copy_(src[0] + 100)
    assert kernel(layout, 0, 2, (odd.data_ptr(), src[1].data_ptr(), src[2].data_ptr()))
    assert np.array_equal(block[0:2, :8], odd.numpy())
    before = block.copy()
    inside = torch.from_numpy(block)[3, :8].reshape(1, 8)
    assert not kernel(layout, 0, 1, (src[0].data_ptr(), inside.data_ptr(), src[2].data_ptr()))
    assert not kernel(layout, 0, 1, (src[0].data_ptr(), 0, src[2].data_ptr()))
    assert np.array_equal(block, before)


@pytest.mark.parametrize("envs", [None, 4])
def test_a_tensordict_and_a_lockstep_step_match_the_full_path(envs):
    spec = Spec({"obs": Field((3,)), "reward": Field(()), "terminated": Field((), torch.bool)})
    fast, slow = pair(16, spec, **({"num_envs": envs} if envs else {}))
    rng = np.random.default_rng(1)
    for i in range(9):
        t = {
            "obs": torch.from_numpy(rng.standard_normal((4, 3)).astype(np.float32)),
            "reward": torch.from_numpy(rng.standard_normal(4).astype(np.float32)),
            "terminated": torch.from_numpy(rng.random(4) < 0.3),
        }
        batch = TensorDict(t, batch_size=[4]) if i % 3 else t  # a change of mapping: full path
        assert call(fast, "extend", batch) == call(slow, "extend", batch)
        assert_same(fast, slow)
    assert (fast.__dict__["_signature"].raw is not None) == COMPILED


def _layouts() -> dict[str, torch.Tensor]:
    x = torch.arange(32, dtype=torch.float32).reshape(8, 4)
    return {
        "coo": x.to_sparse(),
        "csr": x.to_sparse_csr(),
        "csc": x.to_sparse_csc(),
        "bsr": x.to_sparse_bsr((2, 2)),
        "bsc": x.to_sparse_bsc((2, 2)),
        "mkldnn": x.to_mkldnn(),
        "nested": torch.nested.nested_tensor(list(x)),
        "jagged": torch.nested.nested_tensor(list(x), layout=torch.jagged),
    }


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("layout", list(_layouts()))
def test_a_tensor_of_another_layout_is_never_copied_as_bytes(layout):
    """The copy checks no layout: every non-strided tensor must fail its other checks
    (``shape`` or ``data_ptr()`` raise, or not the plain Tensor type)."""
    odd = _layouts()[layout]
    if type(odd) is torch.Tensor:
        with pytest.raises(RuntimeError):
            (odd.shape, odd.data_ptr())
    spec = Spec({"obs": Field((4,))})
    fast, slow = pair(16, spec)
    for rb in (fast, slow):
        rb.extend({"obs": torch.ones(8, 4)})
        rb.extend({"obs": torch.zeros(8, 4)})
    sig = fast.__dict__["_signature"]
    if COMPILED:
        assert sig.raw[2]({"obs": odd}) is None
    assert _outcome(fast, {"obs": odd}) == _outcome(slow, {"obs": odd})
    assert_same(fast, slow)
