"""Collect correct transitions from a gymnasium vector env into a buffer.

A :class:`Collector` steps a ``gymnasium.vector.VectorEnv`` (``SyncVectorEnv`` or
``AsyncVectorEnv``) with a policy and hands each vector step to a :class:`Sink`. Every
row it hands over is one real transition of one sub-env:

* ``("next", "obs")`` is the TRUE next observation, also at an episode end (the final
  observation, never the first observation of the next episode);
* ``terminated`` and ``truncated`` are kept apart (bootstrap on truncation only);
* the env's autoreset mode, read from ``envs.metadata["autoreset_mode"]``, is honoured:

  - ``NEXT_STEP`` (gymnasium's default): the step after an episode end only resets that
    sub-env; its row is marked invalid and never stored;
  - ``SAME_STEP``: the step that ends an episode already returns the reset observation,
    and the final one comes from ``infos["final_obs"]``;
  - ``DISABLED``: the collector resets finished sub-envs itself
    (``envs.reset(options={"reset_mask": done})``).

  An env whose metadata has no autoreset mode is taken to use NEXT_STEP, and a step
  that contradicts it raises :class:`~xpbank.EnvContractError`.

For on-policy learning a ``value_fn`` adds ``("next", "value")``: the value of the true
next observation, which is what GAE must bootstrap from at a truncation.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np
import torch

from xpbank.collect.sinks import ReplaySink, RolloutSink, Sink
from xpbank.errors import BatchTypeError, EnvContractError, check_positive_int
from xpbank.spec.spec import NestedKey

__all__ = ["Collector", "Episode", "ReplaySink", "RolloutSink", "Sink", "autoreset_mode"]

log = logging.getLogger(__name__)

Policy = Callable[[torch.Tensor], Any]
"""``obs [E, ...] -> actions [E, ...]``, or ``(actions, {name: [E] tensor})`` to store extras."""


class Mode(str, Enum):
    """Gymnasium's autoreset modes, by the values of ``gymnasium.vector.AutoresetMode``."""

    NEXT_STEP = "NextStep"
    SAME_STEP = "SameStep"
    DISABLED = "Disabled"


def autoreset_mode(envs: Any) -> tuple[Mode, bool]:
    """The autoreset mode ``envs`` declares, and whether it declared one at all.

    Example:
        >>> import gymnasium as gym
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync",
        ...                     vector_kwargs={"autoreset_mode": "SameStep"})
        >>> autoreset_mode(envs)
        (<Mode.SAME_STEP: 'SameStep'>, True)
    """
    value = getattr(envs, "metadata", {}).get("autoreset_mode")
    if value is None:
        return Mode.NEXT_STEP, False
    raw = getattr(value, "value", value)
    try:
        return Mode(raw), True
    except ValueError:
        raise EnvContractError(
            f"envs.metadata['autoreset_mode']: expected one of {[m.value for m in Mode]}, got {value!r}"
        ) from None


@dataclass(frozen=True)
class Episode:
    """One finished episode of one sub-env."""

    env: int
    ret: float
    length: int
    truncated: bool


