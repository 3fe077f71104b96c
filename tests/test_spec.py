"""Field and Spec: construction, validation, merge, (de)serialization, selection."""

from __future__ import annotations

import builtins
import json

import pytest
import torch

from helpers import make_batch, transition_spec
from xpbank import Field, Spec, SpecError, XpbankError
from xpbank.spec.spec import key_str, normalize_key

# -- Field ----------------------------------------------------------------------


def test_field_shape_and_dtype():
    field = Field((4, 84, 84), torch.uint8)
    assert field.shape == (4, 84, 84)
    assert field.dtype == torch.uint8
    assert field.numel == 4 * 84 * 84
    assert field.describe() == "(*, 4, 84, 84) uint8"


def test_field_defaults_and_int_shape():
    assert Field() == Field((), torch.float32)
    assert Field().numel == 1
    assert Field(5).shape == (5,)
    assert Field(torch.Size([2, 3])).shape == (2, 3)
    assert Field([2, 3]) == Field((2, 3))
    assert hash(Field([2, 3])) == hash(Field((2, 3)))
    assert Field(()).describe() == "(*) float32"


def test_field_is_frozen():
    field = Field((3,))
    with pytest.raises(AttributeError):
        field.shape = (4,)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("shape", "dtype", "message"),
    [
        ((-1, 3), torch.float32, r"a field shape must have non-negative dims, got \(-1, 3\)"),
        (None, torch.float32, r"a field shape must be a sequence of ints, got None"),
        ((3,), "float32", r"a field dtype must be a torch.dtype, got 'float32'"),
        ((3,), float, r"a field dtype must be a torch.dtype, got <class 'float'>"),
    ],
)
def test_field_rejects_bad_shape_or_dtype(shape, dtype, message):
    with pytest.raises(SpecError, match=message):
        Field(shape, dtype)


@pytest.mark.parametrize("shape", [(2.5,), "3"])
def test_field_rejects_non_int_dims(shape):
    with pytest.raises(SpecError, match="a field shape must be a sequence of ints"):
        Field(shape)


@pytest.mark.parametrize(
    "field",
    [Field((3,)), Field((), torch.bool), Field((2, 4), torch.uint8), Field((5,), torch.bfloat16)],
)
def test_field_dict_round_trip(field):
    data = field.to_dict()
    assert json.loads(json.dumps(data)) == data
    assert Field.from_dict(data) == field


def test_field_to_dict_form():
    assert Field((2, 4), torch.uint8).to_dict() == {"shape": [2, 4], "dtype": "uint8"}


# -- keys -------------------------------------------------------------------------


def test_normalize_key():
    assert normalize_key("obs") == "obs"
    assert normalize_key(("obs",)) == "obs"
    assert normalize_key(("next", "obs")) == ("next", "obs")
    for bad in [(), 3, ("next", 3), ["next", "obs"], None]:
        with pytest.raises(SpecError, match="a key must be a str or a non-empty tuple of str, got "):
            normalize_key(bad)


def test_key_str():
    assert key_str("obs") == "obs"
    assert key_str(("next", "obs")) == "next.obs"


# -- Spec construction ----------------------------------------------------------


def test_nested_dicts_flatten_to_tuple_keys():
    f3, fb = Field((3,)), Field((), torch.bool)
    spec = Spec({"obs": f3, "next": {"obs": f3, "info": {"done": fb}}})
    assert list(spec) == ["obs", ("next", "obs"), ("next", "info", "done")]
    assert spec[("next", "info", "done")] == fb
    same = Spec({"obs": f3, ("next", "obs"): f3, ("next", "info", "done"): fb})
    assert spec == same
    assert Spec({"next": {("info", "done"): fb}}) == Spec({("next", "info", "done"): fb})


def test_one_tuple_key_is_the_str_key():
    spec = Spec({("obs",): Field((3,))})
    assert list(spec) == ["obs"]
    assert spec["obs"] is spec[("obs",)]
    assert "obs" in spec
    assert ("obs",) in spec
    assert spec == Spec({"obs": Field((3,))})


def test_spec_is_an_ordered_mapping():
    spec = transition_spec()
    assert len(spec) == 6
    assert list(spec) == ["obs", "action", "reward", "terminated", "truncated", ("next", "obs")]
    assert spec.keyset == frozenset(spec)
    assert spec["action"] == Field((), torch.int64)
    assert ("next", "missing") not in spec
    with pytest.raises(KeyError):
        spec["missing"]
    assert Spec() == Spec({}) and len(Spec()) == 0
    assert spec != transition_spec(obs_shape=(4,))
    assert spec != transition_spec(obs_dtype=torch.float64)
    assert spec != {"obs": Field((3,))}  # not equal to a plain dict


