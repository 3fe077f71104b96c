"""The compiled copy of dense CPU torch tensors for an ``add`` (replay/raw_rows.py): one
transition of 0-d / 1-d tensors, as a dict or a TensorDict. Every case runs into two
buffers, one with the fast path switched off, and compares results and stored bytes;
tensors the copy must not take (non-contiguous, negative bit, another layout, no storage,
a view of the buffer's own rows, the wrong dtype or shape) go to the other readers or the
full path with the same result or error. The same tests run without numba
(``XPBANK_NO_NUMBA=1``), where the copy is never planned.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from test_fast_write import SPEC as FW_SPEC
from test_fast_write import assert_same, call, item, pair
from test_fast_write_raw import COMPILED, DTYPES, _spec, _values
from xpbank import Field, NStep, Spec


@pytest.mark.parametrize("shape", [(), (1,), (3,), (8,), (2, 5)])
@pytest.mark.parametrize("mapping", ["dict", "tensordict"])
def test_every_stored_dtype_lands_as_the_full_paths_bytes(shape, mapping):
    fast, slow = pair(5, _spec(shape))
    for i in range(12):  # wraps the ring twice: the wrap goes to the full path
        t = {k: _values(d, shape, 10 * i + j) for j, (k, d) in enumerate(DTYPES.items())}
        item = TensorDict(t, batch_size=[]) if mapping == "tensordict" else t
        assert call(fast, "add", item) == call(slow, "add", item)
        assert_same(fast, slow)
    sig = fast.__dict__["_signature"]
    assert (sig.raw is not None) == COMPILED
    if COMPILED:  # the add was copied as bytes, not read by tolist()
        t = {k: _values(d, shape, 999 + j) for j, (k, d) in enumerate(DTYPES.items())}
        assert sig.raw[2](t) is not None


SPEC = Spec(
    {
        "obs": Field((4,)),
        "action": Field((), torch.int64),
        "reward": Field(()),
        "flag": Field((), torch.bool),
        "one": Field((1,), torch.int32),
    }
)


def _item(i: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return {
        "obs": torch.randn(4, generator=g),
        "action": torch.randint(-9, 9, (), generator=g),
        "reward": torch.randn((), generator=g),
        "flag": torch.rand((), generator=g) < 0.5,
        "one": torch.randint(-9, 9, (1,), generator=g, dtype=torch.int32),
    }


def _odd(kind: str, key: str, t: torch.Tensor) -> torch.Tensor:
    """``t``'s values in a tensor the copy must decline, or an input the full path refuses."""
    if kind == "strided":  # non-contiguous (a tensor of one value is contiguous anyway)
        return t.repeat_interleave(2)[::2] if t.dim() else t
    if kind == "offset":  # contiguous with a storage offset: the copy takes it
        return torch.cat([t.reshape(-1).new_zeros(3), t.reshape(-1)])[3:].reshape(t.shape)
    if kind == "expanded":  # stride 0 (one value: contiguous)
        return t.reshape(-1)[:1].expand(t.shape) if t.dim() else t
    if kind == "neg":  # the negative bit: values are -(stored bytes)
        return torch._neg_view(-t) if t.dtype != torch.bool else t
    if kind == "grad":
        return t.clone().requires_grad_(True) if t.dtype.is_floating_point else t
    if kind == "dtype":
        return t.to(torch.float64) if t.dtype != torch.float64 else t.to(torch.float32)
    if kind == "shape":
        return t.reshape(1, *t.shape) if key != "obs" else t[:3]
    if kind == "no storage":  # data_ptr() is 0
        return torch._efficientzerotensor(t.shape, dtype=t.dtype)
    if kind == "meta":
        return t.to("meta")
    if kind == "sparse":
        return t.to_sparse()
    if kind == "mkldnn":
        return t.to_mkldnn() if t.dim() and t.dtype == torch.float32 else t.to_sparse()
    raise AssertionError(kind)


KINDS = [
    "strided",
    "offset",
    "expanded",
    "neg",
    "grad",
    "dtype",
    "shape",
    "no storage",
    "meta",
    "sparse",
    "mkldnn",
]


