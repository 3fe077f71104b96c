"""An rsl_rl ``Transition`` as one flat xpbank step (for :mod:`xpbank.compat.rsl_rl`).

Field names: ``("obs", group)``, ``actions``, ``rewards`` / ``dones`` / ``values`` /
``actions_log_prob`` as ``[E, 1]`` (rsl_rl's shapes), ``("distribution_params", i)``,
``("hidden_a" | "hidden_c", i)`` as ``[E, layers, H]`` (rsl_rl's ``[layers, E, H]``
transposed, so every field leads with the env), and for time-outs ``time_outs``,
``terminated`` (``dones`` without the time-outs) and ``final_values``.
"""

from __future__ import annotations

from typing import Any

import torch

from xpbank.errors import SpecError
from xpbank.spec.batch import flatten
from xpbank.spec.spec import NestedKey, key_str

__all__ = ["transition_step", "time_out_fields", "gives_time_outs", "obs_fields", "is_hidden"]


def transition_step(
    tr: Any, training_type: str, num_envs: int, time_outs: bool = False
) -> dict[NestedKey, torch.Tensor]:
    """The flat step of ``tr`` (views where the dtype is already right; nothing is copied);
    with ``time_outs``, its time-out fields too (:func:`time_out_fields`).

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from xpbank.compat.rsl_rl import Transition
        >>> tr = Transition()
        >>> tr.observations = TensorDict({"policy": torch.zeros(2, 3)}, [2])
        >>> tr.actions, tr.rewards, tr.dones = torch.zeros(2, 1), torch.ones(2), torch.zeros(2)
        >>> tr.privileged_actions = torch.ones(2, 1)
        >>> sorted(str(k) for k in transition_step(tr, "distillation", 2))
        ["('obs', 'policy')", 'actions', 'dones', 'privileged_actions', 'rewards']
    """
    step: dict[NestedKey, torch.Tensor] = {
        ("obs", *_tuple(k)): v for k, v in obs_fields(_need(tr, "observations"), num_envs).items()
    }
    step["actions"] = _need(tr, "actions").float()
    step["rewards"] = _need(tr, "rewards").float().reshape(-1, 1)
    dones = _need(tr, "dones").reshape(-1, 1)
    step["dones"] = dones.to(torch.uint8)
    if training_type == "distillation":
        step["privileged_actions"] = _need(tr, "privileged_actions").float()
    else:
        step["values"] = _need(tr, "values").float().reshape(-1, 1)
        step["actions_log_prob"] = _need(tr, "actions_log_prob").float().reshape(-1, 1)
        params = tuple(_need(tr, "distribution_params"))
        step.update({("distribution_params", str(i)): p.float() for i, p in enumerate(params)})
        if time_outs:
            step.update(time_out_fields(tr))
    for part, state in zip("ac", getattr(tr, "hidden_states", (None, None)), strict=True):
        if state is None:
            continue
        states = state if isinstance(state, tuple) else (state,)
        step.update({(f"hidden_{part}", str(i)): h.transpose(0, 1) for i, h in enumerate(states)})
    return step


def gives_time_outs(tr: Any) -> bool:
    """Whether ``tr`` sets xpbank's time-out fields (``time_outs`` or ``final_values``)."""
    return getattr(tr, "time_outs", None) is not None or getattr(tr, "final_values", None) is not None


def time_out_fields(tr: Any) -> dict[NestedKey, torch.Tensor]:
    """``time_outs`` (where ``dones`` too), ``terminated`` (``dones`` without them) and
    ``final_values`` of ``tr``, ``[E, 1]`` float32 (zeros where not given).

    Raises:
        SpecError: an env timed out and ``final_values`` is missing.
    """
    dones = _need(tr, "dones").reshape(-1, 1) != 0
    raw = getattr(tr, "time_outs", None)
    time_outs = dones & (raw.reshape(-1, 1) != 0) if raw is not None else torch.zeros_like(dones)
    final = getattr(tr, "final_values", None)
    if final is None:
        if bool(time_outs.any()):
            raise SpecError(
                "transition.final_values: some envs timed out (time_outs) but no value of their true "
                "final observation was given; bootstrapping them needs it (rsl_rl's V(s_t) is not used)"
            )
        final = torch.zeros(dones.shape, device=dones.device)
    return {
        "time_outs": time_outs.float(),
        "terminated": (dones & ~time_outs).float(),
        "final_values": final.float().reshape(-1, 1),
    }


def is_hidden(key: NestedKey) -> bool:
    """Whether ``key`` is a saved hidden-state field."""
    return isinstance(key, tuple) and key[0] in ("hidden_a", "hidden_c")


def obs_fields(obs: Any, num_envs: int) -> dict[NestedKey, torch.Tensor]:
    """The observation groups of ``obs`` as a flat dict, each leading with ``num_envs``."""
    fields = flatten(obs)
    for key, value in fields.items():
        if value.dim() == 0 or value.shape[0] != num_envs:
            raise SpecError(
                f"observations[{key_str(key)!r}]: expected a leading dim of num_envs={num_envs}, "
                f"got shape {list(value.shape)}"
            )
    return fields


def _tuple(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _need(transition: Any, name: str) -> Any:
    value = getattr(transition, name, None)
    if value is None:
        raise SpecError(f"transition.{name}: this training type stores it, got None")
    return value