def test_spec_repr_names_fields():
    assert repr(Spec({"obs": Field((3,)), ("next", "obs"): Field((3,), torch.uint8)})) == (
        "Spec({'obs': (*, 3) float32, 'next.obs': (*, 3) uint8})"
    )


def test_equal_specs_hash_equal_in_the_same_order():
    assert hash(transition_spec()) == hash(transition_spec())
    assert len({transition_spec(), transition_spec(), transition_spec((4,))}) == 2


def test_equal_specs_in_another_order_hash_equal():
    a = Spec({"obs": Field((3,)), "reward": Field(())})
    b = Spec({"reward": Field(()), "obs": Field((3,))})
    assert a == b
    assert hash(a) == hash(b)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"obs": 3}, r"field 'obs': expected a Field, got int"),
        ({"next": {"obs": (3,)}}, r"field 'next.obs': expected a Field, got tuple"),
        ({(): Field()}, r"a key must be a str or a non-empty tuple of str, got \(\)"),
        ({("next", 0): Field()}, r"a key must be a str or a non-empty tuple of str"),
    ],
)
def test_spec_rejects_bad_entries(fields, message):
    with pytest.raises(SpecError, match=message):
        Spec(fields)


def test_spec_rejects_int_key_with_spec_error():
    with pytest.raises(SpecError, match="a key must be a str or a non-empty tuple of str"):
        Spec({1: Field()})


# -- validate -------------------------------------------------------------------


def test_validate_returns_leading_shape():
    spec = transition_spec()
    assert spec.validate(make_batch(spec, 5)) == (5,)
    assert spec.validate(make_batch(spec, 0)) == (0,)
    one = {k: v[0] for k, v in make_batch(spec, 1).items()}
    assert spec.validate(one, batch_ndim=0) == ()
    two = {k: v.reshape(2, 3, *v.shape[1:]) for k, v in make_batch(spec, 6).items()}
    assert spec.validate(two, batch_ndim=2) == (2, 3)


def test_validate_wrong_trailing_shape():
    spec = Spec({"obs": Field((3,)), "reward": Field(())})
    batch = {"obs": torch.zeros(2, 4), "reward": torch.zeros(2)}
    with pytest.raises(SpecError, match=r"^field 'obs': expected \(\*, 3\) float32, got \(2, 4\) float32$"):
        spec.validate(batch)


def test_validate_wrong_dtype():
    spec = Spec({"obs": Field((3,)), "reward": Field(())})
    batch = {"obs": torch.zeros(2, 3), "reward": torch.zeros(2, dtype=torch.float64)}
    with pytest.raises(SpecError, match=r"^field 'reward': expected \(\*\) float32, got \(2,\) float64$"):
        spec.validate(batch)


def test_validate_missing_batch_dim_and_nested_name():
    spec = Spec({("next", "obs"): Field((84, 84), torch.uint8)})
    with pytest.raises(
        SpecError, match=r"^field 'next.obs': expected \(\*, 84, 84\) uint8, got \(84, 84\) uint8$"
    ):
        spec.validate({("next", "obs"): torch.zeros(84, 84, dtype=torch.uint8)})


def test_validate_expected_for_other_batch_ndims():
    spec = Spec({"obs": Field((3,))})
    with pytest.raises(SpecError, match=r"expected \(3,\) float32, got \(2, 3\) float32"):
        spec.validate({"obs": torch.zeros(2, 3)}, batch_ndim=0)
    with pytest.raises(SpecError, match=r"expected \(\*, \*, 3\) float32, got \(2, 3\) float32"):
        spec.validate({"obs": torch.zeros(2, 3)}, batch_ndim=2)


def test_validate_missing_keys():
    spec = transition_spec()
    batch = make_batch(spec, 2)
    del batch["reward"], batch[("next", "obs")]
    with pytest.raises(
        SpecError,
        match=r"^batch keys do not match the spec: missing field\(s\) \['reward', 'next.obs'\]; "
        r"expected 'obs', 'action', 'reward', 'terminated', 'truncated', 'next.obs'$",
    ):
        spec.validate(batch)