class Collector:
    """Steps a gymnasium vector env with a policy and writes transitions to a sink.

    Args:
        envs: a gymnasium 1.x vector env with array observations.
        policy: ``obs -> actions`` (tensors in, tensor or array out); it may also return
            ``(actions, extras)`` with ``extras`` a dict of ``[E]``-leading tensors,
            stored with the step (log-probs, values ...).
        sink: a :class:`Sink`, or a buffer with ``extend`` (wrapped in a
            :class:`ReplaySink`).
        value_fn: ``next_obs -> values [E]``; adds ``("next", "value")`` computed on the
            true next observations (the final one at an episode end).

    Example:
        >>> import gymnasium as gym, torch, xpbank
        >>> envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")
        >>> rb = xpbank.ReplayBuffer(100)
        >>> c = Collector(envs, lambda obs: torch.zeros(len(obs), dtype=torch.int64), rb)
        >>> c.reset(seed=0)
        >>> c.collect(30)  # pushing left ends episodes quickly
        >>> len(rb) == c.transitions and all(e.length > 0 for e in c.episodes)
        True
    """

    def __init__(self, envs: Any, policy: Policy, sink: Any, value_fn: Policy | None = None):
        self.envs = envs
        self.policy = policy
        self.sink: Sink = sink if isinstance(sink, Sink) else ReplaySink(sink)
        self.value_fn = value_fn
        self.mode, self.declared = autoreset_mode(envs)
        self.num_envs = int(envs.num_envs)
        self.episodes: list[Episode] = []
        self.transitions = 0
        self.vector_steps = 0
        self._obs: np.ndarray | None = None
        self._pending = np.zeros(self.num_envs, dtype=bool)  # NEXT_STEP: resets on the next step
        self._ret = np.zeros(self.num_envs)
        self._len = np.zeros(self.num_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> None:
        """Reset every sub-env (``seed`` seeds sub-env ``e`` with ``seed + e``)."""
        obs, _ = self.envs.reset(seed=seed)
        self._obs = _as_array(obs)
        self._pending[:] = False
        self._ret[:] = 0.0
        self._len[:] = 0

    def episodes_by_env(self) -> list[list[Episode]]:
        """The finished episodes (return, length, truncated) of each sub-env, oldest first."""
        out: list[list[Episode]] = [[] for _ in range(self.num_envs)]
        for episode in self.episodes:
            out[episode.env].append(episode)
        return out

    def collect(self, steps: int) -> None:
        """Run ``steps`` vector steps (``steps * num_envs`` env steps, fewer transitions
        when NEXT_STEP resets are skipped)."""
        check_positive_int("steps", steps)
        if self._obs is None:
            self.reset()
        for _ in range(steps):
            self._step()

    def _step(self) -> None:
        assert self._obs is not None  # collect() resets first
        obs_t = torch.from_numpy(self._obs)
        actions, extras = _split(self.policy(obs_t))
        act = actions.detach().cpu().numpy() if isinstance(actions, torch.Tensor) else np.asarray(actions)
        next_obs, reward, term, trunc, infos = self.envs.step(act)
        next_obs, reward = _as_array(next_obs), np.asarray(reward, dtype=np.float32)
        term, trunc = np.asarray(term, dtype=bool), np.asarray(trunc, dtype=bool)
        valid = ~self._pending
        true_next = self._check_and_final_obs(next_obs, reward, term, trunc, infos, valid)
        done = (term | trunc) & valid

        step: dict[NestedKey, torch.Tensor] = {
            "obs": obs_t,
            "action": torch.as_tensor(act),
            "reward": torch.from_numpy(reward),
            "terminated": torch.from_numpy(term),
            "truncated": torch.from_numpy(trunc),
            ("next", "obs"): torch.from_numpy(true_next),
        }
        step.update(extras)
        if self.value_fn is not None:
            with torch.no_grad():
                step[("next", "value")] = torch.as_tensor(self.value_fn(step[("next", "obs")]))
        self.sink.write(step, torch.from_numpy(valid))

        self._track(reward, done, trunc, valid)
        if self.mode is Mode.DISABLED and done.any():
            next_obs = _as_array(self.envs.reset(options={"reset_mask": done})[0])
        self._pending = done if self.mode is Mode.NEXT_STEP else np.zeros_like(done)
        self._obs = next_obs
        self.vector_steps += 1
        self.transitions += int(valid.sum())

    def _check_and_final_obs(
        self,
        next_obs: np.ndarray,
        reward: np.ndarray,
        term: np.ndarray,
        trunc: np.ndarray,
        infos: dict[str, Any],
        valid: np.ndarray,
    ) -> np.ndarray:
        """The true next observations; raise if the step contradicts the autoreset mode."""
        done = term | trunc
        has_final = "final_obs" in infos
        assumed = "" if self.declared else " (the env declares no autoreset_mode, so gymnasium's default"
        assumed += "" if self.declared else " NEXT_STEP was assumed; set envs.metadata['autoreset_mode'])"
        if self.mode is not Mode.SAME_STEP and has_final:
            raise EnvContractError(
                f"step {self.vector_steps}: infos has 'final_obs', which only a SAME_STEP env "
                f"returns, but the mode is {self.mode.name}{assumed}"
            )
        if self.mode is Mode.NEXT_STEP:
            bad = ~valid & (done | (reward != 0))
            if bad.any():
                e = int(np.flatnonzero(bad)[0])
                raise EnvContractError(
                    f"step {self.vector_steps}, sub-env {e}: expected a NEXT_STEP reset step "
                    f"(reward 0, not terminated or truncated) after its episode ended, got "
                    f"reward {reward[e]}, terminated {term[e]}, truncated {trunc[e]}{assumed}"
                )
            return next_obs
        if self.mode is Mode.DISABLED or not done.any():
            return next_obs
        mask = np.asarray(infos.get("_final_obs", np.zeros(len(done), dtype=bool)), dtype=bool)
        if not has_final or not np.array_equal(mask, done):
            raise EnvContractError(
                f"step {self.vector_steps}: SAME_STEP sub-env(s) {np.flatnonzero(done).tolist()} "
                f"ended but infos['_final_obs'] marks {np.flatnonzero(mask).tolist()}"
            )
        true_next = next_obs.copy()
        for i in np.flatnonzero(done):
            true_next[i] = infos["final_obs"][i]
        return true_next

    def _track(self, reward: np.ndarray, done: np.ndarray, trunc: np.ndarray, valid: np.ndarray) -> None:
        self._ret += np.where(valid, reward, 0.0)
        self._len += valid
        for e in np.flatnonzero(done):
            self.episodes.append(Episode(int(e), float(self._ret[e]), int(self._len[e]), bool(trunc[e])))
            log.debug("sub-env %d: episode of %d steps, return %.3f", e, self._len[e], self._ret[e])
        self._ret[done] = 0.0
        self._len[done] = 0


def _split(out: Any) -> tuple[Any, dict[NestedKey, torch.Tensor]]:
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        return out[0], {k: torch.as_tensor(v).detach() for k, v in out[1].items()}
    return out, {}


def _as_array(obs: Any) -> np.ndarray:
    if not isinstance(obs, np.ndarray):
        raise BatchTypeError(
            f"collect: expected array observations (a Box, Discrete ... space), got "
            f"{type(obs).__name__}; dict and tuple observation spaces are not supported yet"
        )
    return obs
