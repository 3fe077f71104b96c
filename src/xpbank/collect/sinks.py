"""Where a :class:`~xpbank.Collector` writes: the :class:`Sink` protocol and its two sinks.

* :class:`ReplaySink` extends a :class:`~xpbank.ReplayBuffer` with the valid rows of each
  step and tags every row with its sub-env (an ``env_id`` field), so the buffer's
  :class:`~xpbank.EpisodeIndex` links each env's items even when NEXT_STEP reset rows
  leave the envs out of step (n-step windows then never cross envs or episodes).
* :class:`RolloutSink` stores each step into a :class:`~xpbank.RolloutBuffer`, every env
  at its own cursor (``store(batch, env_ids)``), and bootstraps GAE from the values of
  the true next observations the collector computed.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.spec.spec import NestedKey, key_str, normalize_key

__all__ = ["Sink", "ReplaySink", "RolloutSink", "NEXT_VALUE"]

NEXT_VALUE: NestedKey = ("next", "value")
"""The field a collector's ``value_fn`` fills: the value of the true next observation."""


@runtime_checkable
class Sink(Protocol):
    """Where a :class:`~xpbank.Collector` writes: one call per vector step.

    ``step`` holds one row per sub-env (``[E, ...]`` tensors): ``obs``, ``action``,
    ``reward`` (float32), ``terminated``, ``truncated``, ``("next", "obs")``, the
    policy's extras and, with a ``value_fn``, ``("next", "value")``. ``valid[e]`` is
    False for a sub-env whose row is not a transition (the reset step of a NEXT_STEP
    env); such a row must not be learned from.
    """

    def write(self, step: dict[NestedKey, torch.Tensor], valid: torch.Tensor) -> None: ...


class ReplaySink:
    """Writes the valid rows of each step into a :class:`~xpbank.ReplayBuffer` (``extend``).

    Every row gets an ``env_key`` field (default ``"env_id"``, the name
    :class:`~xpbank.EpisodeKeys` looks for) holding its sub-env, so the buffer keeps a
    correct per-env episode index also when NEXT_STEP reset rows are skipped. It is added
    when the buffer's spec has that field or is not fixed yet; a buffer whose spec lacks
    it gets none (add ``Field((), torch.int64)`` under that name to keep env ids).

    Example:
        >>> import torch, xpbank
        >>> rb = xpbank.ReplayBuffer(10)
        >>> ReplaySink(rb).write({"x": torch.arange(3.0)}, torch.tensor([True, False, True]))
        >>> rb.sample_all()["x"].tolist(), rb.sample_all()["env_id"].tolist()
        ([0.0, 2.0], [0, 2])
    """

    def __init__(self, buffer: Any, env_key: NestedKey = "env_id"):
        self.buffer = buffer
        self.env_key = normalize_key(env_key)
        self._env_ids = torch.zeros(0, dtype=torch.int64)

    def write(self, step: dict[NestedKey, torch.Tensor], valid: torch.Tensor) -> None:
        spec = self.buffer.spec
        if spec is None or self.env_key in spec:
            if self._env_ids.shape[0] != valid.shape[0]:
                self._env_ids = torch.arange(valid.shape[0], dtype=torch.int64)
            step = {**step, self.env_key: self._env_ids}
        if bool(valid.all()):
            self.buffer.extend(step)
        elif bool(valid.any()):
            if self.env_key not in step and _lockstep_envs(self.buffer) > 1:
                raise SpecError(
                    f"ReplaySink: sub-env(s) {np.flatnonzero(~valid.cpu().numpy()).tolist()} are "
                    f"resetting (not transitions), so this step is not a whole step of the buffer's "
                    f"num_envs={_lockstep_envs(self.buffer)} envs; give its spec a "
                    f"{key_str(self.env_key)!r} field (int64) so each item says its env"
                )
            self.buffer.extend({key: value[valid] for key, value in step.items()})


def _lockstep_envs(buffer: Any) -> int:
    """``num_envs`` of a buffer whose episode index expects whole env steps (else 0)."""
    return int(getattr(getattr(buffer, "episodes", None), "num_envs", None) or 0)


class RolloutSink:
    """Stores each collected step into a :class:`~xpbank.RolloutBuffer`; GAE from its values.

    NEXT_STEP reset rows are not transitions: only the valid rows are stored, each env at
    its own cursor (``rollout.store(rows, env_ids)``), so envs may be out of step. Collect
    until :meth:`ready`; a valid row of an env whose column is already full is not stored
    (counted in ``dropped``): that column ends one step earlier and bootstraps from the
    value of its last stored step's next observation, which is exactly right for GAE.

    The collector's ``("next", "value")`` (its ``value_fn`` on the TRUE next observation)
    is stored as the rollout's ``keys.final_value`` field, which
    :meth:`~xpbank.RolloutBuffer.compute_returns` reads at truncated steps; the same value
    at each env's last stored step is the bootstrap at the end of the rollout
    (:attr:`last_values`). The policy must return the current value as an extra named
    ``keys.value`` (``"value"``).

    Example:
        >>> import gymnasium as gym, torch, xpbank
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
        >>> sink = RolloutSink(xpbank.RolloutBuffer(num_envs=2, horizon=4))
        >>> value = lambda obs: obs[:, 0]
        >>> act = lambda obs: (torch.zeros(len(obs), dtype=torch.int64), {"value": value(obs)})
        >>> c = xpbank.Collector(envs, act, sink, value_fn=value)
        >>> c.reset(seed=0)
        >>> while not sink.ready():
        ...     c.collect(1)
        >>> adv, ret = sink.compute_returns(gamma=0.99, lam=0.95)
        >>> adv.shape
        torch.Size([4, 2])
    """

    def __init__(self, rollout: Any):
        self.rollout = rollout
        self.final_key = normalize_key(rollout.keys.final_value)
        self.dropped = 0
        self.last_values = torch.zeros(rollout.num_envs)

    def ready(self) -> bool:
        """True when every env's column is full (then compute returns, learn, :meth:`clear`)."""
        return bool(self.rollout.ready())

    def write(self, step: dict[NestedKey, torch.Tensor], valid: torch.Tensor) -> None:
        if NEXT_VALUE not in step:
            raise SpecError(
                "RolloutSink: the step has no ('next', 'value'): build the Collector with a "
                "value_fn, the bootstrap of GAE at truncations and at the rollout's end"
            )
        rows = {k: v for k, v in step.items() if k != NEXT_VALUE}
        rows[self.final_key] = step[NEXT_VALUE]
        keep = valid.cpu() & self.rollout.room()
        self.dropped += int((valid.cpu() & ~keep).sum())
        if bool(keep.all()):
            self.rollout.add(rows)
        elif bool(keep.any()):
            ids = torch.from_numpy(np.flatnonzero(keep.numpy()))
            self.rollout.store({k: v[keep.to(v.device)] for k, v in rows.items()}, ids)
        else:
            return
        self.last_values[keep] = step[NEXT_VALUE].detach().to("cpu", torch.float32)[keep]

    def compute_returns(
        self, gamma: float = 0.99, lam: float = 0.95, normalize: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the full rollout (see :meth:`~xpbank.RolloutBuffer.compute_returns`)."""
        return self.rollout.compute_returns(self.last_values, gamma, lam, normalize=normalize)

    def clear(self) -> None:
        """Start the next rollout."""
        self.rollout.clear()