def test_validate_extra_and_missing_keys():
    spec = Spec({"obs": Field((3,)), "reward": Field(())})
    batch = {"obs": torch.zeros(2, 3), "rewards": torch.zeros(2), ("next", "x"): torch.zeros(2)}
    with pytest.raises(
        SpecError,
        match=r"^batch keys do not match the spec: missing field\(s\) \['reward'\]; "
        r"unknown field\(s\) \['next.x', 'rewards'\]; expected 'obs', 'reward'$",
    ):
        spec.validate(batch)


def test_validate_mismatched_leading_dims():
    spec = Spec({"obs": Field((3,)), "reward": Field(())})
    batch = {"obs": torch.zeros(2, 3), "reward": torch.zeros(3)}
    with pytest.raises(
        SpecError,
        match=r"^field 'reward': batch shape \(3,\) differs from field 'obs''s \(2,\); every field "
        r"of a batch needs the same leading 1 dim\(s\)$",
    ):
        spec.validate(batch)


def test_validate_partial():
    spec = transition_spec()
    part = {"reward": torch.zeros(4), ("next", "obs"): torch.zeros(4, 3)}
    assert spec.validate(part, partial=True) == (4,)
    assert spec.validate({}, partial=True) == ()
    with pytest.raises(SpecError, match=r"missing field\(s\) \['obs', 'action', 'terminated', 'truncated'\]"):
        spec.validate(part)
    with pytest.raises(
        SpecError, match=r"^batch keys do not match the spec: unknown field\(s\) \['bonus'\]; expected "
    ):
        spec.validate({"reward": torch.zeros(4), "bonus": torch.zeros(4)}, partial=True)
    with pytest.raises(SpecError, match=r"field 'reward': expected \(\*\) float32, got \(4,\) int64"):
        spec.validate({"reward": torch.zeros(4, dtype=torch.int64)}, partial=True)


def test_spec_errors_are_value_errors():
    spec = Spec({"obs": Field((3,))})
    with pytest.raises(ValueError, match="field 'obs'"):
        spec.validate({"obs": torch.zeros(2, 4)})
    try:
        Spec({"obs": 1})
    except ValueError as exc:
        assert isinstance(exc, SpecError)
        assert isinstance(exc, XpbankError)
    else:
        pytest.fail("Spec({'obs': 1}) did not raise")


# -- from_batch -----------------------------------------------------------------


def test_from_batch_infers_trailing_shapes():
    spec = transition_spec(obs_shape=(2, 2), obs_dtype=torch.uint8)
    assert Spec.from_batch(make_batch(spec, 3)) == spec
    one = {k: v[0] for k, v in make_batch(spec, 1).items()}
    assert Spec.from_batch(one, batch_ndim=0) == spec


def test_from_batch_errors():
    with pytest.raises(SpecError, match=r"cannot infer a spec from an empty batch \(no fields\)"):
        Spec.from_batch({})
    with pytest.raises(
        SpecError, match=r"field 'reward': expected at least 1 batch dim\(s\), got shape \(\)"
    ):
        Spec.from_batch({"obs": torch.zeros(2, 3), "reward": torch.tensor(1.0)})
    with pytest.raises(SpecError, match=r"batch shape \(3,\) differs"):
        Spec.from_batch({"obs": torch.zeros(2, 3), "reward": torch.zeros(3)})


# -- merge ----------------------------------------------------------------------


def test_merge_is_the_union_in_order():
    a = Spec({"obs": Field((3,)), "reward": Field(())})
    b = Spec({"reward": Field(()), "logp": Field((), torch.float64), ("next", "obs"): Field((3,))})
    merged = Spec.merge(a, b)
    assert list(merged) == ["obs", "reward", "logp", ("next", "obs")]
    assert merged["logp"] == Field((), torch.float64)
    assert Spec.merge(a) == a
    assert Spec.merge() == Spec()


def test_merge_conflict_names_both_default_sources():
    a = Spec({"obs": Field((3,))})
    b = Spec({"obs": Field((4,))})
    with pytest.raises(
        SpecError,
        match=r"^field 'obs' is \(\*, 3\) float32 in spec 0 but \(\*, 4\) float32 in spec 1; "
        r"rename one or make them agree$",
    ):
        Spec.merge(a, b)
    # the order of the sources is kept: a later spec never silently wins
    with pytest.raises(SpecError, match=r"\(\*, 4\) float32 in spec 0 but \(\*, 3\) float32 in spec 1"):
        Spec.merge(b, a)