def _outcome(rb, method, batch) -> object:
    """``call``'s result, or the type of any other error (the full path's own)."""
    try:
        return call(rb, method, batch)
    except Exception as exc:
        return type(exc).__name__


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("key", list(SPEC.keys()))
def test_other_tensors_fall_back_with_the_same_result(kind, key):
    fast, slow = pair(16, SPEC)
    for i in range(7):  # the last one good: the signature is keyed on it
        item = _item(i)
        if i % 2:  # every other call: one field of this kind (after a good call)
            item[key] = _odd(kind, key, item[key])
        assert _outcome(fast, "add", item) == _outcome(slow, "add", item)
        assert_same(fast, slow)
    assert (fast.__dict__["_signature"].raw is not None) == COMPILED


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_a_nested_tensor_or_a_view_of_the_buffers_own_row_goes_to_the_full_path():
    fast, slow = pair(16, Spec({"obs": Field((4,)), "reward": Field(())}))
    for rb in (fast, slow):
        for i in range(3):
            rb.add({"obs": torch.full((4,), float(i)), "reward": torch.tensor(float(i))})
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(2)])
    for odd in ({"reward": nested}, {"obs": nested}):
        item = {"obs": torch.ones(4), "reward": torch.tensor(1.0), **odd}
        assert _outcome(fast, "add", item) == _outcome(slow, "add", item)
    for rb in (fast, slow):  # a view of the rows themselves (the copy refuses an overlap)
        rows = rb._storage.host_block.views
        item = {"obs": rows["obs"][1], "reward": rows["reward"][2]}
        assert call(rb, "add", item) == ("ok", 3)
    assert_same(fast, slow)


def test_a_change_of_signature_is_keyed_anew():
    fast, slow = pair(8, SPEC)
    items = [_item(i) for i in range(4)]
    items[2] = {k: v.numpy() if v.dim() else v for k, v in items[2].items()}  # arrays for 1-d fields
    for it in items:
        assert call(fast, "add", it) == call(slow, "add", it)
    assert_same(fast, slow)
    assert (fast.__dict__["_signature"].raw is not None) == COMPILED


@pytest.mark.parametrize("kind", ["torch", "td"])
@pytest.mark.parametrize("nstep", [False, True])
def test_an_add_with_an_episode_index_matches_the_full_path(kind, nstep):
    """One lockstep step of one env: the rows copied, then the index reads the ends."""
    kw = {"num_envs": 1, **({"nstep": lambda: NStep(3, 0.9)} if nstep else {})}
    fast, slow = pair(12, FW_SPEC, **kw)
    rng = np.random.default_rng(3)
    for _ in range(30):  # episode ends, and wraps of the ring
        it = item(rng, kind, end=0.3)
        assert call(fast, "add", it) == call(slow, "add", it)
        assert_same(fast, slow)
    sig = fast.__dict__["_signature"]
    assert (sig.raw is not None) == COMPILED  # no numba: no compiled step, the index plans


def test_keys_are_never_code_in_the_generated_checks():
    """raw_rows.checker writes its checks out as Python text: a field whose key reads as
    code (quotes, a newline, a call) is a name's value there, never text; it is written
    as the full path writes it, and nothing runs."""
    odd = ["a'); raise SystemExit('ran'); ('", 'b"\nimport os', "c{__import__('os')}"]
    spec = Spec({k: Field((2,)) for k in odd} | {"n": Field(())})
    fast, slow = pair(8, spec)
    for i in range(5):
        t = {k: torch.full((2,), float(i + j)) for j, k in enumerate(odd)} | {"n": torch.tensor(float(i))}
        assert call(fast, "add", t) == call(slow, "add", t)
        assert_same(fast, slow)
    sig = fast.__dict__["_signature"]
    if COMPILED:
        assert sig.raw[2](t) is not None  # the checks took the odd keys' tensors
        assert sig.raw[2]({k: v for k, v in t.items() if k != odd[0]} | {"x": t[odd[0]]}) is None
