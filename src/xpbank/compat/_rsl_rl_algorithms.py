"""rsl_rl's ``PPO`` and ``Distillation`` on xpbank's storage: the switch for rsl_rl's runners.

rsl_rl's ``OnPolicyRunner`` (and ``DistillationRunner``) build the algorithm from
``train_cfg["algorithm"]["class_name"]`` and build its ``RolloutStorage`` themselves; the
classes here are rsl_rl's algorithms whose storage is replaced by
:class:`xpbank.compat.rsl_rl.RolloutStorage` of the same size, so one config line
switches a runner (and nothing is patched)::

    train_cfg["algorithm"]["class_name"] = "xpbank.compat.rsl_rl:PPO"
    train_cfg["algorithm"]["storage_cfg"] = {"parity": True}  # optional: the storage's options

Imported from :mod:`xpbank.compat.rsl_rl` on first use (it needs rsl-rl-lib).
"""

from __future__ import annotations

from typing import Any

from xpbank.compat import _rsl_rl_returns
from xpbank.compat._rsl_rl_storage import RolloutStorage
from xpbank.errors import MissingExtraError, SpecError

try:
    from rsl_rl.algorithms import PPO as _PPO
    from rsl_rl.algorithms import Distillation as _Distillation
except ImportError as exc:  # pragma: no cover - rsl-rl-lib is a dev dependency
    raise MissingExtraError(
        "xpbank.compat.rsl_rl.PPO / Distillation subclass rsl_rl's algorithms; run: pip install rsl-rl-lib"
    ) from exc

__all__ = ["PPO", "Distillation"]


def xpbank_storage(storage: Any, storage_cfg: dict[str, Any] | None) -> RolloutStorage:
    """``storage`` as an xpbank :class:`RolloutStorage` of the same type, size and layout
    (``storage`` itself if it is one already); ``storage_cfg``: its keyword options
    (``parity``, ``drop_last``, ``seed``)."""
    if isinstance(storage, RolloutStorage):
        if storage_cfg:
            raise SpecError(
                "storage_cfg: the storage is an xpbank RolloutStorage already; set its options there"
            )
        return storage
    obs = storage.observations[0]  # rsl_rl's [T, E] TensorDict of zeros: the groups' layout
    return RolloutStorage(
        storage.training_type, storage.num_envs, storage.num_transitions_per_env, obs,
        storage.actions_shape, storage.device, **(storage_cfg or {}),
    )  # fmt: skip


class PPO(_PPO):
    """rsl_rl's ``PPO``, storing its rollouts in :class:`xpbank.compat.rsl_rl.RolloutStorage`.

    Takes rsl_rl's arguments, plus ``storage_cfg``: the xpbank storage's options (a dict,
    e.g. ``{"parity": True}`` or ``{"seed": 1}``). The ``storage`` given (rsl_rl's, as
    ``OnPolicyRunner`` builds it) is replaced by an xpbank one of the same size; an xpbank
    storage is kept as it is.

    Example:
        >>> train_cfg = {"algorithm": {"class_name": "xpbank.compat.rsl_rl:PPO"}}  # the runner's switch
        >>> from rsl_rl.utils import resolve_callable
        >>> resolve_callable(train_cfg["algorithm"]["class_name"]) is PPO
        True
    """

    def __init__(
        self,
        actor: Any,
        critic: Any,
        storage: Any,
        *args: Any,
        storage_cfg: dict | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(actor, critic, xpbank_storage(storage, storage_cfg), *args, **kwargs)

    def compute_returns(self, obs: Any) -> None:
        """rsl_rl's returns and advantages, bit for bit, in one compiled pass over the
        rollout where that is known to equal rsl_rl's loop (a CPU float32 rollout, this
        rsl_rl version: see :mod:`xpbank.compat._rsl_rl_returns`); rsl_rl's loop otherwise.

        Args:
            obs: the observations after the rollout's last step (the critic's input).

        Threads: as rsl_rl's.
        """
        if not _rsl_rl_returns.compute_returns(self, obs, _PPO.compute_returns):
            super().compute_returns(obs)


class Distillation(_Distillation):
    """rsl_rl's ``Distillation`` on :class:`xpbank.compat.rsl_rl.RolloutStorage`, as :class:`PPO`.

    Example:
        >>> from rsl_rl.utils import resolve_callable
        >>> resolve_callable("xpbank.compat.rsl_rl:Distillation") is Distillation
        True
    """

    def __init__(
        self,
        student: Any,
        teacher: Any,
        storage: Any,
        *args: Any,
        storage_cfg: dict | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(student, teacher, xpbank_storage(storage, storage_cfg), *args, **kwargs)