def test_merge_conflict_on_dtype_with_custom_names():
    env = Spec({"obs": Field((3,)), ("next", "obs"): Field((3,))})
    agent = Spec({"logp": Field(())})
    model = Spec({("next", "obs"): Field((3,), torch.float16)})
    with pytest.raises(
        SpecError,
        match=r"^field 'next.obs' is \(\*, 3\) float32 in env but \(\*, 3\) float16 in model; ",
    ):
        Spec.merge(env, agent, model, names=["env", "agent", "model"])


def test_merge_names_the_first_source_of_a_key():
    a = Spec({"x": Field(())})
    with pytest.raises(SpecError, match=r"in first but \(\*\) int64 in third"):
        Spec.merge(a, a, Spec({"x": Field((), torch.int64)}), names=["first", "second", "third"])


def test_merge_argument_errors():
    a = Spec({"x": Field(())})
    with pytest.raises(SpecError, match=r"^merge: expected 2 names, got 1$"):
        Spec.merge(a, a, names=["only"])
    with pytest.raises(SpecError, match=r"^merge: spec 1 is a dict, expected Spec$"):
        Spec.merge(a, {"x": Field(())})  # type: ignore[arg-type]


# -- to_dict / from_dict ----------------------------------------------------------


def test_dict_round_trip_through_json():
    spec = Spec(
        {
            "obs": Field((4, 84, 84), torch.uint8),
            "action": Field((), torch.int64),
            "logits": Field((6,), torch.bfloat16),
            "done": Field((), torch.bool),
            ("next", "obs"): Field((4, 84, 84), torch.uint8),
        }
    )
    data = spec.to_dict()
    assert data["fields"][0] == {"key": ["obs"], "shape": [4, 84, 84], "dtype": "uint8"}
    assert data["fields"][-1]["key"] == ["next", "obs"]
    back = Spec.from_dict(json.loads(json.dumps(data)))
    assert back == spec
    assert list(back) == list(spec)


@pytest.mark.parametrize("name", ["float33", "Tensor", "zeros", "nn", "", None])
def test_from_dict_unknown_dtype(name):
    data = {"fields": [{"key": ["obs"], "shape": [3], "dtype": name}]}
    with pytest.raises(SpecError, match=f"^unknown dtype {name!r} in field description"):
        Spec.from_dict(data)


def test_from_dict_never_evaluates_anything(monkeypatch):
    calls = []

    def spy(*args, **kwargs):
        calls.append(args)
        raise AssertionError("from_dict evaluated a string")

    monkeypatch.setattr(builtins, "eval", spy)
    monkeypatch.setattr(builtins, "exec", spy)
    payload = "__import__('os').system('echo pwned')"
    with pytest.raises(SpecError, match="unknown dtype"):
        Spec.from_dict({"fields": [{"key": ["obs"], "shape": [3], "dtype": payload}]})
    with pytest.raises(SpecError, match="unknown dtype"):
        Spec.from_dict({"fields": [{"key": ["obs"], "shape": [3], "dtype": "torch.float32"}]})
    assert calls == []


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, r"a spec description needs a 'fields' list, got NoneType"),
        ({"fields": {"obs": 1}}, r"a spec description needs a 'fields' list, got dict"),
        ({"fields": [["obs"]]}, r"malformed field entry \['obs'\]"),
        ({"fields": [{"key": "obs", "dtype": "float32"}]}, r"malformed field entry"),
        ({"fields": [{"key": [], "dtype": "float32"}]}, r"a key must be a str or a non-empty tuple"),
    ],
)
def test_from_dict_malformed(data, message):
    with pytest.raises(SpecError, match=message):
        Spec.from_dict(data)


# -- select -----------------------------------------------------------------------


def test_select():
    spec = transition_spec()
    sub = spec.select([("next", "obs"), "reward", ("action",)])
    assert list(sub) == [("next", "obs"), "reward", "action"]
    assert sub[("next", "obs")] == spec[("next", "obs")]
    assert spec.select(list(spec)) == spec
    assert spec.select([]) == Spec()


def test_select_unknown_key():
    spec = Spec({"obs": Field((3,)), ("next", "obs"): Field((3,))})
    with pytest.raises(
        SpecError, match=r"^field 'next.reward' is not in the spec; known: 'obs', 'next.obs'$"
    ):
        spec.select(["obs", ("next", "reward")])
