"""Specs from gymnasium spaces and TorchRL Composite specs (skipped when those are missing)."""

from __future__ import annotations

import sys
from types import ModuleType

import numpy as np
import pytest
import torch

from helpers import transition_spec
from xpbank import Field, MissingExtraError, ReplayBuffer, Spec, SpecError
from xpbank.spec.batch import flatten


@pytest.fixture
def spaces() -> ModuleType:
    gym = pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install 'xpbank[gym]')")
    return gym.spaces


@pytest.fixture
def trl() -> ModuleType:
    """``torchrl.data``; skipped when torchrl is missing or does not import with this torch."""
    try:
        import torchrl.data
    except Exception as exc:  # a missing package, or a compiled extension built for another torch
        pytest.skip(f"torchrl.data cannot be imported here ({type(exc).__name__}: {exc})")
    return torchrl.data


# -- gymnasium --------------------------------------------------------------------


def test_box_and_discrete_give_the_transition_spec(spaces):
    spec = Spec.from_gymnasium(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(4))
    assert spec == transition_spec()
    assert list(spec) == ["obs", "action", "reward", "terminated", "truncated", ("next", "obs")]
    assert spec["reward"] == Field((), torch.float32)
    assert spec["terminated"] == spec["truncated"] == Field((), torch.bool)


def test_uint8_image_box(spaces):
    image = spaces.Box(0, 255, (84, 84, 3), np.uint8)
    spec = Spec.from_gymnasium(image, spaces.Discrete(6))
    assert spec == transition_spec(obs_shape=(84, 84, 3), obs_dtype=torch.uint8)


@pytest.mark.parametrize(
    ("make_space", "field"),
    [
        (lambda s: s.Box(-2.0, 2.0, (2,), np.float32), Field((2,), torch.float32)),
        (lambda s: s.Box(-2.0, 2.0, (1,), np.float64), Field((1,), torch.float64)),
        (lambda s: s.Box(0, 10, (), np.int32), Field((), torch.int32)),
        (lambda s: s.Discrete(3, start=-1), Field((), torch.int64)),
        (lambda s: s.MultiDiscrete([3, 4, 2]), Field((3,), torch.int64)),
        (lambda s: s.MultiDiscrete([[2, 3], [4, 5]]), Field((2, 2), torch.int64)),
        (lambda s: s.MultiBinary(5), Field((5,), torch.int8)),
        (lambda s: s.MultiBinary([2, 3]), Field((2, 3), torch.int8)),
    ],
    ids=[
        "box-f32",
        "box-f64",
        "box-int-scalar",
        "discrete",
        "multidiscrete",
        "multidiscrete-2d",
        "multibinary",
        "multibinary-2d",
    ],
)
def test_action_spaces(spaces, make_space, field):
    spec = Spec.from_gymnasium(spaces.Box(-1.0, 1.0, (3,), np.float32), make_space(spaces))
    assert spec["action"] == field
    assert spec.select(["obs", ("next", "obs")]) == transition_spec().select(["obs", ("next", "obs")])


def test_multibinary_observation(spaces):
    spec = Spec.from_gymnasium(spaces.MultiBinary(4), spaces.Discrete(2))
    assert spec["obs"] == spec[("next", "obs")] == Field((4,), torch.int8)


def test_dict_observation_nests(spaces):
    obs_space = spaces.Dict(
        {
            "image": spaces.Box(0, 255, (8, 8, 3), np.uint8),
            "state": spaces.Box(-1.0, 1.0, (4,), np.float32),
            "inventory": spaces.Dict({"slots": spaces.MultiDiscrete([5, 5])}),
        }
    )
    spec = Spec.from_gymnasium(obs_space, spaces.Discrete(3))
    image, state, slots = Field((8, 8, 3), torch.uint8), Field((4,)), Field((2,), torch.int64)
    assert dict(spec) == {
        ("obs", "image"): image,
        ("obs", "state"): state,
        ("obs", "inventory", "slots"): slots,
        "action": Field((), torch.int64),
        "reward": Field(()),
        "terminated": Field((), torch.bool),
        "truncated": Field((), torch.bool),
        ("next", "obs", "image"): image,
        ("next", "obs", "state"): state,
        ("next", "obs", "inventory", "slots"): slots,
    }


def test_dict_action_space_nests(spaces):
    act = spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Box(-1.0, 1.0, (2,), np.float32)})
    spec = Spec.from_gymnasium(spaces.Box(-1.0, 1.0, (3,), np.float32), act)
    assert spec[("action", "move")] == Field((), torch.int64)
    assert spec[("action", "aim")] == Field((2,))
    assert "action" not in spec
    assert not any(isinstance(k, tuple) and k[0] == "next" and k[1] == "action" for k in spec)


def test_unsupported_observation_space_is_named(spaces):
    obs = spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (3,), np.float32)))
    with pytest.raises(
        SpecError,
        match=r"^observation_space: gymnasium space Tuple is not supported; use Box, Discrete, "
        r"MultiDiscrete, MultiBinary or a Dict of them$",
    ):
        Spec.from_gymnasium(obs, spaces.Discrete(2))


def test_unsupported_space_inside_a_dict_or_as_action(spaces):
    box = spaces.Box(-1.0, 1.0, (3,), np.float32)
    nested = spaces.Dict({"ok": box, "bad": spaces.Tuple((spaces.Discrete(2),))})
    with pytest.raises(SpecError, match=r"observation_space: gymnasium space Tuple is not supported"):
        Spec.from_gymnasium(nested, spaces.Discrete(2))
    with pytest.raises(SpecError, match=r"^action_space: gymnasium space Text is not supported"):
        Spec.from_gymnasium(box, spaces.Text(5))


