"""The fields of an environment's items, read from gymnasium spaces and TorchRL ``Composite``
specs (gymnasium and torchrl are imported when called).

A transition holds ``obs``, ``action``, ``reward`` (float32), ``terminated`` and
``truncated`` (bool, kept apart: returns bootstrap on truncation, never on termination)
and ``("next", "obs")``. A ``Dict`` observation space nests: ``("obs", "image")`` and
``("next", "obs", "image")``. :class:`~xpbank.Spec` wraps these as
:meth:`~xpbank.Spec.from_gymnasium` and :meth:`~xpbank.Spec.from_torchrl`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, require
from xpbank.spec.field import Field, check_storable
from xpbank.spec.keys import NestedKey

__all__ = ["field_from_space", "gymnasium_fields", "torchrl_fields"]


# unsigned ints torch cannot index, stored as the signed int every value fits in (a
# buffer's default cast=True converts the env's arrays: spec/cast.py)
_WIDENED = {np.dtype(np.uint16): torch.int32, np.dtype(np.uint32): torch.int64}


def _torch_dtype(dtype: Any, what: str) -> torch.dtype:
    """The stored dtype of a space's dtype: its torch twin; uint16 -> int32, uint32 -> int64
    (uint16/32/64 are not storable, :func:`~xpbank.spec.field.check_storable`)."""
    widened = _WIDENED.get(np.dtype(dtype))
    if widened is not None:
        return widened
    try:
        out = torch.from_numpy(np.zeros(0, dtype=np.dtype(dtype))).dtype
    except TypeError as exc:
        raise SpecError(f"{what}: dtype {dtype} has no torch equivalent") from exc
    check_storable(out, f"{what}: dtype {dtype}")
    return out


def _space_fields(space: Any, key: tuple[str, ...], out: dict[NestedKey, Field], what: str) -> None:
    spaces = require("gymnasium.spaces", "gym")
    if isinstance(space, spaces.Dict):
        for name, sub in space.spaces.items():
            _space_fields(sub, (*key, str(name)), out, what)
        return
    out[key[0] if len(key) == 1 else key] = field_from_space(space, what)


def field_from_space(space: Any, what: str = "space") -> Field:
    """The Field of one item of a non-nested gymnasium space.

    ``Box`` keeps its shape and dtype; ``Discrete`` is an int64 scalar;
    ``MultiDiscrete`` int64 of its shape; ``MultiBinary`` keeps its shape and dtype (int8).

    Raises:
        SpecError: a space of another kind (Tuple, Text, Graph, Sequence ...).
    """
    spaces = require("gymnasium.spaces", "gym")
    if isinstance(space, spaces.Box):
        return Field(space.shape, _torch_dtype(space.dtype, what))
    if isinstance(space, spaces.Discrete):
        return Field((), torch.int64)
    if isinstance(space, spaces.MultiDiscrete):
        return Field(space.shape, torch.int64)
    if isinstance(space, spaces.MultiBinary):
        return Field(space.shape, _torch_dtype(space.dtype, what))
    raise SpecError(
        f"{what}: gymnasium space {type(space).__name__} is not supported; use Box, Discrete, "
        "MultiDiscrete, MultiBinary or a Dict of them"
    )


def gymnasium_fields(observation_space: Any, action_space: Any) -> dict[NestedKey, Field]:
    """The transition fields of an env with these spaces, in spec order.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> list(gymnasium_fields(env.observation_space, env.action_space))
        ['obs', 'action', 'reward', 'terminated', 'truncated', ('next', 'obs')]
    """
    obs: dict[NestedKey, Field] = {}
    _space_fields(observation_space, ("obs",), obs, "observation_space")
    act: dict[NestedKey, Field] = {}
    _space_fields(action_space, ("action",), act, "action_space")
    fields: dict[NestedKey, Field] = {**obs, **act}
    fields["reward"] = Field((), torch.float32)
    fields["terminated"] = Field((), torch.bool)
    fields["truncated"] = Field((), torch.bool)
    for key, field in obs.items():
        fields[("next",) + ((key,) if isinstance(key, str) else key)] = field
    return fields


def torchrl_fields(composite: Any) -> dict[NestedKey, Field]:
    """Every leaf of a ``torchrl.data.Composite``, without the batch dims.

    Raises:
        SpecError: ``composite`` is not a Composite (or torchrl's old CompositeSpec), or
            has no leaves.
    """
    data = require("torchrl.data", "torchrl")
    composite_cls = getattr(data, "Composite", None) or data.CompositeSpec
    if not isinstance(composite, composite_cls):
        raise SpecError(f"from_torchrl: expected a torchrl Composite, got {type(composite).__name__}")
    lead = len(composite.shape)
    fields: dict[NestedKey, Field] = {}
    for key in composite.keys(include_nested=True, leaves_only=True):
        leaf = composite[key]
        fields[key] = Field(tuple(leaf.shape[lead:]), leaf.dtype)
    if not fields:
        raise SpecError("from_torchrl: the Composite has no leaf specs")
    return fields
