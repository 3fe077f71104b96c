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

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from xpbank.errors import SpecError
from xpbank.nstep.option import NStep
from xpbank.replay import reading, writing
from xpbank.replay import state as buffer_state
from xpbank.replay.parts import bind_sampler, check_reserved, locked, make_storage
from xpbank.ring.episodes import EpisodeIndex, EpisodeKeys, wants_episodes
from xpbank.ring.ids import Ring
from xpbank.sampler import Sampler, UniformSampler
from xpbank.spec.spec import Spec
from xpbank.storage import Storage
from xpbank.storage.base import check_capacity, check_device

__all__ = ["ReplayBuffer"]
if TYPE_CHECKING:  # imported on first use: see xpbank.spec.batch.is_tensordict
    from tensordict import TensorDict


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
            check_reserved(given)  # before make_storage creates anything
        self._storage = make_storage(storage, capacity, spec, storing_device)
        self._device = check_device(device) if device is not None else self._storage.device
        self._sampler: Sampler = sampler if sampler is not None else UniformSampler()
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
        self._generator.seed() if seed is None else self._generator.manual_seed(seed)
        bind_sampler(self)  # the sampler's optional hooks: its device, a Table's slots

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
        """Items stored now. Threads: one read; may be stale at the next call (hold rb.lock)."""
        return self._ring.size

    @property
    def is_full(self) -> bool:
        """Threads: one read, as ``len()``."""
        return self._ring.size == self._ring.capacity

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(size={len(self)}/{self.capacity}, storage={type(self._storage).__name__}, "
            f"sampler={self._sampler!r}, device={str(self._device)!r}, spec={self.spec})"
        )

    # -- writing ---------------------------------------------------------------
    def add(self, item: Any) -> int:
        """Store one item (a mapping or TensorDict without a batch dim); returns its id.

        Threads: one step under rb.lock."""
        with self._lock:  # not @locked: its (*args, **kwargs) wrapper is ~5% of a small add
            return writing.add(self, item)  # a TensorDict's batch dims: checked there

    def extend(self, batch: Any) -> range:
        """Store a batch of items (leading dim = items); returns their ids, as a ``range``.

        ``torch.as_tensor(rb.extend(batch))`` gives them as a tensor (a :class:`~xpbank.Table`
        reusing slots out of order returns that tensor); a range costs nothing to make.

        The whole batch is checked before anything is written: on error the buffer is
        unchanged. A batch larger than ``capacity`` leaves its last ``capacity`` items.
        Threads: one step under rb.lock.

        Raises:
            SpecError: missing/unknown keys, or a field's shape or dtype differs from the spec.
            BatchTypeError: ``batch`` is not a TensorDict or mapping of tensors/arrays.
        """
        with self._lock:  # as add
            return writing.extend(self, batch)

    @locked
    def update(self, indices: Any, batch: Any) -> None:
        """Overwrite fields of stored items in place, by the ids a sample returned.

        Args:
            indices: ids, e.g. ``sampled["index"]``; a repeated id keeps its last row.
            batch: the new values: any subset of the spec's fields, one row per index.
                Entries under reserved names (``"index"``) are ignored, so a uniform
                sample can be passed back whole: ``rb.update(batch["index"], batch)``
                (a prioritized one without its ``"weight"``). An n-step sample cannot:
                its next fields are its windows' last items', not the items'.

        With an episode index (``rb.episodes``: n-step, sequences and frame stacks follow
        it), an item's env and ``terminated`` / ``truncated`` are read when it is written:
        an update may only repeat them (see :mod:`xpbank.ring.episode_update`). Threads:
        one step under rb.lock (ids checked and rows written together).

        Raises:
            StaleIndexError: an id's item has been overwritten (or cleared) since it was
                sampled; nothing is written.
            SpecError: unknown keys (an n-step sample's ``nstep_*`` entries among them,
                named as such), a wrong shape or dtype, a row count that differs from
                the number of indices, or a changed env id or episode-end flag (above).
        """
        writing.update(self, indices, batch)

    def update_priority(self, indices: Any, priorities: Any, stale: str = "raise") -> None:
        """Set the priorities of stored items, by the ids a sample returned.

        Args:
            indices: ids, e.g. ``batch["index"]``; a repeated id keeps its last priority.
            priorities: one number >= 0 per id, e.g. ``td_error.abs()``.
            stale: ``"raise"``: an id overwritten (or cleared) since it was sampled raises
                and nothing is written; ``"skip"``: such ids are dropped, the rest written.

        Threads: one step under rb.lock.

        Raises:
            PriorityError: the sampler keeps no priorities; NaN, infinite or negative
                priorities; not one priority per id. Nothing is written.
            XpbankIndexError: an id that was never issued.
            StaleIndexError: (``stale="raise"``) an overwritten or cleared id.
        """
        with self._lock:  # as add: a training loop's every step calls it
            writing.update_priority(self, indices, priorities, stale)

    @locked
    def clear(self) -> None:
        """Drop every item. Ids handed out before become stale. Memory is kept.

        Threads: one step under rb.lock."""
        self._ring.clear()
        self._sampler.on_clear()

    # -- reading ---------------------------------------------------------------
    def sample(
        self, batch_size: int, replace: bool = True, fields: Sequence[Any] | None = None, **options: Any
    ) -> TensorDict:
        """Draw ``batch_size`` items (uniformly, with the default sampler).

        Args:
            batch_size: items to draw.
            replace: draw with replacement; ``False`` gives distinct items in one batch.
            fields: only these fields (plus ``"index"``); default all.
            options: passed on to a sampler that takes them (its ``sample_options``), e.g.
                a :class:`~xpbank.Table`'s ``timeout``, ``max_staleness``, ``current_version``.

        Returns:
            A TensorDict of batch size ``[batch_size]`` on ``device``, with ``"index"``
            and whatever per-item entries the sampler adds (e.g. weights).

        Raises:
            EmptyBufferError: nothing stored.
            CapacityError: ``replace=False`` and more items asked for than are stored.

        Threads: one step under rb.lock.
        """
        with self._lock:  # as add
            return reading.sample(self, batch_size, replace, fields, options)

    @locked
    def sample_by_index(self, indices: Any, fields: Sequence[Any] | None = None) -> TensorDict:
        """The items at logical positions ``indices``: 0 is the oldest, -1 the newest.

        Raises:
            XpbankIndexError: a position outside ``[-len(self), len(self))``.

        Threads: one step under rb.lock; positions taken from an earlier ``len()`` may
        be stale by then: hold ``with rb.lock:`` around both, or use :meth:`sample_all`.
        """
        return reading.sample_by_index(self, indices, fields)

    @locked
    def sample_all(self, fields: Sequence[Any] | None = None) -> TensorDict:
        """Every stored item, oldest first. Threads: one step (size and read) under rb.lock."""
        return reading.sample_all(self, fields)

    @locked
    def epochs(
        self,
        batch_size: int,
        n_epochs: int = 1,
        shuffle: bool = True,
        drop_last: bool = False,
        fields: Sequence[Any] | None = None,
    ) -> Iterator[TensorDict]:
        """Minibatches that visit every stored item once per epoch.

        Adding to or clearing the buffer after this call (even before the first
        ``next``) raises :class:`~xpbank.BufferChangedError` (a ``RuntimeError``) at the
        next minibatch: the plan is made for the items stored at the call; in-place
        :meth:`update` is allowed. Bad arguments raise
        at the call. Threads: plan at the call, each minibatch, one step under rb.lock.
        """
        return reading.epochs(self, batch_size, n_epochs, shuffle, drop_last, fields)

    # -- state -----------------------------------------------------------------
    @locked
    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """Everything needed to resume: data, cursor, ids, sampler and RNG state.

        Safe to ``torch.save`` and to load with ``torch.load(..., weights_only=True)``.
        ``data=False`` leaves out the stored items and the storage's own layout (banks
        write every field as a plain array and load it into a memory or memmap storage,
        so a :class:`~xpbank.FrameStorage` buffer saves its fields whole).
        Threads: one step under rb.lock.
        """
        return buffer_state.state_dict(self, data)

    @locked
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` (same capacity). Threads: one step under rb.lock."""
        buffer_state.load_state_dict(self, state)

    def config(self) -> dict[str, Any]:
        """The JSON-able constructor options a bank rebuilds this buffer from.

        Threads: reads options fixed at construction; no lock needed.

        Example:
            >>> ReplayBuffer(100).config()
            {'capacity': 100, 'sampler': {'name': 'uniform', 'config': {}}}
        """
        return buffer_state.config(self)

    @locked
    def checkpoint(self) -> None:
        """Commit a bank opened with ``xpbank.open_bank(path, "r+")`` (see
        :func:`xpbank.bank.checkpoint` for what a crash between checkpoints loses).

        Threads: one step under rb.lock (its data and state are of one moment)."""
        from xpbank.bank import checkpoint

        checkpoint(self)

    @locked
    def merge_(self, other: Any) -> ReplayBuffer:
        """Append every item of ``other`` (a buffer or a bank path), oldest first; returns self.

        See :func:`xpbank.merge`. Raises :class:`SpecError` naming the fields that differ.
        Threads: one step under this buffer's lock (``other``'s is the merge's own).
        """
        from xpbank.bank import merge_into

        merge_into(self, other)
        return self
