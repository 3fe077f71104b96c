"""batch.flatten / as_tensor / to_tensordict: what users pass in, as flat dicts and back."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from xpbank import BatchTypeError, Field, ReplayBuffer, Spec, SpecError, XpbankError
from xpbank.spec.batch import as_tensor, flatten, to_tensordict

# -- flatten ----------------------------------------------------------------------


def test_flatten_nested_tensordict():
    obs, nobs, done = torch.randn(4, 3), torch.randn(4, 3), torch.zeros(4, dtype=torch.bool)
    td = TensorDict({"obs": obs, "next": {"obs": nobs, "info": {"done": done}}}, batch_size=[4])
    flat = flatten(td)
    assert set(flat) == {"obs", ("next", "obs"), ("next", "info", "done")}
    assert flat["obs"].data_ptr() == obs.data_ptr()  # not copied
    assert flat[("next", "obs")].data_ptr() == nobs.data_ptr()
    assert torch.equal(flat[("next", "info", "done")], done)


def test_flatten_nested_dict_and_tuple_keys_agree():
    obs, nobs, r = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2)
    nested = flatten({"obs": obs, "next": {"obs": nobs, "reward": r}})
    tupled = flatten({"obs": obs, ("next", "obs"): nobs, ("next", "reward"): r})
    one_tuple = flatten({("obs",): obs, "next": {("obs",): nobs}, ("next", "reward"): r})
    assert list(nested) == ["obs", ("next", "obs"), ("next", "reward")]
    for flat in (nested, tupled, one_tuple):
        assert set(flat) == {"obs", ("next", "obs"), ("next", "reward")}
        assert flat["obs"] is obs
        assert flat[("next", "obs")] is nobs
        assert flat[("next", "reward")] is r


def test_flatten_tuple_key_under_a_nested_dict():
    x = torch.zeros(2)
    assert list(flatten({"a": {("b", "c"): x}})) == [("a", "b", "c")]
    assert list(flatten({("a", "b"): {"c": x}})) == [("a", "b", "c")]


def test_flatten_tensordict_inside_a_dict():
    td = TensorDict({"obs": torch.zeros(2, 3), "deep": {"x": torch.ones(2)}}, batch_size=[2])
    flat = flatten({"next": td, "reward": torch.zeros(2)})
    assert set(flat) == {("next", "obs"), ("next", "deep", "x"), "reward"}
    assert torch.equal(flat[("next", "deep", "x")], torch.ones(2))


def test_flatten_numpy_shares_memory_when_writeable():
    arr = np.arange(6, dtype=np.float32).reshape(2, 3)
    flat = flatten({"obs": arr})
    assert flat["obs"].dtype == torch.float32
    assert flat["obs"].shape == (2, 3)
    arr[0, 0] = 42.0
    assert flat["obs"][0, 0].item() == 42.0  # a view of the array, not a copy


def test_flatten_numpy_read_only_is_copied():
    arr = np.arange(6, dtype=np.int64)
    arr.flags.writeable = False
    flat = flatten({"x": arr})
    assert torch.equal(flat["x"], torch.arange(6))
    flat["x"][0] = 99  # writing to the tensor must not touch (or fail on) the read-only array
    assert arr[0] == 0


@pytest.mark.parametrize(
    ("value", "dtype", "expected"),
    [
        (1.5, torch.float32, 1.5),
        (3, torch.int64, 3),
        (True, torch.bool, True),
        (np.float64(2.0), torch.float64, 2.0),
        (np.int8(-4), torch.int8, -4),
        (np.bool_(False), torch.bool, False),
    ],
)
def test_flatten_python_and_numpy_scalars(value, dtype, expected):
    flat = flatten({"x": value})
    assert flat["x"].dtype == dtype
    assert flat["x"].shape == ()
    assert flat["x"].item() == expected


def test_flatten_lists():
    flat = flatten({"x": [[1, 2], [3, 4]], "y": (0.5, 1.5)})
    assert torch.equal(flat["x"], torch.tensor([[1, 2], [3, 4]]))
    assert torch.equal(flat["y"], torch.tensor([0.5, 1.5]))


@pytest.mark.parametrize("batch", [[torch.zeros(2)], torch.zeros(2), "obs", None, 3, np.zeros(3)])
def test_flatten_non_mapping_is_a_batch_type_error(batch):
    with pytest.raises(
        BatchTypeError,
        match=f"^a batch must be a TensorDict or a mapping of tensors/arrays, got {type(batch).__name__}$",
    ):
        flatten(batch)


def test_batch_type_error_is_a_type_error():
    with pytest.raises(TypeError):
        flatten([1, 2])
    err = BatchTypeError("x")
    assert isinstance(err, XpbankError)
    assert not isinstance(err, ValueError)


def test_flatten_rejects_object_arrays():
    arr = np.array([object(), 1], dtype=object)
    with pytest.raises(BatchTypeError, match=r"^field 'next.info': object arrays cannot be stored$"):
        flatten({"next": {"info": arr}})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("left", r"^field 'x': expected a tensor, array or number, got str$"),
        (None, r"^field 'x': expected a tensor, array or number, got NoneType$"),
        ({1, 2}, r"^field 'x': expected a tensor, array or number, got set$"),
        ([[1], [1, 2]], r"^field 'x': cannot make a tensor of \[\[1\], \[1, 2\]\]$"),
        (["a", "b"], r"^field 'x': cannot make a tensor of \['a', 'b'\]$"),
    ],
)
def test_flatten_rejects_values_that_are_not_tensor_like(value, message):
    with pytest.raises(BatchTypeError, match=message):
        flatten({"x": value})


def test_flatten_rejects_bad_nested_keys():
    with pytest.raises(SpecError, match="a key must be a str or a non-empty tuple of str"):
        flatten({("a", 1): torch.zeros(2)})
    with pytest.raises(SpecError, match="a key must be a str or a non-empty tuple of str"):
        flatten({(): torch.zeros(2)})


def test_as_tensor_keeps_tensors():
    t = torch.zeros(3)
    assert as_tensor(t, "x") is t


# -- to_tensordict ----------------------------------------------------------------


def test_to_tensordict_builds_nested_tensordict():
    obs, nobs, done = torch.randn(5, 3), torch.randn(5, 3), torch.ones(5, dtype=torch.bool)
    td = to_tensordict({"obs": obs, ("next", "obs"): nobs, ("next", "info", "done"): done}, (5,))
    assert isinstance(td, TensorDict)
    assert td.batch_size == torch.Size([5])
    assert isinstance(td["next"], TensorDict)
    assert td["next"].batch_size == torch.Size([5])
    assert td["next", "info"].batch_size == torch.Size([5])
    assert td["obs"].data_ptr() == obs.data_ptr()  # taken as is, no copy
    assert torch.equal(td["next", "obs"], nobs)
    assert torch.equal(td["next", "info", "done"], done)
    assert set(flatten(td)) == {"obs", ("next", "obs"), ("next", "info", "done")}


def test_to_tensordict_device_and_empty():
    td = to_tensordict({"x": torch.zeros(2, 3)}, torch.Size([2]), torch.device("cpu"))
    assert td.device == torch.device("cpu")
    assert td.batch_size == (2,)
    empty = to_tensordict({}, (0,))
    assert empty.batch_size == (0,)
    assert len(list(empty.keys())) == 0


def test_flatten_and_to_tensordict_round_trip():
    flat = {"a": torch.arange(4), ("b", "c"): torch.zeros(4, 2), ("b", "d", "e"): torch.ones(4)}
    back = flatten(to_tensordict(flat, (4,)))
    assert set(back) == set(flat)
    for key, value in flat.items():
        assert back[key] is value or back[key].data_ptr() == value.data_ptr()


@pytest.mark.parametrize("cast", [True, False])
def test_python_numbers_take_their_fields_dtype_exactly(cast):
    """A Python number has no dtype: it becomes the field's dtype from its exact value
    (never through float32 first), whatever ``cast`` says; an overflow is refused."""
    spec = Spec(
        {
            "r64": Field((), torch.float64),
            "r32": Field((), torch.float32),
            "a": Field((2,), torch.int32),
            "big": Field((), torch.int64),
        }
    )
    rb = ReplayBuffer(8, spec, cast=cast)
    for _ in range(2):  # the second add may take the fast path: the same result
        rb.add({"r64": 0.1, "r32": 0.1, "a": [1, -2], "big": 2**62 + 1})
    got = rb.sample_all()
    assert got["r64"].tolist() == [0.1, 0.1]  # exact: 0.1 as float64, not float32's 0.1
    assert got["r32"].tolist() == [np.float32(0.1).item()] * 2
    assert got["a"].dtype == torch.int32 and got["a"].tolist() == [[1, -2]] * 2
    assert got["big"].tolist() == [2**62 + 1] * 2  # no trip through a float
    before = {k: v.clone() for k, v in rb.sample_all().items()}
    for bad, field in (
        ({"r64": 0.1, "r32": 1e300, "a": [1, 2], "big": 0}, "'r32': value 1e+300 overflows float32"),
        ({"r64": 0.1, "r32": 0.0, "a": [1, 2**40], "big": 0}, "'a': expected (2,) int32, got (2,) int64"),
        ({"r64": 0.1, "r32": 0.0, "a": [1.5, 2], "big": 0}, "'a': expected (2,) int32, got (2,) float64"),
    ):
        with pytest.raises(SpecError, match=re.escape(field)):
            rb.add(bad)
    after = rb.sample_all()
    assert len(rb) == 2 and all(torch.equal(before[k], after[k]) for k in before)


def test_python_numbers_without_a_spec_take_torchs_default_dtypes():
    flat = flatten({"r": 0.1, "n": 3, "d": True, "v": [0.5, 1.5]})
    assert [flat[k].dtype for k in "rndv"] == [torch.float32, torch.int64, torch.bool, torch.float32]
    with pytest.raises(SpecError, match=re.escape("field 'r': value 1e+300 overflows float32")):
        flatten({"r": 1e300})
