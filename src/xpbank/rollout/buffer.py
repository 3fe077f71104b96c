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

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.batch import flatten, to_tensordict
from xpbank.errors import CapacityError, SpecError, StaleIndexError, check_positive_int
from xpbank.replay import _keep_last
from xpbank.rollout.layout import SegmentLayout, SegmentSizes, TimeLayout, segment_sizes
from xpbank.rollout.minibatch import (
    anneal_beta,
    flat_plan,
    pad_trajectories,
    segment_plan,
    split_trajectories,
    trajectory_plan,
)
from xpbank.rollout.targets import Targets
from xpbank.spec import Field, NestedKey, Spec, key_str, normalize_key
from xpbank.storage import TensorStorage
from xpbank.storage.base import check_device

__all__ = ["RolloutBuffer", "RolloutKeys", "RecurrentBatch"]

# entries that minibatches add next to the stored fields
RESERVED_KEYS = frozenset({"index", "advantage", "return", "mask", "weight"})
_DERIVED = Spec({"advantage": Field(()), "return": Field(())})


@dataclass(frozen=True)
class RolloutKeys:
    """The names of the fields the buffer reads for returns, stats and episode ends."""

    reward: NestedKey = "reward"
    value: NestedKey = "value"
    log_prob: NestedKey = "log_prob"
    action: NestedKey = "action"
    terminated: NestedKey = "terminated"
    truncated: NestedKey = "truncated"
    final_value: NestedKey = "final_value"
    ratio: NestedKey = "ratio"


class RecurrentBatch(NamedTuple):
    """A recurrent minibatch: ``data [P, N]`` padded trajectories (with ``"mask"``; the
    padding's ``"index"`` is -1) and ``hidden [N]``: the ``hidden_keys`` fields at each
    trajectory's first step (the state to start the recurrent network from)."""

    data: TensorDict
    hidden: TensorDict


