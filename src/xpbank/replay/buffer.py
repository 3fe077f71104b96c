"""ReplayBuffer: a FIFO ring writer wired to a storage and a sampler.

The buffer holds up to ``capacity`` items laid out by a :class:`~xpbank.Spec`. ``add``
and ``extend`` copy items in at the ring's cursor; once full, each new item overwrites
the oldest. Sampling asks the sampler for slots and the storage for their data.

Every sampled batch carries an ``"index"`` entry: the items' ids. An id names one item
for as long as it is stored, ``update(batch["index"], values)`` writes back in place,
and an id whose item has since been overwritten is rejected instead of silently hitting
the newer item in its slot (``id % capacity`` is the slot).

What is copied: ``add``/``extend`` copy the data (the buffer keeps no reference to what
you pass). A sampled batch is a fresh block of memory: changing it changes nothing
stored. With the default packed :class:`~xpbank.TensorStorage`, same-dtype fields of a
batch are views into one block (non-contiguous when there are several).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from xpbank.errors import CapacityError, EmptyBufferError, PriorityError, SpecError, check_positive_int
from xpbank.nstep.option import NStep
from xpbank.ring.episodes import EpisodeIndex, EpisodeKeys, wants_episodes
from xpbank.ring.ids import Ring
from xpbank.sampler import Sampler, UniformSampler, epoch_plan, sampler_config
from xpbank.sampler.priorities import check_update
from xpbank.spec.batch import flatten, to_tensordict
from xpbank.spec.spec import NestedKey, Spec, check_fields, reject_reserved
from xpbank.storage import MemmapStorage, Storage, TensorStorage
from xpbank.storage.base import check_capacity, check_device

__all__ = ["ReplayBuffer"]

_STATE_VERSION = 1


def _make_storage(storage: Any, capacity: int, spec: Spec | None, storing_device: Any) -> Storage:
    if storage == "memory":
        return TensorStorage(capacity, spec, device=storing_device)
    if storage == "memmap":
        if check_device(storing_device).type != "cpu":
            raise SpecError(f"storage='memmap' keeps data on the CPU; got storing_device={storing_device!r}")
        return MemmapStorage(capacity, spec=spec)
    if isinstance(storage, str):
        raise SpecError(f"storage: expected 'memory', 'memmap' or a Storage, got {storage!r}")
    if not isinstance(storage, Storage):
        raise SpecError(f"storage: expected 'memory', 'memmap' or a Storage, got {type(storage).__name__}")
    if storage.capacity != capacity:
        raise CapacityError(f"storage has capacity {storage.capacity}, but the buffer was given {capacity}")
    if spec is not None:
        if storage.spec is None:
            storage.initialize(spec)
        elif storage.spec != spec:
            raise SpecError(f"storage holds {storage.spec}, but the buffer was given {spec}")
    return storage


RESERVED_KEYS = frozenset({"index"})


def _locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the buffer's lock (see ``ReplayBuffer.lock``)."""

    @functools.wraps(method)
    def run(self: ReplayBuffer, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run


def _check_reserved(spec: Spec) -> Spec:
    """Reject a spec with a key that sampled batches use for their own entries."""
    why = "sampled batches carry the items' ids under 'index', which would hide the stored field"
    return reject_reserved(spec, RESERVED_KEYS, why)


class ReplayBuffer:
    """A fixed-capacity FIFO replay buffer with uniform (or pluggable) sampling.

    Args:
        capacity: the most items held; older ones are overwritten first.
        spec: the item layout; ``None`` takes it from the first ``add``/``extend`` and
            checks every later batch against it.
        storage: ``"memory"`` (a :class:`~xpbank.TensorStorage` on ``storing_device``),
            ``"memmap"`` (a :class:`~xpbank.MemmapStorage` in a temporary directory), or
            a storage instance of the same capacity.
        storing_device: where the data lives (``"memory"`` only).
        device: where sampled batches are delivered; default: where the data lives.
        sampler: which items to draw; default :class:`~xpbank.sampler.UniformSampler`.
        seed: seeds the buffer's own ``torch.Generator``; the same seed and the same
            calls give the same samples.
        num_envs: each ``extend`` of ``k * num_envs`` items is ``k`` steps of that many
            vector envs (time-major); the buffer then keeps an
            :class:`~xpbank.EpisodeIndex` (``rb.episodes``). It also keeps one when the
            items carry an ``env_id`` field.
        episode_keys: which fields hold the env id and episode ends (default: found by
            the usual names; see :class:`~xpbank.EpisodeKeys`).
        nstep: add n-step returns to every :meth:`sample` (see :class:`~xpbank.NStep`);
            the buffer then keeps an episode index. ``nstep`` and ``episode_keys`` also
            take the dicts their ``config()`` gives (how a bank rebuilds a buffer).
        cast: convert a batch's dtypes to the spec's where nothing that matters is lost
            (float64 -> float32, int32 -> int64, Python numbers; see
            :func:`xpbank.spec.cast.is_safe_cast`), after checking the whole batch; a wrong
            shape or a float for an int field is still a :class:`~xpbank.SpecError`.
            ``False``: every dtype must match exactly. Costs nothing when dtypes match.

    Threads: every public call holds one reentrant lock (:attr:`lock`) for its whole
    length, so a collector thread and a learner thread can share a buffer: each call
    sees the buffer before or after another, never halfway. Hold ``with rb.lock:`` to
    make several calls one step (``xpbank.save`` does while it copies a buffer out).
    Uncontended it costs about 0.1 µs a call; contended, calls run one at a time.

    Example:
        >>> import torch
        >>> from xpbank import ReplayBuffer
        >>> rb = ReplayBuffer(1000, seed=0)
        >>> rb.extend({"obs": torch.randn(64, 4), "reward": torch.zeros(64)})
        range(0, 64)
        >>> batch = rb.sample(32)
        >>> batch["obs"].shape, batch["index"].shape
        (torch.Size([32, 4]), torch.Size([32]))
    """

    def __init__(
        self,
        capacity: int,
        spec: Spec | None = None,
        *,
        storage: str | Storage = "memory",
        storing_device: Any = "cpu",
        device: Any = None,
        sampler: Sampler | None = None,
        seed: int | None = None,
        num_envs: int | None = None,
        episode_keys: EpisodeKeys | Mapping[str, Any] | None = None,
        nstep: NStep | Mapping[str, Any] | None = None,
        cast: bool = True,
    ):
        capacity = check_capacity(capacity)
        if not isinstance(cast, bool):
            raise SpecError(f"cast: expected True or False, got {cast!r}")
        self._cast = cast
        if spec is not None and not isinstance(spec, Spec):
            raise SpecError(f"spec: expected a Spec or None, got {type(spec).__name__}")
        given = spec if spec is not None else getattr(storage, "spec", None)
        if given is not None:
            _check_reserved(given)  # before _make_storage creates anything
        self._storage = _make_storage(storage, capacity, spec, storing_device)
        self._device = check_device(device) if device is not None else self._storage.device
        self._sampler: Sampler = sampler if sampler is not None else UniformSampler()
        bind_device = getattr(self._sampler, "bind_device", None)  # e.g. PER's trees follow the data
        if bind_device is not None:
            bind_device(self._storage.device)
        self._ring = Ring(capacity)
        if isinstance(episode_keys, Mapping):  # a config() from a bank
            episode_keys = EpisodeKeys.from_config(episode_keys)
        if isinstance(nstep, Mapping):
            nstep = NStep(**nstep)
        self._num_envs, self._episode_keys = num_envs, episode_keys or EpisodeKeys()
        if nstep is not None and not isinstance(nstep, NStep):
            raise SpecError(f"nstep: expected an NStep or None, got {type(nstep).__name__}")
        self._nstep = nstep
        needed = nstep is not None or getattr(self._sampler, "needs_episodes", False)
        needed = needed or getattr(self._storage, "needs_episodes", False)  # e.g. FrameStorage
        if wants_episodes(given, self._episode_keys, num_envs, needed):
            self._ring.episodes = EpisodeIndex(self._ring, num_envs, self._episode_keys)
        if hasattr(self._storage, "attach"):  # a storage that reads the episode index
            self._storage.attach(self._ring)
        self._lock = threading.RLock()
        self._generator = torch.Generator()
        if seed is None:
            self._generator.seed()
        else:
            self._generator.manual_seed(seed)

    # -- properties ------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """The most items the buffer holds."""
        return self._ring.capacity

    @property
    def spec(self) -> Spec | None:
        """The item layout (``None`` until the first write of a lazily laid out buffer)."""
        return self._storage.spec

    @property
    def storage(self) -> Storage:
        return self._storage

    @property
    def sampler(self) -> Sampler:
        return self._sampler

    @property
    def episodes(self) -> EpisodeIndex | None:
        """Each item's env and episode bounds, when kept (``num_envs=``, an env field)."""
        return self._ring.episodes

    @property
    def device(self) -> torch.device:
        """Where sampled batches are delivered."""
        return self._device

    @property
    def generator(self) -> torch.Generator:
        """The buffer's source of randomness (its state is in :meth:`state_dict`)."""
        return self._generator

    @property
    def lock(self) -> threading.RLock:
        """The reentrant lock every public call holds; ``with rb.lock:`` groups calls."""
        return self._lock

    def __getstate__(self) -> dict[str, Any]:
        """Pickling (e.g. SB3's ``save_replay_buffer``) leaves the lock out: a lock is
        not picklable, and a copy gets a fresh one."""
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._ring.size

    @property
    def is_full(self) -> bool:
        return self._ring.size == self._ring.capacity

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={len(self)}/{self.capacity}, storage={type(self._storage).__name__}, "
            f"sampler={self._sampler!r}, device={str(self._device)!r}, spec={self.spec})"
        )

    # -- writing ---------------------------------------------------------------
    @_locked
    def add(self, item: Any) -> int:
        """Store one item (a mapping or TensorDict without a batch dim); returns its id."""
        flat = flatten(item)
        spec = self.spec if self.spec is not None else _check_reserved(Spec.from_batch(flat, batch_ndim=0))
        _, flat = self._conform(spec, flat, 0)
        return int(self._write({k: v.unsqueeze(0) for k, v in flat.items()}, 1, spec)[0])

    @_locked
    def extend(self, batch: Any) -> range:
        """Store a batch of items (leading dim = items); returns their ids, as a ``range``.

        ``torch.as_tensor(rb.extend(batch))`` gives them as a tensor; a range costs
        nothing to make on the hot path.

        The whole batch is checked before anything is written: on error the buffer is
        unchanged. A batch larger than ``capacity`` leaves its last ``capacity`` items.

        Raises:
            SpecError: missing/unknown keys, or a field's shape or dtype differs from the spec.
            BatchTypeError: ``batch`` is not a TensorDict or mapping of tensors/arrays.
        """
        flat = flatten(batch)
        spec = self.spec if self.spec is not None else _check_reserved(Spec.from_batch(flat, batch_ndim=1))
        (n,), flat = self._conform(spec, flat, 1)
        return self._write(flat, n, spec)

    def _conform(
        self, spec: Spec, flat: dict[NestedKey, torch.Tensor], batch_ndim: int, partial: bool = False
    ) -> tuple[tuple[int, ...], dict[NestedKey, torch.Tensor]]:
        """Validate ``flat`` against ``spec`` (converting safe dtypes when ``cast``)."""
        if self._cast:
            return spec.conform(flat, batch_ndim, partial)
        return spec.validate(flat, batch_ndim, partial), flat

    def _write(self, flat: dict[NestedKey, torch.Tensor], n: int, spec: Spec) -> range:
        ring = self._ring
        if self._storage.spec is None and wants_episodes(spec, self._episode_keys, None, False):
            ring.episodes = EpisodeIndex(ring, self._num_envs, self._episode_keys)
        plan = ring.episodes.plan(flat, n, spec) if ring.episodes is not None else None
        if self._storage.spec is None:
            self._storage.initialize(spec)
        if plan is not None and hasattr(self._storage, "prepare_write"):
            self._storage.prepare_write(flat, n, plan)  # checks the whole batch first
        first = ring.next_id
        for slots, rows in ring.segments(n):
            part = flat if rows.stop - rows.start == n else {k: v[rows] for k, v in flat.items()}
            self._storage.write(slots, part)
            self._sampler.on_write(slots, ring)
        ring.advance(n)
        if plan is not None:
            ring.episodes.apply(plan)  # type: ignore[union-attr]
        return range(first, first + n)

    @_locked
    def update(self, indices: Any, batch: Any) -> None:
        """Overwrite fields of stored items in place, by the ids a sample returned.

        Args:
            indices: ids, e.g. ``sampled["index"]``; a repeated id keeps its last row.
            batch: the new values: any subset of the spec's fields, one row per index.
                Entries under reserved names (``"index"``) are ignored, so a uniform
                sample can be passed back whole: ``rb.update(batch["index"], batch)``
                (a prioritized one without its ``"weight"``). An n-step sample cannot:
                its next fields are its windows' last items', not the items'.

        Raises:
            StaleIndexError: an id's item has been overwritten (or cleared) since it was
                sampled; nothing is written.
            SpecError: unknown keys (an n-step sample's ``nstep_*`` entries among them,
                named as such), a wrong shape or dtype, or a row count that differs from
                the number of indices.
        """
        if self.spec is None:
            raise EmptyBufferError("update: the buffer is empty (nothing has been written yet)")
        slots = self._ring.slots_of_ids(indices)
        flat = {k: v for k, v in flatten(batch).items() if k not in RESERVED_KEYS}
        if self._nstep is not None and "nstep_return" in flat and "nstep_return" not in self.spec:
            raise SpecError(
                "update: got an n-step sample (it has 'nstep_return'); its next fields are its "
                "windows' last items', so writing it back would move them onto the items: pass "
                "only the fields to rewrite, e.g. {'reward': ...}"
            )
        lead, flat = self._conform(self.spec, flat, 1, partial=True)
        if lead and lead[0] != slots.shape[0]:
            raise SpecError(f"update: got {slots.shape[0]} indices but {lead[0]} rows of values")
        if slots.shape[0] and torch.unique(slots).numel() != slots.shape[0]:
            slots, flat = _keep_last(slots, flat)
        self._storage.write(slots, flat)
        if self._nstep is not None:  # n-step results kept for these items' windows
            self._nstep.rewritten(self.spec, self._ring, slots, flat.keys())

    @_locked
    def update_priority(self, indices: Any, priorities: Any, stale: str = "raise") -> None:
        """Set the priorities of stored items, by the ids a sample returned.

        Args:
            indices: ids, e.g. ``batch["index"]``; a repeated id keeps its last priority.
            priorities: one number >= 0 per id, e.g. ``td_error.abs()``.
            stale: ``"raise"``: an id overwritten (or cleared) since it was sampled raises
                and nothing is written; ``"skip"``: such ids are dropped, the rest written.

        Raises:
            PriorityError: the sampler keeps no priorities; NaN, infinite or negative
                priorities; not one priority per id. Nothing is written.
            XpbankIndexError: an id that was never issued.
            StaleIndexError: (``stale="raise"``) an overwritten or cleared id.
        """
        update = getattr(self._sampler, "update_priority", None)
        if update is None:
            raise PriorityError(
                f"update_priority: {self._sampler!r} keeps no priorities; build the buffer "
                "with sampler=PrioritizedSampler()"
            )
        update(*check_update(self._ring, indices, priorities, stale))

    @_locked
    def clear(self) -> None:
        """Drop every item. Ids handed out before become stale. Memory is kept."""
        self._ring.clear()
        self._sampler.on_clear()

    # -- reading ---------------------------------------------------------------
    def _fields(self, fields: Sequence[Any] | None) -> list[NestedKey] | None:
        return None if fields is None else check_fields(self.spec, fields)

    def _gather(
        self,
        slots: torch.Tensor,
        ids: torch.Tensor,
        keys: list[NestedKey] | None,
        info: dict[str, torch.Tensor] | None = None,
        flat: dict[Any, torch.Tensor] | None = None,
    ) -> TensorDict:
        """Read ``slots`` (``keys`` already checked by :meth:`_fields`) into a batch.

        ``slots`` of shape ``[B, L]`` (a sequence sampler's windows) give a ``[B, L]`` batch.
        ``flat``: the fields already read (n-step reads the items with their windows).
        """
        if flat is None:
            flat = self._storage.gather(slots.reshape(-1) if slots.ndim > 1 else slots, keys)
            if slots.ndim > 1:
                flat = {k: v.reshape(*slots.shape, *v.shape[1:]) for k, v in flat.items()}
        # _check_reserved keeps a stored field from being shadowed by "index"
        device = self._storage.device
        flat["index"] = ids if ids.device == device else ids.to(device)  # .to's parsing: ~1 us
        if info:
            flat.update({name: value.to(self._storage.device) for name, value in info.items()})
        td = to_tensordict(flat, tuple(slots.shape), device)
        if device != self._device:
            td = td.to(self._device, non_blocking=self._device.type == "cuda")
        return td

    def _require_items(self, what: str) -> None:
        if self._ring.size == 0:
            raise EmptyBufferError(f"{what}: the buffer is empty; add or extend first")

    @_locked
    def sample(
        self, batch_size: int, replace: bool = True, fields: Sequence[Any] | None = None
    ) -> TensorDict:
        """Draw ``batch_size`` items (uniformly, with the default sampler).

        Args:
            batch_size: items to draw.
            replace: draw with replacement; ``False`` gives distinct items in one batch.
            fields: only these fields (plus ``"index"``); default all.

        Returns:
            A TensorDict of batch size ``[batch_size]`` on ``device``, with ``"index"``
            and whatever per-item entries the sampler adds (e.g. weights).

        Raises:
            EmptyBufferError: nothing stored.
            CapacityError: ``replace=False`` and more items asked for than are stored.
        """
        batch_size = check_positive_int("batch_size", batch_size)
        self._require_items("sample")
        if not replace and batch_size > self._ring.size:
            raise CapacityError(
                f"sample: {batch_size} distinct items asked for (replace=False), but only "
                f"{self._ring.size} are stored"
            )
        keys = self._fields(fields)  # checked before any randomness is drawn
        slots, info = self._sampler.sample(self._ring, batch_size, self._generator, replace)
        ids = self._ring.ids_of_slots(slots)
        if self._nstep is not None:  # the items' fields and their n-step entries in one read
            return self._gather(
                slots, ids, keys, info, self._nstep.gather(self._storage, self._ring, slots, ids, keys)
            )
        return self._gather(slots, ids, keys, info)

    @_locked
    def sample_by_index(self, indices: Any, fields: Sequence[Any] | None = None) -> TensorDict:
        """The items at logical positions ``indices``: 0 is the oldest, -1 the newest.

        Raises:
            XpbankIndexError: a position outside ``[-len(self), len(self))``.
        """
        self._require_items("sample_by_index")
        slots, ids = self._ring.slots_of_positions(indices)
        return self._gather(slots, ids, self._fields(fields))

    def sample_all(self, fields: Sequence[Any] | None = None) -> TensorDict:
        """Every stored item, oldest first."""
        self._require_items("sample_all")
        return self.sample_by_index(np.arange(self._ring.size), fields)

    def epochs(
        self,
        batch_size: int,
        n_epochs: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        fields: Sequence[Any] | None = None,
    ) -> Iterator[TensorDict]:
        """Minibatches that visit every stored item once per epoch.

        Adding to or clearing the buffer while iterating raises ``RuntimeError`` at the
        next minibatch (the plan was made for the items stored when it began);
        in-place :meth:`update` is allowed. Bad arguments raise at the call.
        """
        plan = epoch_plan(len(self), batch_size, n_epochs, shuffle, drop_last, self._generator)
        self._require_items("epochs")
        return self._run_plan(plan, self._fields(fields))

    def _run_plan(self, plan: Iterator[torch.Tensor], keys: list[NestedKey] | None) -> Iterator[TensorDict]:
        marker = (self._ring.next_id, self._ring.size)
        for positions in plan:
            with self._lock:
                if (self._ring.next_id, self._ring.size) != marker:
                    raise RuntimeError("epochs: the buffer was extended or cleared during iteration")
                slots, ids = self._ring.slots_of_positions(positions)
                batch = self._gather(slots, ids, keys)
            yield batch

    # -- state -----------------------------------------------------------------
    @_locked
    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """Everything needed to resume: data, cursor, ids, sampler and RNG state.

        Safe to ``torch.save`` and to load with ``torch.load(..., weights_only=True)``.
        ``data=False`` leaves out the stored items and the storage's own layout (banks
        write every field as a plain array and load it into a memory or memmap storage,
        so a :class:`~xpbank.FrameStorage` buffer saves its fields whole).
        """
        spec = self._storage.spec
        storage = (
            self._storage.state_dict(self._ring.size)
            if data
            else {"spec": None if spec is None else spec.to_dict(), "data": []}
        )
        return {
            "version": _STATE_VERSION,
            "ring": self._ring.state_dict(),
            "generator": self._generator.get_state(),
            "sampler": self._sampler.state_dict(),
            "storage": storage,
            **({"episodes": self._ring.episodes.state_dict()} if self._ring.episodes is not None else {}),
        }

    @_locked
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` into a buffer of the same capacity."""
        if state.get("version") != _STATE_VERSION:
            raise SpecError(f"state version: expected {_STATE_VERSION}, got {state.get('version')!r}")
        capacity = int(state["ring"]["capacity"])
        if capacity != self.capacity:
            raise CapacityError(f"state is of a buffer of capacity {capacity}, this one has {self.capacity}")
        if self._ring.episodes is not None and "episodes" not in state and int(state["ring"]["size"]):
            raise SpecError(
                "state holds no episode index, but this buffer keeps one (num_envs, an env field or "
                "nstep): its items' envs and episode ends cannot be recovered; build it without them"
            )
        self._storage.load_state_dict(state["storage"])
        self._ring.load_state_dict(state["ring"])
        self._sampler.load_state_dict(state["sampler"])
        self._generator.set_state(state["generator"])
        if "episodes" in state:
            if self._ring.episodes is None:
                self._ring.episodes = EpisodeIndex(self._ring, self._num_envs, self._episode_keys)
            self._ring.episodes.load_state_dict(state["episodes"])
        elif self._ring.episodes is not None:  # an empty state: the ring's ids may have moved
            self._ring.episodes.restart()

    def config(self) -> dict[str, Any]:
        """The JSON-able constructor options a bank rebuilds this buffer from.

        Example:
            >>> ReplayBuffer(100).config()
            {'capacity': 100, 'sampler': {'name': 'uniform', 'config': {}}}
        """
        out: dict[str, Any] = {"capacity": self.capacity, "sampler": sampler_config(self._sampler)}
        if self._num_envs is not None:
            out["num_envs"] = self._num_envs
        if self._episode_keys != EpisodeKeys():
            out["episode_keys"] = self._episode_keys.config()
        if self._nstep is not None:
            out["nstep"] = self._nstep.config()
        if not self._cast:
            out["cast"] = False
        return out

    @_locked
    def checkpoint(self) -> None:
        """Commit a bank opened with ``xpbank.open_bank(path, "r+")`` (see
        :func:`xpbank.bank.checkpoint` for what a crash between checkpoints loses)."""
        from xpbank.bank import checkpoint

        checkpoint(self)

    @_locked
    def merge_(self, other: Any) -> ReplayBuffer:
        """Append every item of ``other`` (a buffer or a bank path), oldest first; returns self.

        See :func:`xpbank.merge`. Raises :class:`SpecError` naming the fields that differ.
        """
        from xpbank.bank import merge_into

        merge_into(self, other)
        return self


def _keep_last(
    slots: torch.Tensor, flat: dict[NestedKey, torch.Tensor]
) -> tuple[torch.Tensor, dict[NestedKey, torch.Tensor]]:
    """Drop earlier rows of repeated slots, so the last row for a slot wins."""
    s = slots.numpy()
    _, first_in_reversed = np.unique(s[::-1], return_index=True)
    keep = torch.from_numpy(np.sort(len(s) - 1 - first_in_reversed))
    return slots[keep], {k: v.index_select(0, keep.to(v.device)) for k, v in flat.items()}
