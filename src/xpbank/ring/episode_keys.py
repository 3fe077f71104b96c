"""Which fields of a batch say where an item came from and how its episode ends.

:class:`EpisodeKeys` names the fields (found by the usual names when not given); the
``read_*`` functions turn a validated batch's field into NumPy arrays for
:class:`~xpbank.EpisodeIndex`, checking what the spec cannot (env ids in range).

Example:
    >>> import torch
    >>> read_flag({"done": torch.tensor([0, 1])}, "done", 2).tolist()
    [False, True]
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError
from xpbank.spec.spec import NestedKey, Spec, key_str, normalize_key

__all__ = ["MAX_ENV_ID", "EpisodeKeys", "read_env_ids", "read_flag", "wants_episodes"]

MAX_ENV_ID = 1 << 20  # env ids beyond this need num_envs (per-env state is an array)
_BOOL = np.dtype(bool)

_TERMINATED = (("next", "terminated"), "terminated")
_TRUNCATED = (("next", "truncated"), "truncated")
_DONE = (("next", "done"), "done")


@dataclass(frozen=True)
class EpisodeKeys:
    """Which fields say an item's env and how its episode ends.

    ``None`` finds the field by its usual names: ``("next", "terminated")`` or
    ``"terminated"``, ``("next", "truncated")`` or ``"truncated"``; without either, a
    ``"done"`` (or ``("next", "done")``) field counts as a termination (no bootstrap).
    A field that is absent under every name means "never ends".

    Example:
        >>> EpisodeKeys(terminated="term").terminated
        'term'
    """

    env: Any = "env_id"
    terminated: Any = None
    truncated: Any = None
    done: Any = None

    def resolve(self, spec: Spec) -> tuple[NestedKey | None, NestedKey | None]:
        """``(terminated_key, truncated_key)`` found in ``spec`` (``None``: absent).

        Raises:
            SpecError: a key named explicitly is not in ``spec``.
        """
        for name in ("terminated", "truncated", "done"):
            given = getattr(self, name)
            if given is not None and normalize_key(given) not in spec:
                raise SpecError(
                    f"episode_keys.{name}: field {key_str(normalize_key(given))!r} is not in the "
                    f"spec; known: {[key_str(k) for k in spec]}"
                )
        term = _find(spec, self.terminated, _TERMINATED)
        trunc = _find(spec, self.truncated, _TRUNCATED)
        if term is None and trunc is None:
            term = _find(spec, self.done, _DONE)
        return term, trunc

    def config(self) -> dict[str, Any]:
        """The fields as JSON-able values (nested keys as lists): a bank stores this and
        ``EpisodeKeys.from_config`` rebuilds it.

        Example:
            >>> EpisodeKeys.from_config(EpisodeKeys(terminated=("next", "term")).config())
            EpisodeKeys(env='env_id', terminated=('next', 'term'), truncated=None, done=None)
        """
        return {name: list(v) if isinstance(v, tuple) else v for name, v in vars(self).items()}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> EpisodeKeys:
        """The inverse of :meth:`config` (lists become nested-key tuples)."""
        return cls(**{name: tuple(v) if isinstance(v, list) else v for name, v in config.items()})


def _find(spec: Spec, given: Any, names: tuple[NestedKey, ...]) -> NestedKey | None:
    if given is not None:
        return normalize_key(given)
    return next((k for k in names if k in spec), None)


def wants_episodes(spec: Spec | None, keys: EpisodeKeys, num_envs: int | None, needed: bool) -> bool:
    """Whether a buffer keeps an index: asked for, or its items carry an env field."""
    return needed or num_envs is not None or (spec is not None and normalize_key(keys.env) in spec)


_ONE_FLAG = (np.zeros(1, dtype=bool), np.ones(1, dtype=bool))
for _flag in _ONE_FLAG:
    _flag.flags.writeable = False  # shared by every one-item write: never changed


def read_flag(flat: Mapping[NestedKey, Any], key: NestedKey | None, n: int) -> np.ndarray:
    """Each item's episode-end flag from field ``key`` as bool (all False without one).

    The field is a tensor, a NumPy array, or one item's number (NumPy or Python); the
    array returned may be a view of it, or shared and read-only.

    Raises:
        SpecError: not one flag per item.
    """
    if key is None:
        return np.zeros(n, dtype=bool)
    value = flat[key]
    if type(value) is np.ndarray:
        arr = value
    elif not isinstance(value, torch.Tensor):  # a number: one item
        if n != 1:
            raise SpecError(f"field {key_str(key)!r}: expected one episode-end flag per item, got one number")
        return _ONE_FLAG[bool(value != 0)]
    else:
        try:
            arr = value.numpy()  # the common case, a plain CPU tensor: no copy (the write copies)
        except (RuntimeError, TypeError):  # requires grad, or not on the CPU
            arr = value.detach().cpu().numpy()
    if arr.size != n:
        raise SpecError(
            f"field {key_str(key)!r}: expected one episode-end flag per item, got {tuple(value.shape)}"
        )
    if arr.ndim != 1:
        arr = arr.reshape(n)
    return arr if arr.dtype is _BOOL else arr != 0


def read_env_ids(value: torch.Tensor, key: NestedKey, n: int, limit: int) -> np.ndarray:
    """The env id of each of ``n`` items from its field, checked to lie in ``[0, limit)``.

    Raises:
        SpecError: not integers, not one per item, or out of range.
    """
    if value.dtype.is_floating_point or value.dtype == torch.bool or value.dtype.is_complex:
        raise SpecError(f"field {key_str(key)!r} (env id): expected an integer dtype, got {value.dtype}")
    env = value.detach().cpu().reshape(n, -1)
    if env.shape[1] != 1:
        raise SpecError(
            f"field {key_str(key)!r} (env id): expected one id per item, got shape {tuple(value.shape)}"
        )
    arr = env.numpy()[:, 0].astype(np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= limit):
        bad = int(arr[(arr < 0) | (arr >= limit)][0])
        raise SpecError(f"field {key_str(key)!r} (env id): expected ids in [0, {limit}), got {bad}")
    return arr
