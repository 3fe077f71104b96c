"""metta's ``Experience`` (``metta.rl.training.experience``) on a segmented
:class:`~xpbank.RolloutBuffer`.

Switch with one import line::

    from xpbank.compat.metta import Experience  # was: from metta.rl.training.experience import Experience

The steps live in :meth:`RolloutBuffer.segmented <xpbank.RolloutBuffer.segmented>`
(``[segments, bptt_horizon]``); ``experience.buffer``, the TensorDict losses read, is
made of views into it. Three of metta's flaws are fixed (``docs/compat/metta.md``):
:meth:`Experience.update` writes into ``buffer`` (metta updates a copy), agents out of
step are each stored at their own time index (metta uses the slice's first agent's),
and :meth:`Experience.from_losses` refuses two losses declaring one key differently
(metta lets the later one win).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from xpbank.errors import CapacityError, SpecError
from xpbank.replay.state import seed_from
from xpbank.rollout import RolloutBuffer, RolloutKeys
from xpbank.rollout.direct import host
from xpbank.spec.batch import flatten, to_tensordict
from xpbank.spec.spec import NestedKey, Spec, key_str

__all__ = ["Experience", "KEYS"]

logger = logging.getLogger(__name__)

KEYS = RolloutKeys(
    reward="rewards",
    value="values",
    log_prob="act_log_prob",
    action="actions",
    terminated="dones",
    truncated="truncateds",
    ratio="ratio",
)
# core stats name -> metta's stats name
_STATS = {
    "reward": "rewards",
    "value": "values",
    "log_prob": "act_log_prob",
    "ratio": "ratio",
    "episode_length": "ep_lengths",
    "action_mean": "actions_mean",
    "action_std": "actions_std",
}


def as_spec(spec: Any, what: str = "experience_spec") -> Spec:
    """An xpbank :class:`~xpbank.Spec`, or one made from a TorchRL ``Composite``.

    Example:
        >>> from xpbank import Field
        >>> as_spec(Spec({"rewards": Field(())})).keyset
        frozenset({'rewards'})
    """
    if isinstance(spec, Spec):
        return spec
    if type(spec).__name__ in ("Composite", "CompositeSpec"):
        return Spec.from_torchrl(spec)
    raise SpecError(f"{what}: expected an xpbank Spec or a torchrl Composite, got {type(spec).__name__}")


def check_metta_sizes(
    total_agents: int, batch_size: int, bptt_horizon: int, minibatch_size: int, cap: int
) -> None:
    """metta's own constructor checks, with its messages (ValueError subclasses).

    Example:
        >>> check_metta_sizes(8, 16, 4, 8, 8)
        Traceback (most recent call last):
        ...
        xpbank.errors.CapacityError: batch_size (16) is too small for 8 agents.
        Segments = batch_size // bptt_horizon = 16 // 4 = 4
        But we need segments >= total_agents (8).
        Please set trainer.batch_size >= 32 in your configuration.
    """
    segments = batch_size // bptt_horizon
    if total_agents > segments:
        raise CapacityError(
            f"batch_size ({batch_size}) is too small for {total_agents} agents.\n"
            f"Segments = batch_size // bptt_horizon = {batch_size} // {bptt_horizon} = {segments}\n"
            f"But we need segments >= total_agents ({total_agents}).\n"
            f"Please set trainer.batch_size >= {total_agents * bptt_horizon} in your configuration."
        )
    mb = min(minibatch_size, cap)
    if mb % bptt_horizon:
        raise CapacityError(f"minibatch_size {mb} must be divisible by bptt_horizon {bptt_horizon}")
    if segments % (mb // bptt_horizon):
        raise CapacityError(
            f"Configuration error: segments ({segments}) must be divisible by "
            f"minibatch_segments ({mb // bptt_horizon}).\n"
            f"segments = batch_size // bptt_horizon = {batch_size} // {bptt_horizon} = {segments}\n"
            f"minibatch_segments = minibatch_size // bptt_horizon = "
            f"{mb} // {bptt_horizon} = {mb // bptt_horizon}\n"
            f"Please adjust trainer.minibatch_size in your configuration to ensure divisibility."
        )


class Experience:
    """Segmented storage ``[segments, bptt_horizon]`` for BPTT training, metta's API.

    Args:
        total_agents: agents writing steps (each fills one segment row at a time).
        batch_size: steps per rollout (``segments * bptt_horizon``).
        bptt_horizon: steps per segment.
        minibatch_size: steps per optimizer step; above ``max_minibatch_size`` it is
            split in ``accumulate_minibatches`` minibatches of ``max_minibatch_size``.
        max_minibatch_size: the largest minibatch that fits.
        experience_spec: the fields of one step: a TorchRL ``Composite`` or an xpbank
            :class:`~xpbank.Spec`.
        device: where the steps live.

    Attributes: ``buffer`` (views: writing it writes the storage), ``segments``,
    ``minibatch_size``, ``minibatch_segments``, ``num_minibatches``,
    ``accumulate_minibatches``, plus the constructor's arguments. Everything starts at
    zero, as in metta.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from xpbank import Field, Spec
        >>> spec = Spec({"rewards": Field(()), "values": Field(())})
        >>> exp = Experience(2, 8, 2, 4, 4, spec, "cpu")
        >>> exp.buffer.batch_size, exp.num_minibatches
        (torch.Size([4, 2]), 2)
        >>> while not exp.ready_for_training:
        ...     exp.store(TensorDict({"rewards": torch.ones(2), "values": torch.zeros(2)}, [2]), slice(0, 2))
        >>> exp.buffer["rewards"].sum().item(), exp.stats()["rewards"]
        (8.0, 1.0)
    """

    def __init__(
        self,
        total_agents: int,
        batch_size: int,
        bptt_horizon: int,
        minibatch_size: int,
        max_minibatch_size: int,
        experience_spec: Any,
        device: Any,
    ):
        spec = as_spec(experience_spec)
        _check_for_duplicate_keys(spec)
        check_metta_sizes(total_agents, batch_size, bptt_horizon, minibatch_size, max_minibatch_size)
        self._rb = RolloutBuffer.segmented(
            total_agents,
            batch_size,
            bptt_horizon,
            minibatch_size,
            max_minibatch_size,
            spec,
            device=device,
            keys=KEYS,
            seed=seed_from(),  # reproducible after torch.manual_seed
            pack=False,  # a block per field: ``buffer``'s views are contiguous, a store one copy each
        )
        sizes = self._rb.sizes
        assert sizes is not None  # always set by RolloutBuffer.segmented
        self.total_agents, self.batch_size, self.bptt_horizon = total_agents, batch_size, bptt_horizon
        self.device = self._rb.device
        self.segments = sizes.segments
        self.minibatch_size = sizes.minibatch_size
        self.minibatch_segments = sizes.minibatch_segments
        self.num_minibatches = sizes.num_minibatches
        self.accumulate_minibatches = sizes.accumulate_minibatches
        self.spec = spec
        views = {key: self._rb.view(key) for key in spec}
        for view in views.values():
            view.zero_()
        self.buffer: TensorDict = to_tensordict(views, (self.segments, bptt_horizon), self.device)
        # where store() writes each field straight away (NumPy views on the CPU)
        self._direct: dict[NestedKey, tuple[torch.dtype, tuple[int, ...], Any]] = {
            key: (spec[key].dtype, spec[key].shape, host(v.flatten(0, 1)))
            for key, v in views.items()
            if self.device.type == "cpu"
        }
        self._flat_keys = all(isinstance(key, str) for key in spec)

    @property
    def rollout(self) -> RolloutBuffer:
        """The xpbank buffer underneath (minibatch readers, returns, ``stats``)."""
        return self._rb

    @property
    def ready_for_training(self) -> bool:
        """True when every segment is full."""
        return self._rb.ready()

    def store(self, data_td: Any, env_id: Any) -> None:
        """Store one step of the agents ``env_id`` (a slice, as in metta, or ids).

        Each agent writes at its own time index in its own segment, so agents may be out
        of step. Keys of ``data_td`` outside the spec are ignored and fields it lacks
        are stored as zeros (as metta's ``select``). Agents whose segment is full while
        no segment is free are skipped: their steps do not fit in this batch (metta
        overwrites earlier segments there). The step is checked before anything is written.
        """
        if isinstance(env_id, slice) and self._store_direct(data_td, env_id):
            return
        ids = _ids(env_id, self.total_agents)
        flat = {k: v for k, v in flatten(data_td).items() if k in self.spec}
        step = {
            key: flat[key] if key in flat else _zeros(self.spec, key, ids.size, self.device)
            for key in self.spec
        }
        room = self._rb.room().numpy()[ids]
        if not room.all():
            logger.debug("store: %d agents have no free segment; their steps are skipped", int((~room).sum()))
            self.spec.validate(step, batch_ndim=1)
            keep = torch.from_numpy(np.flatnonzero(room))
            step = {k: v[keep.to(v.device)] for k, v in step.items()}
            ids = ids[room]
            if not ids.size:
                return
        self._rb.store(step, ids)

    def _store_direct(self, data_td: Any, env_id: slice) -> bool:
        """Store a step of a TensorDict holding every field with the spec's dtypes, of agents
        that all have room, straight into the views (checked first); ``False``, nothing
        written, for anything else (then :meth:`store` takes its checked path)."""
        if not self._direct or not isinstance(data_td, TensorDictBase):
            return False
        try:
            slots = self._rb.next_slots(env_id)
        except CapacityError:
            return False  # agents without a free segment: skipped on the checked path
        # one pass over a flat TensorDict (TensorDict.get costs microseconds a key)
        got = dict(data_td.items()) if self._flat_keys else {k: data_td.get(k, None) for k in self._direct}
        put = []
        for key, (dtype, shape, dst) in self._direct.items():
            value = got.get(key)
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or value.shape[1:] != shape:
                return False
            src = host(value) if value.shape[0] == slots.size else None
            if src is None:
                return False
            put.append((dst, src))
        for dst, src in put:
            dst[slots] = src
        ends = [got.get(k) if k in self._direct else None for k in (KEYS.terminated, KEYS.truncated)]
        self._rb.advance(env_id, ends)
        return True

    def reset_for_rollout(self) -> None:
        """Start the next rollout: every agent back to a segment of its own, position 0."""
        self._rb.clear()

    def update(self, indices: Any, data_td: Any) -> None:
        """Write ``data_td [len(indices), bptt_horizon]`` into the segments ``indices``,
        in ``buffer`` itself (metta writes into a copy, so its updates are lost).

        Raises:
            SpecError: unknown fields, wrong shapes or dtypes (nothing is written).
            XpbankIndexError: a segment index out of range.
        """
        rows = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        slots = rows.unsqueeze(1) * self.bptt_horizon + torch.arange(self.bptt_horizon)
        self._rb.update(self._rb.index_of(slots), data_td)

    def reset_importance_sampling_ratios(self) -> None:
        """Set ``"ratio"`` to 1 everywhere (nothing when the spec has no ratio)."""
        if KEYS.ratio in self.spec:
            self._rb.reset_importance_sampling_ratios()

    def stats(self) -> dict[str, float]:
        """Means over the stored steps of ``rewards``, ``values``, ``act_log_prob``,
        ``ratio``, ``actions_mean``/``actions_std`` (those in the spec), of ``dones`` and
        ``truncateds`` over the buffer, and ``ep_lengths``: the mean length of the
        episodes that ended (metta: the agents' positions in their segments)."""
        core = self._rb.stats()
        out = {name: core[key] for key, name in _STATS.items() if key in core}
        for key in (KEYS.terminated, KEYS.truncated):  # over the whole buffer, as metta
            if key in self.spec:
                out[key_str(key)] = float(self.buffer.get(key).float().mean())
        out.setdefault("ep_lengths", 0.0)
        return out

    def give_me_empty_md_td(self) -> TensorDict:
        """An empty TensorDict ``[minibatch_segments, bptt_horizon]`` (minibatch metadata)."""
        return TensorDict({}, batch_size=(self.minibatch_segments, self.bptt_horizon), device=self.device)

    @staticmethod
    def from_losses(
        total_agents: int,
        batch_size: int,
        bptt_horizon: int,
        minibatch_size: int,
        max_minibatch_size: int,
        policy_experience_spec: Any,
        losses: Mapping[str, Any],
        device: Any,
    ) -> Experience:
        """An Experience over the policy's spec and every loss's ``get_experience_spec()``.

        A key declared twice must have one shape and dtype: otherwise a
        :class:`~xpbank.errors.SpecError` names both declarers (metta keeps the later).
        Each loss with ``attach_replay_buffer`` is attached, as in metta.
        """
        names = ["policy_experience_spec", *(f"loss {name!r}" for name in losses)]
        specs = [as_spec(policy_experience_spec, names[0])]
        specs += [
            as_spec(loss.get_experience_spec(), label)
            for label, loss in zip(names[1:], losses.values(), strict=True)
        ]
        merged = Spec.merge(*specs, names=names)
        experience = Experience(
            total_agents, batch_size, bptt_horizon, minibatch_size, max_minibatch_size, merged, device
        )
        for loss in losses.values():
            attach = getattr(loss, "attach_replay_buffer", None)
            if attach is not None:
                attach(experience)
        return experience


def _check_for_duplicate_keys(spec: Spec) -> None:
    """Two keys that read the same (``"a.b"`` and ``("a", "b")``) would share a column name."""
    seen: dict[str, NestedKey] = {}
    dupes = []
    for key in spec:
        name = key_str(key)
        if name in seen:
            dupes.append(name)
        seen[name] = key
    if dupes:
        raise SpecError(f"Duplicate keys found in experience_spec: {dupes}")


def _ids(env_id: Any, n: int) -> np.ndarray:
    """Agent ids in range (the buffer checks the rest: integer dtype, no repeats)."""
    if isinstance(env_id, slice):
        return np.arange(n)[env_id]
    raw = env_id.detach().cpu().numpy() if isinstance(env_id, torch.Tensor) else np.asarray(env_id)
    if raw.dtype == bool or not np.issubdtype(raw.dtype, np.integer):
        raise CapacityError(f"env_id: expected a slice or integer agent ids, got dtype {raw.dtype}")
    ids = raw.reshape(-1).astype(np.int64)
    bad = ids[(ids < 0) | (ids >= n)]
    if bad.size:
        raise CapacityError(f"env_id: agent {int(bad[0])} is out of range [0, {n})")
    return ids


def _zeros(spec: Spec, key: NestedKey, n: int, device: torch.device) -> torch.Tensor:
    field = spec[key]
    return torch.zeros((n, *field.shape), dtype=field.dtype, device=device)