class RolloutBuffer:
    """Time-major ``[horizon, num_envs]`` rollout storage with per-env write cursors.

    Args:
        num_envs: envs written per step.
        horizon: steps per env in one rollout.
        spec: the layout of one step; ``None`` takes it from the first ``add``/``store``
            and checks every later step against it.
        device: where the data lives and minibatches are delivered.
        keys: field names for rewards, values, episode ends ... (:class:`RolloutKeys`).

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
    ):
        self._setup(TimeLayout(num_envs, horizon), spec, device, keys, seed)
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
    ) -> RolloutBuffer:
        """metta's layout: ``[batch_size // bptt_horizon, bptt_horizon]`` segment rows.

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
        self._setup(SegmentLayout(total_agents, sizes.segments, bptt_horizon), spec, device, keys, seed)
        self.sizes = sizes
        return self

    def _setup(
        self, layout: TimeLayout | SegmentLayout, spec: Spec | None, device: Any, keys: Any, seed: Any
    ) -> None:
        if spec is not None and not isinstance(spec, Spec):
            raise SpecError(f"spec: expected a Spec or None, got {type(spec).__name__}")
        self._layout = layout
        self.keys = keys if keys is not None else RolloutKeys()
        self._device = check_device(device)
        self._storage = TensorStorage(layout.capacity, device=self._device)
        if spec is not None:
            self._storage.initialize(_check_reserved(spec))
        self._targets = Targets(layout, TensorStorage(layout.capacity, _DERIVED, device=self._device))
        self._all = np.arange(layout.num_writers)
        self._generation = 0
        self._episode_steps = np.zeros(layout.num_writers, np.int64)
        self._episodes = [0, 0]  # finished this rollout: count, total length
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    # -- properties ------------------------------------------------------------
    @property
    def spec(self) -> Spec | None:
        return self._storage.spec

    @property
    def shape(self) -> torch.Size:
        """``[horizon, num_envs]``, or ``[segments, bptt_horizon]`` when segmented."""
        lay = self._layout
        return torch.Size(lay.grid.shape if isinstance(lay, TimeLayout) else lay.grid.T.shape)

    @property
    def num_envs(self) -> int:
        """Writers: envs, or ``total_agents`` when segmented."""
        return self._layout.num_writers

    @property
    def capacity(self) -> int:
        return self._layout.capacity

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def generator(self) -> torch.Generator:
        return self._generator

    def __len__(self) -> int:
        return int(self._layout.filled().sum())

    def ready(self) -> bool:
        """True when every env has ``horizon`` steps (every segment is full)."""
        return self._layout.ready()

    def __repr__(self) -> str:
        return f"RolloutBuffer(shape={list(self.shape)}, filled={len(self)}, spec={self.spec})"

    # -- writing ---------------------------------------------------------------
    def add(self, step: Any) -> None:
        """Store one step of every env (leading dim ``num_envs``) at each env's cursor.

        Raises:
            SpecError: a field's keys, shape or dtype differ from the spec, or the
                leading dim is not ``num_envs``.
            CapacityError: an env already holds ``horizon`` steps (nothing is written).
        """
        self._write(step, self._all, "add")

    def store(self, batch: Any, env_ids: Any) -> None:
        """Store one step of some envs (a slice, range, list or tensor of env ids).

        Each env writes at its own cursor, so envs may be out of step; the whole batch
        is checked (shapes, ids, room) before anything is written.
        """
        self._write(batch, self._layout.ids(env_ids), "store")

    def _write(self, batch: Any, ids: np.ndarray, what: str) -> None:
        flat = flatten(batch)
        spec = self.spec if self.spec is not None else _check_reserved(Spec.from_batch(flat, batch_ndim=1))
        (n,) = spec.validate(flat, batch_ndim=1)
        if n != ids.size:
            raise SpecError(f"{what}: expected one row per env ({ids.size}), got {n} rows")
        slots = self._layout.contiguous(ids)
        where = slots if slots is not None else torch.from_numpy(self._layout.slots(ids))
        if self._storage.spec is None:
            self._storage.initialize(spec)
        self._storage.write(where, flat)
        self._count_episodes(flat, ids)
        self._layout.advance(ids)

    def _count_episodes(self, flat: dict[NestedKey, torch.Tensor], ids: np.ndarray) -> None:
        term = flat.get(self.keys.terminated)
        if term is None:
            return
        done = term.detach().cpu().numpy().reshape(-1).astype(bool)
        trunc = flat.get(self.keys.truncated)
        if trunc is not None:
            done = done | trunc.detach().cpu().numpy().reshape(-1).astype(bool)
        self._episode_steps[ids] += 1
        ended = ids[done]
        if ended.size:
            self._episodes[0] += int(ended.size)
            self._episodes[1] += int(self._episode_steps[ended].sum())
            self._episode_steps[ended] = 0

    def clear(self) -> None:
        """Start the next rollout: cursors to 0, earlier ``"index"`` ids become stale.

        Episodes still running keep their step counts (for ``stats()``'s episode length).
        """
        self._layout.clear()
        self._targets.clear()
        self._generation += 1
        self._episodes = [0, 0]

    def update(self, indices: Any, batch: Any) -> None:
        """Write fields (values, log-probs, ratios, advantages ...) of stored steps in place.

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
        flat = {k: v for k, v in flatten(batch).items() if k not in RESERVED_KEYS - {"advantage", "return"}}
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
        _DERIVED.validate(derived, batch_ndim=1, partial=True)
        slots = live % cap
        if slots.numel() and torch.unique(slots).numel() != slots.numel():
            slots, both = _keep_last(slots, {**rows, **derived})
            rows = {k: both[k] for k in rows}
            derived = {k: both[k] for k in derived}
        if rows:
            self._storage.write(slots, rows)
        if derived:
            self._targets.write(slots, derived)

    def reset_importance_sampling_ratios(self) -> None:
        """Set the stored ``keys.ratio`` field to 1 everywhere (metta's PPO, per rollout)."""
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

        ``target_log_probs``: the learner policy's log-probs in the buffer's shape, or
        ``None`` to use ``log`` of the stored ``keys.ratio`` (target / behaviour).
        """
        self._layout.require_ready("compute_vtrace")
        grids = self._grids(last_values, final_values)
        behaviour = self._field_grid(self.keys.log_prob)
        if target_log_probs is None:
            target = behaviour + torch.log(self._field_grid(self.keys.ratio))
        else:
            target = self._targets.to_grid(torch.as_tensor(target_log_probs), "target_log_probs")
        return self._targets.vtrace(grids, behaviour, target, gamma, rho_bar, c_bar, lam, normalize)

    def _field_grid(self, key: NestedKey) -> torch.Tensor:
        if self.spec is None or key not in self.spec:
            raise SpecError(f"field {key_str(key)!r} is needed here but is not in {self.spec}")
        flat = self._storage.gather(self._layout.grid.reshape(-1), [key])[key]
        return flat.reshape(self._layout.grid.shape).float()

    def _grids(self, last_values: Any, final_values: Any) -> dict[str, torch.Tensor]:
        k = self.keys
        grids = {"rewards": self._field_grid(k.reward), "values": self._field_grid(k.value)}
        grids["terminated"] = self._field_grid(k.terminated)
        has_trunc = self.spec is not None and k.truncated in self.spec
        grids["truncated"] = self._field_grid(k.truncated) if has_trunc else torch.zeros_like(grids["values"])
        final = None
        if grids["truncated"].any():
            if final_values is not None:
                final = self._targets.to_grid(torch.as_tensor(final_values), "final_values")
            elif self.spec is not None and k.final_value in self.spec:
                final = self._field_grid(k.final_value)
            else:
                raise SpecError(
                    f"some steps are truncated: bootstrapping them needs the value of the true final "
                    f"observation; pass final_values= or store a {key_str(k.final_value)!r} field"
                )
        grids["next_values"] = self._targets.next_values(
            grids["values"], last_values, final, grids["truncated"]
        )
        return grids

    # -- reading ---------------------------------------------------------------
    def _gather(self, slots: torch.Tensor, shape: Sequence[int]) -> TensorDict:
        flat = self._storage.gather(slots)
        flat.update(self._targets.gather(slots))
        flat["index"] = (slots + self._generation * self.capacity).to(self._device)
        if len(shape) > 1:
            flat = {k: v.reshape(*shape, *v.shape[1:]) for k, v in flat.items()}
        return to_tensordict(flat, tuple(shape), self._device)

    def _check_same(self, generation: int, what: str) -> None:
        """Minibatch plans are made for one rollout: refuse to read the next one."""
        if self._generation != generation:
            raise RuntimeError(f"{what}: the buffer was cleared during iteration")

    def minibatches(
        self,
        num_minibatches: int,
        epochs: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        normalize_advantages: bool = False,
    ) -> Iterator[TensorDict]:
        """Flat minibatches over all ``T * E`` steps, a fresh permutation every epoch.

        Each is a TensorDict ``[B]`` of the stored fields, ``"advantage"``/``"return"``
        when computed, and ``"index"`` for :meth:`update`. ``normalize_advantages``
        normalizes ``"advantage"`` within each minibatch (the stored values are kept).
        """
        self._layout.require_ready("minibatches")
        plan = flat_plan(self.capacity, num_minibatches, epochs, shuffle, drop_last, self._generator)
        return self._flat(plan, normalize_advantages, self._generation)

    def _flat(self, plan: Iterator[torch.Tensor], normalize: bool, generation: int) -> Iterator[TensorDict]:
        for slots in plan:
            self._check_same(generation, "minibatches")
            td = self._gather(slots, (slots.shape[0],))
            if normalize:
                self._targets.normalize_in(td)
            yield td

    def recurrent_minibatches(
        self,
        num_minibatches: int,
        epochs: int = 1,
        by: str = "env",
        shuffle: bool = True,
        hidden_keys: Sequence[Any] = (),
        pad_to: int | None = None,
    ) -> Iterator[RecurrentBatch]:
        """Trajectories split at episode ends (``terminated | truncated``), padded.

        ``by="env"``: rsl_rl's way, every trajectory of ``num_envs // num_minibatches``
        envs per minibatch (envs permuted each epoch when ``shuffle``, in order if not).
        ``by="trajectory"``: all trajectories shuffled and cut in ``num_minibatches``.
        Each :class:`RecurrentBatch` has ``data [P, N]`` (time, trajectory), padded to
        the longest trajectory of the minibatch (or ``pad_to``), ``data["mask"]``, and
        ``hidden``: the ``hidden_keys`` fields at each trajectory's first step.
        """
        self._layout.require_ready("recurrent_minibatches")
        hidden = [normalize_key(k) for k in hidden_keys]
        unknown = [key_str(k) for k in hidden if self.spec is None or k not in self.spec]
        if unknown:
            raise SpecError(f"hidden_keys: unknown field(s) {unknown}; known: {self.spec}")
        term = self._field_grid(self.keys.terminated) > 0
        if self.spec is not None and self.keys.truncated in self.spec:
            term = term | (self._field_grid(self.keys.truncated) > 0)
        traj = split_trajectories(term)
        plan = trajectory_plan(traj, self._layout.rows, num_minibatches, epochs, by, shuffle, self._generator)
        return self._recurrent(plan, traj, hidden, pad_to, self._generation)

    def _recurrent(
        self,
        plan: Iterator[torch.Tensor],
        traj: Any,
        hidden: list[NestedKey],
        pad_to: int | None,
        generation: int,
    ) -> Iterator[RecurrentBatch]:
        for pick in plan:
            self._check_same(generation, "recurrent_minibatches")
            slots, mask = pad_trajectories(self._layout.grid, traj, pick, pad_to)
            td = self._gather(slots.reshape(-1), tuple(slots.shape))
            td.set("index", torch.where(mask.to(self._device), td["index"], -1))
            td.set("mask", mask.to(self._device))
            start = td[0]
            yield RecurrentBatch(td, start.select(*hidden) if hidden else start.select())

    def segment_minibatches(
        self,
        epochs: int = 1,
        *,
        bptt_horizon: int | None = None,
        minibatch_segments: int | None = None,
        alpha: float = 0.0,
        beta0: float = 0.6,
        progress: float = 0.0,
    ) -> Iterator[TensorDict]:
        """BPTT windows ``[minibatch_segments, bptt_horizon]``, sequential or prioritized.

        Segments are the buffer's rows (segmented layout) or each env's consecutive
        windows of ``bptt_horizon`` steps. ``alpha > 0`` draws segments with probability
        ``∝ sum |advantage| ** alpha`` and adds ``"weight"`` = ``(S p) ** -beta`` with
        ``beta = anneal_beta(beta0, alpha, progress)`` (metta's PPO; ``progress`` =
        epoch / total epochs of training). Needs :meth:`compute_returns` when prioritized.
        """
        self._layout.require_ready("segment_minibatches")
        seg = self._segment_grid(bptt_horizon)
        default = self.sizes.minibatch_segments if self.sizes is not None else None
        per = check_positive_int("minibatch_segments", minibatch_segments or default or 0)
        if seg.shape[0] % per:
            raise CapacityError(f"minibatch_segments {per} does not divide the {seg.shape[0]} segments")
        check_positive_int("epochs", epochs)
        beta = anneal_beta(beta0, alpha, progress)
        adv = self._targets.gather(seg.reshape(-1)).get("advantage")
        adv = adv.reshape(seg.shape) if adv is not None else None
        plans = [
            segment_plan(adv, per, seg.shape[0] // per, alpha, beta, self._generator) for _ in range(epochs)
        ]
        return self._segments(seg, plans, self._generation)

    def _segments(self, seg: torch.Tensor, plans: list[Any], generation: int) -> Iterator[TensorDict]:
        for plan in plans:
            for rows, weight in plan:
                self._check_same(generation, "segment_minibatches")
                slots = seg.index_select(0, rows)
                td = self._gather(slots.reshape(-1), tuple(slots.shape))
                td.set("weight", weight.to(self._device).unsqueeze(1).expand(slots.shape).contiguous())
                yield td

    def _segment_grid(self, bptt_horizon: int | None) -> torch.Tensor:
        rows = self._layout.grid.T  # [R, L]: each writer's steps in time order
        h = rows.shape[1] if bptt_horizon is None else check_positive_int("bptt_horizon", bptt_horizon)
        if rows.shape[1] % h:
            raise CapacityError(f"bptt_horizon {h} does not divide the {rows.shape[1]} steps of each row")
        return rows.reshape(-1, h)

    def steps(self) -> Iterator[TensorDict]:
        """One TensorDict ``[num_envs]`` per time step, in order (distillation: student
        and teacher actions of every env at step ``t``)."""
        self._layout.require_ready("steps")
        return self._steps(self._generation)

    def _steps(self, generation: int) -> Iterator[TensorDict]:
        grid = self._layout.grid
        for t in range(grid.shape[0]):
            self._check_same(generation, "steps")
            yield self._gather(grid[t], (grid.shape[1],))

    def stats(self) -> dict[str, float]:
        """Means of the tracked fields present, over the stored steps.

        ``reward``, ``value``, ``log_prob``, ``ratio`` (their ``keys`` names),
        ``advantage``/``return`` once computed, ``episode_length`` (mean length of the
        episodes that ended during this rollout, counted across rollouts), and
        ``action_mean``/``action_std``.
        """
        out: dict[str, float] = {}
        if self.spec is None or not len(self):
            return out
        filled = torch.from_numpy(self._layout.filled())
        slots = self._layout.grid[filled]
        k = self.keys
        names = {"reward": k.reward, "value": k.value, "log_prob": k.log_prob, "ratio": k.ratio}
        present = {n: key for n, key in names.items() if key in self.spec}
        data = self._storage.gather(slots, list(present.values())) if present else {}
        out.update({n: float(data[key].float().mean()) for n, key in present.items()})
        out.update({key_str(n): float(v.mean()) for n, v in self._targets.gather(slots).items()})
        if self._episodes[0]:
            out["episode_length"] = self._episodes[1] / self._episodes[0]
        if k.action in self.spec:
            action = self._storage.gather(slots, [k.action])[k.action].float()
            out["action_mean"] = float(action.mean())
            out["action_std"] = float(action.std()) if action.numel() > 1 else 0.0
        return out


def _check_reserved(spec: Spec) -> Spec:
    clash = sorted(key_str(k) for k in spec if k in RESERVED_KEYS)
    if clash:
        raise SpecError(
            f"field {clash[0]!r} is reserved: rollout minibatches carry their own "
            f"{sorted(RESERVED_KEYS)} entries, which would hide it; rename it"
        )
    return spec