def _rollout(env_id: str, steps: int, action_dtype: torch.dtype) -> tuple[Spec, dict]:
    gym = pytest.importorskip("gymnasium", reason="gymnasium is not installed (pip install 'xpbank[gym]')")
    env = gym.make(env_id)
    env.action_space.seed(0)
    spec = Spec.from_gymnasium(env.observation_space, env.action_space)
    obs, _ = env.reset(seed=0)
    rows: dict[str, list] = {k: [] for k in ["obs", "action", "reward", "terminated", "truncated", "next"]}
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        for name, value in zip(rows, [obs, action, reward, terminated, truncated, next_obs], strict=True):
            rows[name].append(value)
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    batch = {
        "obs": torch.as_tensor(np.stack(rows["obs"])),
        "action": torch.as_tensor(np.stack(rows["action"]), dtype=action_dtype),
        "reward": torch.as_tensor(rows["reward"], dtype=torch.float32),
        "terminated": torch.as_tensor(rows["terminated"], dtype=torch.bool),
        "truncated": torch.as_tensor(rows["truncated"], dtype=torch.bool),
        ("next", "obs"): torch.as_tensor(np.stack(rows["next"])),
    }
    return spec, batch


@pytest.mark.parametrize(
    ("env_id", "obs_field", "action_field"),
    [
        ("CartPole-v1", Field((4,)), Field((), torch.int64)),
        ("Pendulum-v1", Field((3,)), Field((1,))),
    ],
)
def test_spec_of_a_real_env_validates_its_transitions(env_id, obs_field, action_field):
    spec, batch = _rollout(env_id, 12, action_field.dtype)
    assert spec["obs"] == spec[("next", "obs")] == obs_field
    assert spec["action"] == action_field
    assert spec.validate(batch) == (12,)

    rb = ReplayBuffer(16, spec, seed=0)
    rb.extend(batch)
    stored = rb.sample_all()
    assert torch.equal(stored["obs"], batch["obs"])
    assert torch.equal(stored["next", "obs"], batch[("next", "obs")])


def test_real_env_reward_as_float64_is_caught(spaces):
    spec, batch = _rollout("Pendulum-v1", 3, torch.float32)
    batch["reward"] = batch["reward"].double()  # what torch.as_tensor(reward) gives without a dtype
    with pytest.raises(SpecError, match=r"^field 'reward': expected \(\*\) float32, got \(3,\) float64$"):
        spec.validate(batch)


def test_missing_gymnasium_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium.spaces", None)
    with pytest.raises(MissingExtraError, match=r"install -e '\.\[gym\]'.*'xpbank\[gym\]'"):
        Spec.from_gymnasium(object(), object())


# -- torchrl ------------------------------------------------------------------------


def test_from_torchrl_nested_composite_drops_batch_dims(trl):
    composite = trl.Composite(
        obs=trl.Unbounded(shape=(4, 3)),
        action=trl.Categorical(n=2, shape=(4,)),
        pixels=trl.Bounded(low=0, high=255, shape=(4, 8, 8, 3), dtype=torch.uint8),
        next=trl.Composite(
            obs=trl.Unbounded(shape=(4, 3)),
            reward=trl.Unbounded(shape=(4, 1)),
            done=trl.Categorical(n=2, shape=(4, 1), dtype=torch.bool),
            shape=(4,),
        ),
        shape=(4,),
    )
    spec = Spec.from_torchrl(composite)
    assert dict(spec) == {
        "obs": Field((3,)),
        "action": Field((), torch.int64),
        "pixels": Field((8, 8, 3), torch.uint8),
        ("next", "obs"): Field((3,)),
        ("next", "reward"): Field((1,)),
        ("next", "done"): Field((1,), torch.bool),
    }


def test_from_torchrl_without_and_with_several_batch_dims(trl):
    flat = trl.Composite(obs=trl.Unbounded(shape=(5,)), r=trl.Unbounded(shape=(), dtype=torch.float64))
    assert Spec.from_torchrl(flat) == Spec({"obs": Field((5,)), "r": Field((), torch.float64)})
    two = trl.Composite(obs=trl.Unbounded(shape=(2, 3, 5)), shape=(2, 3))
    assert Spec.from_torchrl(two) == Spec({"obs": Field((5,))})


def test_from_torchrl_spec_validates_a_rollout_shaped_batch(trl):
    composite = trl.Composite(
        obs=trl.Unbounded(shape=(4, 3)),
        next=trl.Composite(obs=trl.Unbounded(shape=(4, 3)), shape=(4,)),
        shape=(4,),
    )
    spec = Spec.from_torchrl(composite)
    sample = composite.zero()  # a TensorDict of batch size [4]
    assert spec.validate(flatten(sample)) == (4,)


@pytest.mark.parametrize(
    "make",
    [lambda t: t.Unbounded(shape=(3,)), lambda t: {"obs": t.Unbounded(shape=(3,))}, lambda t: None],
    ids=["leaf-spec", "dict", "none"],
)
def test_from_torchrl_needs_a_composite(trl, make):
    value = make(trl)
    name = type(value).__name__  # torchrl's Unbounded(...) makes an UnboundedContinuous
    with pytest.raises(SpecError, match=f"^from_torchrl: expected a torchrl Composite, got {name}$"):
        Spec.from_torchrl(value)


def test_from_torchrl_empty_composite(trl):
    with pytest.raises(SpecError, match=r"^from_torchrl: the Composite has no leaf specs$"):
        Spec.from_torchrl(trl.Composite(shape=(2,)))


def test_missing_torchrl_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchrl.data", None)
    with pytest.raises(MissingExtraError, match=r"install -e '\.\[torchrl\]'.*'xpbank\[torchrl\]'"):
        Spec.from_torchrl(object())
