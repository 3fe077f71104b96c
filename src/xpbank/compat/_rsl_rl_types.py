"""The step and minibatch containers of rsl_rl's storage (:mod:`xpbank.compat.rsl_rl`)."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDict

__all__ = ["Transition", "Batch"]


class Transition:
    """One step of every env, filled in by the algorithm and passed to ``add_transition``.

    rsl_rl's fields, plus two optional ones for time-outs bootstrapped right:
    ``time_outs`` (``[E]`` bool, the episode was cut by a time limit; ``dones`` is set
    there too) and ``final_values`` (``[E]``, the critic's value of the true final
    observation, read where ``time_outs``). rsl_rl's own ``Transition`` works as well.

    Example:
        >>> t = Transition(); t.values is None and t.hidden_states == (None, None)
        True
    """

    def __init__(self) -> None:
        self.observations: TensorDict | None = None
        self.actions: torch.Tensor | None = None
        self.rewards: torch.Tensor | None = None
        self.dones: torch.Tensor | None = None
        self.values: torch.Tensor | None = None
        self.actions_log_prob: torch.Tensor | None = None
        self.distribution_params: tuple[torch.Tensor, ...] | None = None
        self.privileged_actions: torch.Tensor | None = None
        self.hidden_states: tuple[Any, Any] = (None, None)
        self.time_outs: torch.Tensor | None = None
        self.final_values: torch.Tensor | None = None

    def clear(self) -> None:
        """Reset all fields to ``None``."""
        self.__init__()  # type: ignore[misc]


class Batch:
    """A minibatch as rsl_rl's generators yield it (fields ``None`` where not used).

    Example:
        >>> Batch(actions=None).masks is None
        True
    """

    def __init__(
        self,
        observations: TensorDict | None = None,
        actions: torch.Tensor | None = None,
        values: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        returns: torch.Tensor | None = None,
        old_actions_log_prob: torch.Tensor | None = None,
        old_distribution_params: tuple[torch.Tensor, ...] | None = None,
        hidden_states: tuple[Any, Any] = (None, None),
        masks: torch.Tensor | None = None,
        privileged_actions: torch.Tensor | None = None,
        dones: torch.Tensor | None = None,
    ) -> None:
        self.observations = observations
        self.actions = actions
        self.values = values
        self.advantages = advantages
        self.returns = returns
        self.old_actions_log_prob = old_actions_log_prob
        self.old_distribution_params = old_distribution_params
        self.hidden_states = hidden_states
        self.masks = masks
        self.privileged_actions = privileged_actions
        self.dones = dones
