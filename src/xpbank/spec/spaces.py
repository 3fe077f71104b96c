"""Specs from environment descriptions: gymnasium spaces and TorchRL ``Composite`` specs.

A transition spec holds ``obs``, ``action``, ``reward`` (float32), ``terminated`` and
``truncated`` (bool, kept apart: returns bootstrap on truncation, never on termination)
and ``("next", "obs")``. A ``Dict`` observation space nests: ``("obs", "image")`` and
``("next", "obs", "image")``. The fields are read in :mod:`xpbank.spec.space_fields`;
these functions are :meth:`Spec.from_gymnasium <xpbank.Spec.from_gymnasium>` and
:meth:`Spec.from_torchrl <xpbank.Spec.from_torchrl>`.
"""

from __future__ import annotations

from typing import Any

from xpbank.spec.space_fields import field_from_space
from xpbank.spec.spec import Spec

__all__ = ["spec_from_gymnasium", "spec_from_torchrl", "field_from_space"]


def spec_from_gymnasium(observation_space: Any, action_space: Any) -> Spec:
    """The transition spec of an env with these spaces.

    Example:
        >>> import gymnasium as gym
        >>> env = gym.make("CartPole-v1")
        >>> spec_from_gymnasium(env.observation_space, env.action_space)["action"]
        Field(shape=(), dtype=torch.int64)
    """
    return Spec.from_gymnasium(observation_space, action_space)


def spec_from_torchrl(composite: Any) -> Spec:
    """A spec from a ``torchrl.data.Composite``: every leaf, without the batch dims.

    Raises:
        SpecError: ``composite`` is not a Composite (or torchrl's old CompositeSpec).
    """
    return Spec.from_torchrl(composite)
