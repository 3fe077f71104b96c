"""What a :class:`~xpbank.ReplayBuffer` is built from: its storage (:func:`make_storage`),
the keys sampled batches reserve (:data:`RESERVED_KEYS`, :func:`check_reserved`), and
:class:`BufferParts`, the buffer's attributes that the reading, writing and state
helpers (:mod:`xpbank.replay.reading`, ``.writing``, ``.state``) work on, and
:func:`locked`, how each public call holds the buffer's lock.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any, Protocol

import torch

from xpbank.errors import CapacityError, SpecError
from xpbank.nstep.option import NStep
from xpbank.ring.episodes import EpisodeKeys
from xpbank.ring.ids import Ring
from xpbank.sampler import Sampler
from xpbank.spec.batch import is_tensordict
from xpbank.spec.spec import Spec, reject_reserved
from xpbank.storage import MemmapStorage, Storage, TensorStorage
from xpbank.storage.base import check_device

__all__ = [
    "RESERVED_KEYS",
    "BufferParts",
    "bind_sampler",
    "check_item_dims",
    "check_reserved",
    "locked",
    "make_storage",
]

RESERVED_KEYS = frozenset({"index"})


def make_storage(storage: Any, capacity: int, spec: Spec | None, storing_device: Any) -> Storage:
    """The storage a buffer's ``storage=`` names, checked against its capacity and spec.

    Args:
        storage: ``"memory"``, ``"memmap"`` or a :class:`~xpbank.Storage` instance.
        capacity: the buffer's capacity (a given storage must have the same).
        spec: the buffer's layout, if given (an uninitialized storage takes it).
        storing_device: where a ``"memory"`` storage keeps the data.

    Raises:
        SpecError: an unknown ``storage``, a memmap off the CPU, or a storage holding
            another spec.
        CapacityError: a storage of another capacity.
    """
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


def bind_sampler(rb: Any) -> None:
    """Call a new buffer's sampler's optional hooks, each looked up once, here.

    ``bind_device(device)``: where the storage lives (e.g. PER's built trees move backend).
    ``bind_buffer(rb)``: the sampler takes part in the buffer's slots, as a
    :class:`~xpbank.Table` does: it replaces the ring (``rb._ring``) with one that reuses
    slots out of order, sets ``rb._place`` (the write path's hook, see
    :func:`xpbank.replay.writing.write`) and refuses options it cannot serve.
    """
    bind_device = getattr(rb._sampler, "bind_device", None)
    if bind_device is not None:
        bind_device(rb._storage.device)
    bind = getattr(rb._sampler, "bind_buffer", None)
    if bind is not None:
        bind(rb)


def check_reserved(spec: Spec) -> Spec:
    """Reject a spec with a key that sampled batches use for their own entries."""
    why = "sampled batches carry the items' ids under 'index', which would hide the stored field"
    return reject_reserved(spec, RESERVED_KEYS, why)


def check_item_dims(batch: Any, batch_ndim: int) -> Any:
    """Refuse a TensorDict whose items have batch dims of their own; returns ``batch``.

    A ``[N, T]`` TensorDict given to ``extend`` (or a ``[T]`` one to ``add``) holds items
    that are trajectories: TorchRL's buffers give them back with ``batch_size [B, T]``.
    A :class:`~xpbank.ReplayBuffer` item has no batch dims, so storing it would give
    ``[B]`` batches with ``[B, T, ...]`` fields, and a loss that reads the time dim
    from the batch size (TD(lambda), GAE) would compute something else without an error.
    """
    if type(batch) is dict:  # the usual batch, on every add: no TensorDict lookup
        return batch
    if is_tensordict(batch) and batch.batch_dims > batch_ndim:
        call, shape = ("extend", "[N]") if batch_ndim else ("add", "[]")
        size, own = list(batch.batch_size), list(batch.batch_size[batch_ndim:])
        raise SpecError(
            f"{call}: a TensorDict of batch_size {size} holds items with batch dims {own} of "
            f"their own; a ReplayBuffer stores items of batch_size {shape} and would give them "
            f"back without those dims. Store steps with batch.reshape(-1), or whole trajectories "
            f"as fields with batch.to_dict() (samples are then [B] with [B, {own[0]}, ...] "
            f"fields); TorchRL's trainer hook (xpbank.compat.torchrl) keeps the dims for you"
        )
    return batch


class BufferParts(Protocol):
    """The attributes of a :class:`~xpbank.ReplayBuffer` its helper modules use.

    The helpers take the buffer itself, typed by this protocol, so that they need not
    import :mod:`xpbank.replay.buffer` (which imports them).
    """

    _storage: Storage
    _ring: Ring
    _sampler: Sampler
    _generator: torch.Generator
    _device: torch.device
    _lock: threading.RLock
    _cast: bool
    _num_envs: int | None
    _episode_keys: EpisodeKeys
    _nstep: NStep | None

    def __len__(self) -> int: ...

    @property
    def capacity(self) -> int: ...

    @property
    def spec(self) -> Spec | None: ...


def locked(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``method`` holding the buffer's lock (``ReplayBuffer.lock``) for its whole length."""

    @functools.wraps(method)
    def run(self: BufferParts, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return run
