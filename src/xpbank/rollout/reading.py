"""The reading side of a :class:`~xpbank.RolloutBuffer`: minibatches and stats.

Every reader turns a plan of slots (:mod:`xpbank.rollout.minibatch`) into TensorDicts
with one ``index_select`` per packed block (the stored fields, then the computed
advantages/returns), and never writes to storage. A plan is made for the rollout as it
is when the iterator is made: a ``clear()`` after that (and so any write: a complete rollout
has room again only after one), or an :meth:`~xpbank.RolloutBuffer.update` that changes
an episode end (``terminated`` / ``truncated``: trajectories are cut there), raises
:class:`~xpbank.BufferChangedError` at the iterator's next ``next()``. :meth:`RolloutReader.view`
hands a stored field out as a tensor view (for front-ends such as ``xpbank.compat``);
writing into it is the caller's doing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import torch
from tensordict import TensorDict

from xpbank.errors import BufferChangedError, CapacityError, SpecError, XpbankIndexError, check_positive_int
from xpbank.rollout.layout import SegmentLayout, SegmentSizes, TimeLayout
from xpbank.rollout.minibatch import (
    anneal_beta,
    flat_plan,
    pad_trajectories,
    segment_plan,
    split_trajectories,
    trajectory_plan,
)
from xpbank.rollout.targets import Targets
from xpbank.spec.batch import to_tensordict
from xpbank.spec.spec import NestedKey, Spec, key_str, normalize_key
from xpbank.storage import TensorStorage

__all__ = ["RolloutReader", "RecurrentBatch"]


class RecurrentBatch(NamedTuple):
    """A recurrent minibatch: ``data [P, N]`` padded trajectories (with ``"mask"``; the
    padding's ``"index"`` is -1) and ``hidden [N]``: the ``hidden_keys`` fields at each
    trajectory's first step (the state to start the recurrent network from).

    Example:
        >>> import torch
        >>> from xpbank import RolloutBuffer
        >>> rb = RolloutBuffer(num_envs=1, horizon=3)
        >>> for t in range(3):
        ...     rb.add({"h": torch.full((1, 2), float(t)), "terminated": torch.tensor([t == 0])})
        >>> b = next(rb.recurrent_minibatches(1, shuffle=False, hidden_keys=["h"]))
        >>> b.data["mask"].T.tolist(), b.hidden["h"][:, 0].tolist()
        ([[True, False], [True, True]], [0.0, 1.0])
    """

    data: TensorDict
    hidden: TensorDict


class RolloutReader:
    """Minibatch generators and stats over a rollout (the base of ``RolloutBuffer``)."""

    _layout: TimeLayout | SegmentLayout
    _storage: TensorStorage
    _targets: Targets
    _generation: int
    _stamp: tuple[int, str]  # (episode-end updates so far, which fields the last one changed)
    _generator: torch.Generator
    _device: torch.device
    _episodes: list[int]
    sizes: SegmentSizes | None
    keys: Any

    @property
    def spec(self) -> Spec | None:
        return self._storage.spec

    @property
    def capacity(self) -> int:
        return self._layout.capacity

    def __len__(self) -> int:
        return int(self._layout.filled().sum())

    def view(self, key: Any) -> torch.Tensor:
        """A stored field, or ``"advantage"``/``"return"``, in the buffer's shape, as a view.

        Threads: a view of the live storage (writes show through); not safe while another thread
        writes (no lock); share the buffer under a lock of your own.

        For front-ends whose users index a rollout as tensors (rsl_rl's
        ``storage.values[t]``, metta's ``buffer``): writing into the view writes the
        buffer, without validation. A view of ``"advantage"``/``"return"`` hands their
        computation to the caller: minibatches carry what those views hold (until
        ``clear()``; taking the view again after it hands them over again).

        Example:
            >>> import torch
            >>> from xpbank import RolloutBuffer
            >>> rb = RolloutBuffer(num_envs=2, horizon=1)
            >>> rb.add({"reward": torch.ones(2)})
            >>> rb.view("reward").shape, rb.view("return").fill_(2.0).shape
            (torch.Size([1, 2]), torch.Size([1, 2]))
            >>> next(rb.minibatches(1, shuffle=False))["return"].tolist()
            [2.0, 2.0]
        """
        key = normalize_key(key)
        if key in ("advantage", "return"):
            self._targets.computed = True
            flat = self._targets.storage.view(key)
        elif self.spec is None or key not in self.spec:
            raise SpecError(f"view: no field {key_str(key)!r} in {self.spec}")
        else:
            flat = self._storage.view(key)
        return flat.unflatten(0, tuple(self._targets.shape))

    def index_of(self, slots: Any) -> torch.Tensor:
        """The ``"index"`` ids of ``slots`` of the current rollout (what minibatches carry,
        and :meth:`update` takes); slot ``s`` of ``[S, H]`` / ``[T, E]`` is ``row * cols + col``.

        Threads: one read of the rollout's generation; not safe while another thread writes (no lock);
        share the buffer under a lock of your own.

        Example:
            >>> from xpbank import RolloutBuffer
            >>> rb = RolloutBuffer(num_envs=2, horizon=2)
            >>> rb.clear(); rb.index_of([0, 3]).tolist()
            [4, 7]
        """
        ids = torch.as_tensor(slots, dtype=torch.int64)
        bad = ids[(ids < 0) | (ids >= self.capacity)]
        if bad.numel():
            raise XpbankIndexError(f"index_of: slot {int(bad[0])} is out of range [0, {self.capacity})")
        return ids + self._generation * self.capacity

    def _field_grids(self, keys: Sequence[NestedKey]) -> list[torch.Tensor]:
        """Stored fields as time-major grids ``[L, R]`` (read in one pass over the rows)."""
        missing = [key_str(k) for k in keys if self.spec is None or k not in self.spec]
        if missing:
            raise SpecError(f"field {missing[0]!r} is needed here but is not in {self.spec}")
        cols = self._storage.columns(keys)
        return [self._targets.to_grid(cols[k], key_str(k)) for k in keys]

    def _gather(self, slots: torch.Tensor, shape: Sequence[int]) -> TensorDict:
        flat = self._storage.gather(slots)
        flat.update(self._targets.gather(slots))
        flat["index"] = (slots + self._generation * self.capacity).to(self._device)
        if len(shape) > 1:
            flat = {k: v.reshape(*shape, *v.shape[1:]) for k, v in flat.items()}
        return to_tensordict(flat, tuple(shape), self._device)

    def _marker(self) -> tuple[int, int]:
        """What an iterator's plan is made for: the rollout (moved on by ``clear``) and its ends."""
        return self._generation, self._stamp[0]

    def _note_ends(self, slots: torch.Tensor, rows: dict[NestedKey, torch.Tensor]) -> None:
        """Before an update writes ``rows`` at ``slots``: move the marker on where it rewrites
        an episode end (repeating the stored flags, as a minibatch passed back whole does, is none)."""
        ends = [k for k in (self.keys.terminated, self.keys.truncated) if k in rows]
        if not ends or not slots.numel():
            return
        old = self._storage.gather(slots, ends)
        moved = [key_str(k) for k in ends if not torch.equal(old[k], rows[k].to(old[k].device))]
        if moved:
            self._stamp = (self._stamp[0] + 1, f"updated (episode ends {moved} rewritten)")

    def _check_same(self, marker: tuple[int, int], what: str) -> None:
        """A plan is made for one state of the rollout: refuse to read another."""
        if marker == self._marker():
            return
        how = "cleared" if marker[0] != self._generation else self._stamp[1]
        raise BufferChangedError(
            f"{what}: the buffer was {how} during iteration; the plan was made for the rollout "
            f"as it was when the iterator was made: make a new iterator"
        )

    def minibatches(
        self,
        num_minibatches: int,
        epochs: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        normalize_advantages: bool = False,
        reuse_order: bool = False,
    ) -> Iterator[TensorDict]:
        """Flat minibatches over all ``T * E`` steps, a fresh permutation every epoch.

        Threads: no lock; the plan is made at the call: a clear (so a write) or episode-end update after
        it raises :class:`~xpbank.BufferChangedError` at the next minibatch (:meth:`update` of other
        fields is fine); hold your own lock for the whole loop if another thread writes.

        Each is a TensorDict ``[B]`` of the stored fields, ``"advantage"``/``"return"``
        when computed, and ``"index"`` for :meth:`update`. ``normalize_advantages``
        normalizes ``"advantage"`` within each minibatch (the stored values are kept).
        ``reuse_order``: rsl_rl's order instead (see :func:`~xpbank.rollout.minibatch.flat_plan`).
        """
        self._layout.require_ready("minibatches")
        plan = flat_plan(
            self.capacity, num_minibatches, epochs, shuffle, drop_last, self._generator, reuse_order
        )
        return self._flat(plan, normalize_advantages, self._marker())

    def _flat(
        self, plan: Iterator[torch.Tensor], normalize: bool, marker: tuple[int, int]
    ) -> Iterator[TensorDict]:
        for slots in plan:
            self._check_same(marker, "minibatches")
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
        drop_last: bool = False,
    ) -> Iterator[RecurrentBatch]:
        """Trajectories split at episode ends (``terminated | truncated``), padded.

        Threads: no lock; the plan is made at the call (the trajectories from the episode ends
        then): a clear (so a write) or an :meth:`update` changing an episode end after it raises
        :class:`~xpbank.BufferChangedError` at the next minibatch; hold your own lock for the whole loop.

        ``by="env"``: rsl_rl's way, every trajectory of ``num_envs / num_minibatches``
        envs per minibatch (sizes differ by one where it does not divide, or, with
        ``drop_last``, ``num_envs // num_minibatches`` each and the rest left out, as
        rsl_rl does; envs permuted each epoch when ``shuffle``, in order if not).
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
        ends = [self.keys.terminated]
        if self.spec is not None and self.keys.truncated in self.spec:
            ends.append(self.keys.truncated)
        term = torch.stack([g != 0 for g in self._field_grids(ends)]).any(0)
        traj = split_trajectories(term)
        plan = trajectory_plan(
            traj, self._layout.rows, num_minibatches, epochs, by, shuffle, self._generator, drop_last
        )
        return self._recurrent(plan, traj, hidden, pad_to, self._marker())

    def _recurrent(
        self,
        plan: Iterator[torch.Tensor],
        traj: Any,
        hidden: list[NestedKey],
        pad_to: int | None,
        marker: tuple[int, int],
    ) -> Iterator[RecurrentBatch]:
        for pick in plan:
            self._check_same(marker, "recurrent_minibatches")
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

        Threads: no lock; the plan is made at the call (the priorities from the advantages then): a
        clear (so a write) or episode-end update after it raises :class:`~xpbank.BufferChangedError` at
        the next minibatch; hold your own lock for the whole loop.

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
        return self._segments(seg, plans, self._marker())

    def _segments(self, seg: torch.Tensor, plans: list[Any], marker: tuple[int, int]) -> Iterator[TensorDict]:
        for plan in plans:
            for rows, weight in plan:
                self._check_same(marker, "segment_minibatches")
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
        and teacher actions of every env at step ``t``).

        Threads: no lock; a clear (so a write) or episode-end update after the call raises
        :class:`~xpbank.BufferChangedError` at the next step; hold your own lock for the whole loop.
        """
        self._layout.require_ready("steps")
        return self._steps(self._marker())

    def _steps(self, marker: tuple[int, int]) -> Iterator[TensorDict]:
        grid = self._layout.grid
        for t in range(grid.shape[0]):
            self._check_same(marker, "steps")
            yield self._gather(grid[t], (grid.shape[1],))

    def stats(self) -> dict[str, float]:
        """Means of the tracked fields present, over the stored steps.

        Threads: reads every step, so not safe while another thread writes (no lock); share
        the buffer under a lock of your own.

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
