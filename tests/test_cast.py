"""Safe dtype casting on write (``ReplayBuffer(cast=...)``) and its rule table."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch

from xpbank import Field, ReplayBuffer, Spec, SpecError
from xpbank.spec.cast import is_safe_cast

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
]

SPEC = Spec(
    {
        "obs": Field((4,), torch.float32),
        "action": Field((), torch.int64),
        "reward": Field((), torch.float32),
        "terminated": Field((), torch.bool),
        ("next", "obs"): Field((4,), torch.float32),
    }
)


def _reference_safe(src: torch.dtype, dst: torch.dtype) -> bool:
    """Brute force: would every value of ``src`` keep what matters in ``dst``?"""
    if src == torch.bool:
        return True  # 0/1 is exact in every dtype
    if dst == torch.bool:
        return False  # a number made into a truth value
    if src.is_complex:
        return dst.is_complex
    if src.is_floating_point:
        return dst.is_floating_point or dst.is_complex  # precision only, never the fraction
    if dst.is_floating_point or dst.is_complex:
        return True
    s, d = torch.iinfo(src), torch.iinfo(dst)
    return d.min <= s.min and s.max <= d.max


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(DTYPES, DTYPES)))
def test_rule_table_matches_the_brute_force_reference(src: torch.dtype, dst: torch.dtype) -> None:
    assert is_safe_cast(src, dst) == _reference_safe(src, dst)


def _state(rb: ReplayBuffer) -> tuple[int, list[float]]:
    return len(rb), (rb.sample_all()["obs"][:, 0].tolist() if len(rb) else [])


def test_numpy_float64_and_python_numbers_are_stored_as_the_spec_says() -> None:
    rb = ReplayBuffer(8, SPEC)
    obs = np.array([0.1, 0.2, 0.3, 0.4])  # float64, NumPy's default
    rb.add({"obs": obs, "action": 1, "reward": 1, "terminated": False, ("next", "obs"): obs * 2})
    rb.add(
        {
            "obs": obs,
            "action": np.int32(0),
            "reward": np.float64(0.5),
            "terminated": np.bool_(True),
            ("next", "obs"): obs,
        }
    )
    got = rb.sample_all()
    assert got["obs"].dtype == torch.float32 and got["action"].dtype == torch.int64
    assert torch.equal(got["obs"][0], torch.from_numpy(obs).to(torch.float32))
    assert torch.equal(got["next", "obs"][0], torch.from_numpy(obs * 2).to(torch.float32))
    assert got["action"].tolist() == [1, 0] and got["reward"].tolist() == [1.0, 0.5]
    assert got["terminated"].tolist() == [False, True]


def test_extend_casts_int32_actions_and_float64_arrays() -> None:
    rb = ReplayBuffer(8, SPEC)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(3, 4))
    batch = {
        "obs": obs,
        "action": np.array([2, 0, 1], dtype=np.int32),
        "reward": np.array([1.0, 0.0, -1.0]),
        "terminated": np.array([True, False, False]),
        ("next", "obs"): obs + 1,
    }
    assert rb.extend(batch) == range(0, 3)
    got = rb.sample_all()
    assert torch.equal(got["obs"], torch.from_numpy(obs).float())
    assert got["action"].tolist() == [2, 0, 1] and got["reward"].tolist() == [1.0, 0.0, -1.0]


@pytest.mark.parametrize(
    ("key", "value", "msg"),
    [
        ("action", np.array([0.0, 1.0]), "field 'action': expected (*) int64, got (2,) float64"),
        ("terminated", np.array([0, 1]), "field 'terminated': expected (*) bool, got (2,) int64"),
        ("obs", np.zeros((2, 3)), "field 'obs': expected (*, 4) float32, got (2, 3) float64"),
        (
            "obs",
            np.zeros((2, 4), dtype=np.complex64),
            "field 'obs': expected (*, 4) float32, got (2, 4) complex64",
        ),
    ],
    ids=["float-to-int", "int-to-bool", "wrong-shape", "complex-to-float"],
)
def test_surely_wrong_batches_are_refused_and_nothing_is_written(
    key: str, value: np.ndarray, msg: str
) -> None:
    rb = ReplayBuffer(8, SPEC)
    rb.extend({k: torch.ones(1, *SPEC[k].shape, dtype=SPEC[k].dtype) for k in SPEC})
    before = _state(rb)
    good = {
        "obs": np.full((2, 4), 7.0),  # castable, and checked together with the bad field
        "action": np.array([1, 2]),
        "reward": np.ones(2),
        "terminated": np.array([False, True]),
        ("next", "obs"): np.ones((2, 4)),
    }
    with pytest.raises(SpecError, match=re.escape(msg)):
        rb.extend({**good, key: value})
    assert _state(rb) == before


def test_cast_false_restores_strict_checking() -> None:
    rb = ReplayBuffer(8, SPEC, cast=False)
    item = {"obs": np.zeros(4), "action": 1, "reward": 0.0, "terminated": False, ("next", "obs"): np.zeros(4)}
    with pytest.raises(SpecError, match=re.escape("field 'obs': expected (4,) float32, got (4,) float64")):
        rb.add(item)
    with pytest.raises(SpecError, match=re.escape("field 'action': expected () int64, got () int32")):
        rb.add(
            {
                **item,
                "obs": np.zeros(4, np.float32),
                ("next", "obs"): np.zeros(4, np.float32),
                "action": np.int32(1),
            }
        )
    assert len(rb) == 0
    rb.add({**item, "obs": np.zeros(4, np.float32), ("next", "obs"): np.zeros(4, np.float32)})
    assert len(rb) == 1


def test_cast_must_be_a_bool() -> None:
    with pytest.raises(SpecError, match=re.escape("cast: expected True or False, got 'safe'")):
        ReplayBuffer(8, SPEC, cast="safe")  # type: ignore[arg-type]


def test_update_casts_too_and_refuses_what_extend_refuses() -> None:
    rb = ReplayBuffer(8, SPEC)
    ids = rb.extend({k: torch.zeros(3, *SPEC[k].shape, dtype=SPEC[k].dtype) for k in SPEC})
    rb.update(torch.as_tensor(ids), {"reward": np.array([0.5, 1.5, 2.5])})
    assert rb.sample_all()["reward"].tolist() == [0.5, 1.5, 2.5]
    with pytest.raises(SpecError, match=re.escape("field 'action': expected (*) int64, got (3,) float64")):
        rb.update(torch.as_tensor(ids), {"reward": np.zeros(3), "action": np.zeros(3)})
    assert rb.sample_all()["reward"].tolist() == [0.5, 1.5, 2.5]


def test_conform_returns_the_batch_itself_when_dtypes_match() -> None:
    batch = {k: torch.zeros(5, *SPEC[k].shape, dtype=SPEC[k].dtype) for k in SPEC}
    lead, out = SPEC.conform(batch)
    assert lead == (5,) and out is batch
    wide = {**batch, "obs": torch.zeros(5, 4, dtype=torch.float64)}
    lead, out = SPEC.conform(wide)
    assert lead == (5,) and out is not wide and out["obs"].dtype == torch.float32
    assert wide["obs"].dtype == torch.float64  # the caller's dict is left alone
    assert all(out[k] is wide[k] for k in SPEC if k != "obs")  # only the cast field is new


def test_conform_reports_key_mismatches_like_validate() -> None:
    msg = "batch keys do not match the spec: missing field(s) ['reward']"
    batch = {k: torch.zeros(2, *SPEC[k].shape, dtype=torch.float64) for k in SPEC if k != "reward"}
    with pytest.raises(SpecError, match=re.escape(msg)):
        SPEC.conform(batch)
