"""rsl_rl's ``RolloutStorage`` (rsl-rl-lib 5.x) on an xpbank :class:`~xpbank.RolloutBuffer`.

Switch with one import line; rsl_rl's own ``PPO`` and ``Distillation`` take it as their
``storage``::

    from xpbank.compat.rsl_rl import RolloutStorage  # was: from rsl_rl.storage import RolloutStorage

or, for rsl_rl's ``OnPolicyRunner`` (which builds the storage itself), one config line:
``train_cfg["algorithm"]["class_name"] = "xpbank.compat.rsl_rl:PPO"`` (:class:`PPO`, rsl_rl's
PPO on this storage; ``"xpbank.compat.rsl_rl:Distillation"`` for the distillation runner).

The steps live in one ``[T, E]`` :class:`~xpbank.RolloutBuffer` (slot ``t * E + e``), a
contiguous block per field; ``observations``, ``actions``, ``rewards``, ``dones``,
``values``, ``returns``, ``advantages`` ... are views into it, laid out as rsl_rl's, so
``storage.returns[t] = ...`` (what rsl_rl's ``PPO.compute_returns`` does) writes the
buffer; ``storage.advantages = ...`` rebinds them, as in rsl_rl. Runs after the same
``torch.manual_seed`` repeat (an unseeded storage seeds from torch's generator).
Deliberate differences (``docs/compat/rsl_rl.md``): a fresh permutation every epoch and
no step left out, unless ``parity=True`` (rsl_rl's exact order from torch's global RNG,
bit for bit) or ``drop_last=True``; :meth:`RolloutStorage.compute_returns` bootstraps
time-outs from the value of the true final observation, ``V(s_{t+1})``, where rsl_rl's
PPO adds ``gamma * V(s_t)`` to the reward; errors are xpbank errors, raised before
anything is written.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from xpbank.compat._rsl_rl_storage import KEYS, RolloutStorage
from xpbank.compat._rsl_rl_types import Batch, Transition

if TYPE_CHECKING:  # imported on first use: they subclass rsl_rl's algorithms (rsl-rl-lib)
    from xpbank.compat._rsl_rl_algorithms import PPO, Distillation

__all__ = ["RolloutStorage", "Transition", "Batch", "PPO", "Distillation", "KEYS"]


def __getattr__(name: str) -> Any:
    """``PPO`` and ``Distillation`` import rsl_rl: only when asked for."""
    if name in ("PPO", "Distillation"):
        from xpbank.compat import _rsl_rl_algorithms

        return getattr(_rsl_rl_algorithms, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
