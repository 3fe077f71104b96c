"""RolloutBuffer: on-policy storage (PPO, A2C, IMPALA) over a packed storage and a layout.

A rollout is ``horizon`` steps of ``num_envs`` envs, held time-major ``[T, E]`` in one
:class:`~xpbank.TensorStorage` of ``T * E`` slots (slot ``t * E + e``): a step of every
env is one contiguous slice copy, a minibatch one ``index_select`` of packed rows. The
segmented preset (:meth:`RolloutBuffer.segmented`) holds metta's ``[segments,
bptt_horizon]`` instead. Advantages and returns, once computed, live in a second small
packed storage and come with every minibatch as ``"advantage"`` and ``"return"``.

What is copied: ``add``/``store`` copy the data in; minibatches are fresh memory
(changing them changes nothing stored); only :meth:`RolloutBuffer.update` writes back.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import SpecError, StaleIndexError
from xpbank.replay.writing import keep_last as _keep_last
from xpbank.rollout.direct import DirectWrites
from xpbank.rollout.keys import DERIVED, RESERVED_KEYS, RolloutKeys, check_reserved
from xpbank.rollout.layout import SegmentLayout, SegmentSizes, TimeLayout, count_ends, segment_sizes, span_of
from xpbank.rollout.reading import RecurrentBatch, RolloutReader
from xpbank.rollout.targets import Targets
from xpbank.spec.batch import flatten
from xpbank.spec.spec import NestedKey, Spec, key_str
from xpbank.storage import TensorStorage
from xpbank.storage.base import check_device

__all__ = ["RolloutBuffer", "RolloutKeys", "RecurrentBatch"]


class RolloutBuffer(RolloutReader, DirectWrites):
    """Time-major ``[horizon, num_envs]`` rollout storage with per-env write cursors.

    Args:
        num_envs: envs written per step.
        horizon: steps per env in one rollout.
        spec: the layout of one step; ``None`` takes it from the first ``add``/``store``
            and checks every later step against it.
        device: where the data lives and minibatches are delivered.
        keys: field names for rewards, values, episode ends ... (:class:`RolloutKeys`).
        seed: seeds the buffer's ``torch.Generator`` (minibatch orders, prioritized
            segments): the same seed and calls give the same minibatches.
        pack: one packed row per step (one gather per minibatch); ``False``: a block per
            field, so :meth:`view` is contiguous (for front-ends doing math on views).

    Threads: no lock (an on-policy buffer is one learner's own); share it only holding
    one lock of your own around every call, including a whole ``minibatches`` loop.

    Example:
        >>> import torch
        >>> from xpbank import RolloutBuffer
        >>> rb = RolloutBuffer(num_envs=4, horizon=2)
        >>> for _ in range(2):
        ...     rb.add({"obs": torch.randn(4, 3), "reward": torch.ones(4), "value": torch.zeros(4),
        ...             "terminated": torch.zeros(4, dtype=torch.bool)})
        >>> adv, ret = rb.compute_returns(last_values=torch.zeros(4), gamma=0.5, lam=1.0)
        >>> ret[:, 0].tolist()
        [1.5, 1.0]
        >>> [mb["obs"].shape for mb in rb.minibatches(num_minibatches=2, epochs=1)]
        [torch.Size([4, 3]), torch.Size([4, 3])]
    """

    def __init__(
        self,
        num_envs: int,
        horizon: int,
        spec: Spec | None = None,
        *,
        device: Any = "cpu",
        keys: RolloutKeys | None = None,
        seed: int | None = None,
        pack: bool = True,
    ):
        self._setup(TimeLayout(num_envs, horizon), spec, device, keys, seed, pack)
        self.sizes: SegmentSizes | None = None

    @classmethod
    def segmented(
        cls,
        total_agents: int,
        batch_size: int,
        bptt_horizon: int,
        minibatch_size: int,
        max_minibatch_size: int | None = None,
        spec: Spec | None = None,
        *,
        device: Any = "cpu",
        keys: RolloutKeys | None = None,
        seed: int | None = None,
        pack: bool = True,
    ) -> RolloutBuffer:
        """metta's layout: ``[batch_size // bptt_horizon, bptt_horizon]`` segment rows. Threads: a new buffer.

        Each agent fills one row at a time and moves to the next free row when its row
        is full, on its own (agents may be out of step). ``rb.sizes`` holds the derived
        sizes (segments, minibatch segments, gradient-accumulation count).

        Example:
            >>> import torch
            >>> rb = RolloutBuffer.segmented(total_agents=2, batch_size=8, bptt_horizon=2,
            ...                              minibatch_size=4)
            >>> rb.shape, rb.sizes.num_minibatches
            (torch.Size([4, 2]), 2)
        """
        sizes = segment_sizes(
            total_agents, batch_size, bptt_horizon, minibatch_size, max_minibatch_size or minibatch_size
        )
        self = cls.__new__(cls)
        self._setup(SegmentLayout(total_agents, sizes.segments, bptt_horizon), spec, device, keys, seed, pack)
        self.sizes = sizes
        return self

    def _setup(self, layout: Any, spec: Spec | None, device: Any, keys: Any, seed: Any, pack: bool) -> None:
        if spec is not None and not isinstance(spec, Spec):
            raise SpecError(f"spec: expected a Spec or None, got {type(spec).__name__}")
        self._layout = layout
        self.keys = keys if keys is not None else RolloutKeys()
        self._device = check_device(device)
        self._storage = TensorStorage(layout.capacity, device=self._device, pack=pack)
        if spec is not None:
            self._storage.initialize(check_reserved(spec))
        derived = TensorStorage(layout.capacity, DERIVED, device=self._device, pack=pack)
        self._targets = Targets(layout, derived)
        self._all = np.arange(layout.num_writers)
        self._generation, self._stamp = 0, (0, "")
        self._episode_steps = np.zeros(layout.num_writers, np.int64)
        self._episodes = [0, 0]  # finished this rollout: count, total length
        self._generator = torch.Generator()
        self._generator.seed() if seed is None else self._generator.manual_seed(seed)

    # -- properties ------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """``[horizon, num_envs]``, or ``[segments, bptt_horizon]`` when segmented."""
        return torch.Size(self._targets.shape)

    @property
    def num_envs(self) -> int:
        """Writers: envs, or ``total_agents`` when segmented."""
        return self._layout.num_writers

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def generator(self) -> torch.Generator:
        return self._generator

    def ready(self) -> bool:
        """True when every env has ``horizon`` steps (every segment is full). Threads: no lock."""
        return self._layout.ready()

    def room(self) -> torch.Tensor:
        """``[num_envs]`` bool: which envs (agents) can store another step now.

        Threads: a copy of the cursors now; not safe while another thread writes (no lock).

        With the segmented layout a fast agent may take the last free segment, so a slow
        one can run out of room before ``ready()``: store only these.
        """
        return torch.from_numpy(self._layout.room().copy())

    def __repr__(self) -> str:
        return f"RolloutBuffer(shape={list(self.shape)}, filled={len(self)}, spec={self.spec})"

    # -- writing ---------------------------------------------------------------
    def add(self, step: Any) -> None:
        """Store one step of every env (leading dim ``num_envs``) at each env's cursor.

        Threads: no lock; concurrent writers mix steps (use your own lock); iterators made before raise.

        Raises:
            SpecError: a field's keys, shape or dtype differ from the spec, or the
                leading dim is not ``num_envs``.
            CapacityError: an env already holds ``horizon`` steps (nothing is written).
        """
        self._write(step, self._all, "add")

    def store(self, batch: Any, env_ids: Any) -> None:
        """Store one step of some envs (a slice, range, list or tensor of env ids).

        Threads: no lock, as :meth:`add` (iterators made before raise); share it under your own lock.

        Each env writes at its own cursor, so envs may be out of step; the whole batch
        is checked (shapes, ids, room) before anything is written.
        """
        self._write(batch, self._layout.ids(env_ids), "store")

    def _write(self, batch: Any, ids: np.ndarray, what: str) -> None:
        flat = flatten(batch, self.spec)
        spec = self.spec if self.spec is not None else check_reserved(Spec.from_batch(flat, batch_ndim=1))
        (n,) = spec.validate(flat, batch_ndim=1)
        if n != ids.size:
            raise SpecError(f"{what}: expected one row per env ({ids.size}), got {n} rows")
        span = span_of(ids, self._all)
        slots = self._layout.contiguous(ids, span)
        where = slots if slots is not None else torch.from_numpy(self._layout.slots(ids))
        if self._storage.spec is None:
            self._storage.initialize(spec)
        self._storage.write(where, flat)
        ends = [flat.get(self.keys.terminated), flat.get(self.keys.truncated)]
        count_ends(self._episode_steps, self._episodes, ends, ids, span)
        self._layout.advance(ids, span)

    def clear(self) -> None:
        """Start the next rollout: cursors to 0, earlier ``"index"`` ids become stale.

        Threads: no lock; iterators made before raise :class:`~xpbank.BufferChangedError`; use your lock.

        Episodes still running keep their step counts (for ``stats()``'s episode length).
        """
        self._layout.clear()
        self._targets.clear()
        self._generation += 1
        self._episodes = [0, 0]

    def update(self, indices: Any, batch: Any) -> None:
        """Write fields (values, log-probs, ratios, advantages ...) of stored steps in place.

        Threads: not safe while another thread writes (no lock); share it under your own lock.
        One that changes a stored ``terminated``/``truncated`` makes iterators made before raise
        :class:`~xpbank.BufferChangedError` (their plans were cut at the old ends); other fields do not.

        Args:
            indices: the ``"index"`` of a minibatch (any shape); ids < 0 (the padding of
                recurrent minibatches) are skipped, a repeated id keeps its last row.
            batch: any subset of the spec's fields and ``"advantage"``/``"return"``, with
                the leading dims of ``indices``. Other reserved entries (``"index"``,
                ``"mask"``, ``"weight"``) are ignored, so a minibatch can be passed back.

        Raises:
            StaleIndexError: an id from before the last :meth:`clear`; nothing is written.
            SpecError: unknown fields, wrong shapes or dtypes.
        """
        if self.spec is None:
            raise SpecError("update: the buffer is empty (nothing has been written yet)")
        ids = torch.as_tensor(indices).reshape(-1).to("cpu", torch.int64)
        lead = tuple(torch.as_tensor(indices).shape)
        cap, gen = self.capacity, self._generation
        keep = ids >= 0
        live = ids[keep]
        if live.numel() and (live // cap != gen).any():
            bad = int(live[live // cap != gen][0])
            raise StaleIndexError(
                f"update: index {bad} is from an earlier rollout (cleared since); ids of this one "
                f"are in [{gen * cap}, {(gen + 1) * cap})"
            )
        writable = RESERVED_KEYS - {"advantage", "return"}
        flat = {k: v for k, v in flatten(batch, self.spec).items() if k not in writable}
        rows: dict[NestedKey, torch.Tensor] = {}
        for key, value in flat.items():
            if tuple(value.shape[: len(lead)]) != lead:
                raise SpecError(
                    f"update: field {key_str(key)!r} has leading shape {tuple(value.shape)[: len(lead)]}, "
                    f"expected the indices' shape {lead}"
                )
            rows[key] = value.reshape(-1, *value.shape[len(lead) :])[keep.to(value.device)]
        derived: dict[NestedKey, torch.Tensor] = {
            k: rows.pop(k) for k in ("advantage", "return") if k in rows
        }
        self.spec.validate(rows, batch_ndim=1, partial=True)
        DERIVED.validate(derived, batch_ndim=1, partial=True)
        if derived and not self._targets.computed:  # checked before anything is written
            raise SpecError("update: advantages/returns are written back before compute_returns() made them")
        slots = live % cap
        if slots.numel() and torch.unique(slots).numel() != slots.numel():
            slots, both = _keep_last(slots, {**rows, **derived})
            rows = {k: both[k] for k in rows}
            derived = {k: both[k] for k in derived}
        if rows:
            self._note_ends(slots, rows)
            self._storage.write(slots, rows)
        if derived:
            self._targets.write(slots, derived)

    def reset_importance_sampling_ratios(self) -> None:
        """Set the stored ``keys.ratio`` field to 1 everywhere (metta's PPO, per rollout).

        Threads: not safe while another thread writes (no lock); use your own lock."""
        key = self.keys.ratio
        if self.spec is None or key not in self.spec:
            raise SpecError(f"reset_importance_sampling_ratios: no field {key_str(key)!r} in {self.spec}")
        field = self.spec[key]
        ones = torch.ones((self.capacity, *field.shape), dtype=field.dtype, device=self._device)
        self._storage.write(slice(0, self.capacity), {key: ones})

    # -- returns ---------------------------------------------------------------
    def compute_returns(
        self,
        last_values: Any,
        gamma: float = 0.99,
        lam: float = 0.95,
        *,
        final_values: Any = None,
        normalize: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAE over the rollout; stores ``"advantage"`` and ``"return"`` for minibatches.

        Threads: reads every step; not safe while another thread writes (no lock): use your own lock.

        Args:
            last_values: ``[num_envs]``: the value of each env's observation after its
                last stored step (the bootstrap at the rollout's end).
            gamma, lam: discount and GAE lambda.
            final_values: values of the true final observations at truncated steps, in
                the buffer's shape (read only where truncated); default: the stored
                ``keys.final_value`` field. Required when any step is truncated.
            normalize: normalize the stored advantages over the whole rollout (returns
                are not changed).

        Returns:
            ``(advantages, returns)`` in the buffer's shape.
        """
        self._layout.require_ready("compute_returns")
        return self._targets.gae(self._grids(last_values, final_values), gamma, lam, normalize)

    def compute_vtrace(
        self,
        target_log_probs: Any,
        last_values: Any,
        gamma: float = 0.99,
        rho_bar: float = 1.0,
        c_bar: float = 1.0,
        lam: float = 1.0,
        *,
        final_values: Any = None,
        normalize: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """V-trace against the stored behaviour ``keys.log_prob``; stores the policy-gradient
        advantages as ``"advantage"`` and ``vs`` as ``"return"``.

        Threads: reads every step; not safe while another thread writes (no lock): use your own lock.

        ``target_log_probs``: the learner policy's log-probs in the buffer's shape, or
        ``None`` to use ``log`` of the stored ``keys.ratio`` (target / behaviour).
        """
        self._layout.require_ready("compute_vtrace")
        grids = self._grids(last_values, final_values)
        if target_log_probs is None:
            behaviour, ratio = self._field_grids([self.keys.log_prob, self.keys.ratio])
            target = behaviour + torch.log(ratio)
        else:
            (behaviour,) = self._field_grids([self.keys.log_prob])
            target = self._targets.to_grid(torch.as_tensor(target_log_probs), "target_log_probs")
        return self._targets.vtrace(grids, behaviour, target, gamma, rho_bar, c_bar, lam, normalize)

    def _grids(self, last_values: Any, final_values: Any) -> dict[str, torch.Tensor]:
        """The inputs of the returns as time-major grids, read in one pass over the rows."""
        k, spec = self.keys, self.spec
        has_trunc = spec is not None and k.truncated in spec
        stored_final = final_values is None and spec is not None and k.final_value in spec
        keys = [k.reward, k.value, k.terminated]
        keys += [k.truncated] if has_trunc else []
        keys += [k.final_value] if stored_final else []
        got = dict(zip(keys, self._field_grids(keys), strict=True))
        grids = {"rewards": got[k.reward], "values": got[k.value], "terminated": got[k.terminated]}
        grids["truncated"] = got[k.truncated] if has_trunc else torch.zeros_like(grids["terminated"])
        final = None
        if grids["truncated"].any():
            if final_values is not None:
                final = self._targets.to_grid(torch.as_tensor(final_values), "final_values")
            elif stored_final:
                final = got[k.final_value]
            else:
                raise SpecError(
                    f"some steps are truncated: bootstrapping them needs the value of the true final "
                    f"observation; pass final_values= or store a {key_str(k.final_value)!r} field"
                )
        grids["next_values"] = self._targets.next_values(
            grids["values"], last_values, final, grids["truncated"]
        )
        return grids
