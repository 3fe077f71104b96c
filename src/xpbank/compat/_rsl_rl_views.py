"""The tensors of :mod:`xpbank.compat.rsl_rl`'s storage as views of its buffer, and the
write of one transition straight into them.

The buffer keeps a block per field (``RolloutBuffer(pack=False)``), so every view is a
contiguous ``[T, E, ...]`` tensor, as rsl_rl's own: ``PPO.compute_returns`` does the
same arithmetic on the same memory layout. :meth:`Views.write` checks a whole transition,
then copies each field into step ``t`` (NumPy assignments on the CPU: a fraction of
torch's per-call cost), and lets the buffer count the step (:meth:`RolloutBuffer.advance`).
Anything it does not expect (a missing field, another shape or dtype, a new hidden state
or time-out field) it leaves to the storage's checked path, which stores it or raises.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from xpbank.compat._rsl_rl_steps import gives_time_outs
from xpbank.errors import NotReadyError, SpecError
from xpbank.rollout import RolloutBuffer
from xpbank.rollout.direct import host
from xpbank.spec.batch import to_tensordict
from xpbank.spec.spec import NestedKey

__all__ = ["Views", "ATTRIBUTES", "missing", "SCALARS", "TIME_OUT_FIELDS"]

SCALARS = ("rewards", "dones", "values", "actions_log_prob")  # one number per env: [T, E, 1]
_FULL = ("actions", "privileged_actions")
TIME_OUT_FIELDS = ("time_outs", "terminated", "final_values")


# rsl_rl's storage attributes (documented on the storage): set on it once its layout is
# fixed, plain instance attributes as cheap to read as rsl_rl's; until then ``missing``
# answers for them (True: rsl_rl's is ``None`` then too).
ATTRIBUTES = {
    **dict.fromkeys(("observations", "actions", "rewards", "dones", "values", "actions_log_prob"), False),
    **dict.fromkeys(("privileged_actions", "time_outs", "returns"), False),
    **dict.fromkeys(("distribution_params", "saved_hidden_state_a", "saved_hidden_state_c"), True),
}


def missing(name: str, laid_out: bool) -> Any:
    """What reading storage attribute ``name`` gives while it is not set: ``None`` where
    rsl_rl's is ``None`` too; else :class:`~xpbank.NotReadyError` (no layout yet) or
    :class:`~xpbank.SpecError` (the layout has no such field).

    Raises:
        AttributeError: ``name`` is none of rsl_rl's storage attributes.
    """
    none_before = ATTRIBUTES.get(name)
    if none_before is None:
        raise AttributeError(f"RolloutStorage has no attribute {name!r}")
    if none_before:
        return None
    if laid_out:
        raise SpecError(f"{name}: this storage holds no such field (its training type or layout)")
    raise NotReadyError(f"{name}: no transition stored yet; the layout is fixed by the first add_transition")


class Views:
    """rsl_rl's attributes of a storage as views of ``rb`` (a ``[T, E]`` unpacked buffer).

    Args:
        rb: the buffer, its layout fixed.
        num_params: distribution parameters per step.
        hidden: the hidden-state fields of the actor (``"a"``) and critic (``"c"``).
    """

    def __init__(self, rb: RolloutBuffer, num_params: int, hidden: dict[str, list[NestedKey]]):
        spec = rb.spec
        assert spec is not None  # made once a transition is stored
        t, e = rb.shape
        self.shape = (t, e)
        self.rb = rb
        self.obs = {
            (k[1:] if len(k) > 2 else k[1]): rb.view(k)
            for k in spec
            if isinstance(k, tuple) and k[0] == "obs"
        }
        self.observations: TensorDict = to_tensordict(self.obs, (t, e), rb.device)
        self.fields = {k: rb.view(k) for k in spec if isinstance(k, str)}  # rewards ...: [T, E, 1]
        self.dist = [rb.view(("distribution_params", str(i))) for i in range(num_params)]
        self.hidden = {part: [rb.view(k) for k in keys] for part, keys in hidden.items()}  # [T, E, L, H]
        self.returns = rb.view("return").unsqueeze(-1)
        self.advantages = rb.view("advantage").unsqueeze(-1)
        self.time_outs = "time_outs" in spec
        self.is_host = rb.device.type == "cpu"
        # where write() puts each field: NumPy arrays on the CPU, else the torch views
        put: Callable[[torch.Tensor], Any] = host if self.is_host else _same  # the storage: never None
        self._conv = put
        # per field: what a step must look like (its whole shape, ``[E, ...]``) and where it goes
        self._obs = [(k, v.dtype, v.shape[1:], put(v)) for k, v in self.obs.items()]
        self._full = [(k, self.fields[k].shape[1:], put(self.fields[k])) for k in _FULL if k in spec]
        flat, column = torch.Size((e,)), torch.Size((e, 1))  # a scalar comes as [E] or [E, 1]
        self._scalars = [
            (k, flat, put(v.view(t, e)), column, put(v))
            for k, v in ((k, self.fields[k]) for k in SCALARS if k in spec)
        ]
        self._time_outs = {k: put(self.fields[k].view(t, e)) for k in TIME_OUT_FIELDS if self.time_outs}
        self._dist = [(v.shape[1:], put(v)) for v in self.dist]
        self._hidden = {part: [put(v) for v in views] for part, views in self.hidden.items()}

    def attributes(self) -> dict[str, Any]:
        """rsl_rl's storage attributes: the tensors, as rsl_rl shapes them (views)."""
        out: dict[str, Any] = {"observations": self.observations, **self.fields}
        out["distribution_params"] = tuple(self.dist)
        out["returns"] = self.returns
        for part in "ac":  # rsl_rl's [T, layers, E, H]
            views = [h.permute(0, 2, 1, 3) for h in self.hidden[part]]
            out[f"saved_hidden_state_{part}"] = views or None
        return out

    def flat(self, name: str) -> torch.Tensor:
        """A field as rsl_rl flattens it for minibatches: ``[T * E, ...]`` (a view)."""
        return self.fields[name].flatten(0, 1)

    def write(self, tr: Any, t: int, time_outs: Any) -> bool:
        """Copy transition ``tr`` into step ``t`` when all of it fits the layout (checked
        first); ``False``, nothing written, when it does not. ``time_outs(tr)``: the
        time-out fields ``{name: [E, 1]}`` of ``tr``, for a layout that stores them."""
        if t >= self.shape[0]:
            return False
        groups = _groups(getattr(tr, "observations", None))
        if groups is None or len(groups) != len(self._obs):
            return False
        conv = self._conv
        put: list[tuple[Any, Any]] = []
        for key, dtype, shape, dst in self._obs:
            value = groups.get(key)
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.shape != shape:
                return False
            put.append((dst, conv(value)))
        for key, shape, dst in self._full:
            value = getattr(tr, key, None)
            if not isinstance(value, torch.Tensor) or value.shape != shape:
                return False
            put.append((dst, conv(value)))
        for key, flat, flat_dst, column, column_dst in self._scalars:
            value = getattr(tr, key, None)
            if not isinstance(value, torch.Tensor):
                return False
            if value.shape == flat:
                put.append((flat_dst, conv(value)))
            elif value.shape == column:
                put.append((column_dst, conv(value)))
            else:
                return False
        params = getattr(tr, "distribution_params", None)
        if self._dist or params is not None:
            if params is None or len(params) != len(self._dist):
                return False
            for (shape, dst), p in zip(self._dist, params, strict=True):
                if not isinstance(p, torch.Tensor) or p.shape != shape:
                    return False
                put.append((dst, conv(p)))
        if not self._hidden_states(tr, put, conv, self.shape[1]):
            return False
        if self.time_outs:  # may raise (a time-out without its final value): nothing written yet
            put.extend((self._time_outs[k], _flat(conv(v))) for k, v in time_outs(tr).items())
        elif gives_time_outs(tr):
            return False  # the layout grows: the checked path
        for _, src in put:
            if src is None:  # a dtype NumPy lacks: the checked path converts it
                return False
        for dst, src in put:
            dst[t] = src
        return True

    def _hidden_states(self, tr: Any, put: list[tuple[Any, Any]], conv: Any, e: int) -> bool:
        """Queue the hidden states of ``tr`` (``[layers, E, H]``, stored ``[E, layers, H]``);
        zeros for a part the layout has and ``tr`` lacks (rsl_rl keeps zeros there)."""
        states = getattr(tr, "hidden_states", (None, None))
        if not isinstance(states, tuple) or len(states) != 2:
            return False
        for part, state in zip("ac", states, strict=True):
            dsts = self._hidden.get(part, [])
            if state is None:
                if dsts:
                    put.extend((dst, 0) for dst in dsts)
                continue
            parts = state if isinstance(state, tuple) else (state,)
            if len(parts) != len(dsts):
                return False  # a new hidden state: the layout grows
            for dst, h in zip(dsts, parts, strict=True):
                if not isinstance(h, torch.Tensor) or h.dim() != 3 or h.shape[1] != e:
                    return False
                if (h.shape[0], h.shape[2]) != tuple(dst.shape[2:]):
                    return False
                src = conv(h)  # [layers, E, H] -> [E, layers, H]
                put.append((dst, None if src is None else src.swapaxes(0, 1)))
        return True


def _same(x: torch.Tensor) -> torch.Tensor:
    return x


def _groups(obs: Any) -> dict[Any, Any] | None:
    """The top-level entries of a TensorDict ``obs`` as a dict (``None`` for anything else):
    a plain ``TensorDict``'s own dict, read without a copy."""
    if type(obs) is TensorDict:
        entries = getattr(obs, "_tensordict", None)  # tensordict's storage of the entries
        if type(entries) is dict:
            return entries
    return dict(obs.items()) if isinstance(obs, TensorDictBase) else None


def _flat(x: Any) -> Any:
    """``[E]`` or ``[E, 1]`` as ``[E]`` (a view)."""
    return None if x is None else x.reshape(-1)
