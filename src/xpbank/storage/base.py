"""The storage protocol: where the bytes of a buffer live, and nothing about sampling.

A storage holds ``capacity`` slots, each one item laid out by a :class:`~xpbank.Spec`.
It writes batches into slots and reads slots back. It does not know which slots are
valid, which are oldest, or how to choose them: the front-end (a ring writer) and the
samplers decide that.

Slots are given either as a ``slice`` (a contiguous run: the fast path, a slice copy)
or as a 1-D int64 tensor of slot numbers (gathers and in-place updates).

Everything else a storage may offer is optional, looked up with ``getattr``/``hasattr``
by its callers, so the protocol stays as it is: ``host_view(key)`` (all slots of a field
as a NumPy view of host memory: banks save from it without a gather, n-step reads its
rewards through it), ``gather_pairs(slots, keys, second)`` and ``pair_rows(keys,
second)`` (n-step's read of ``B`` items and ``B`` partners, the fields in ``second``
from the partners), ``nbytes()``, and for storages that read the episode index
``needs_episodes = True`` (the buffer then keeps an :class:`~xpbank.EpisodeIndex`),
``attach(ring)`` (once, at construction) and ``prepare_write(flat, n, plan)`` (before
each ``extend``'s first write, with the whole batch and the index's plan for it, so a
bad batch is refused before anything is written).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, runtime_checkable

import torch

from xpbank.errors import CapacityError, DeviceError, SpecError, check_positive_int
from xpbank.spec.batch import to_tensordict
from xpbank.spec.keys import NestedKey
from xpbank.spec.spec import Spec

if TYPE_CHECKING:
    from tensordict import TensorDict

__all__ = [
    "Storage",
    "StorageBase",
    "Slots",
    "check_alloc",
    "check_capacity",
    "check_device",
    "device_memory",
    "item_bytes",
    "state_of",
    "load_state",
]

Slots: TypeAlias = "slice | torch.Tensor"


@runtime_checkable
class Storage(Protocol):
    """What every storage provides. Front-ends talk to storages only through this.

    Attributes:
        capacity: the number of slots.
        spec: the layout of one item, or ``None`` until the first write (lazy layout).
        device: where the data lives.
    """

    capacity: int
    device: torch.device

    @property
    def spec(self) -> Spec | None: ...

    def initialize(self, spec: Spec) -> None:
        """Allocate for ``spec``. Called once, by the first write when built lazily."""

    def write(self, slots: Slots, batch: Mapping[NestedKey, torch.Tensor]) -> None:
        """Copy ``batch`` (validated, leading dim = number of slots) into ``slots``.

        ``batch`` may hold a subset of the spec's keys (in-place updates). Values are
        copied; the storage keeps no reference to them.
        """

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        """Gather ``slots`` (1-D int64) as a flat ``{key: tensor}`` dict, in spec order
        (or in the order of ``keys``). The tensors never alias the storage."""
        ...

    def read(self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None) -> TensorDict:
        """:meth:`gather` as a TensorDict of batch size ``len(slots)``.

        The result never aliases the storage: modifying it changes nothing stored.
        """
        ...

    def state_dict(self, size: int) -> dict[str, Any]:
        """The spec and the first ``size`` slots of every field."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""


def check_capacity(capacity: Any) -> int:
    """``capacity`` as a positive int, or a :class:`CapacityError`."""
    return check_positive_int("capacity", capacity)


def item_bytes(spec: Spec, keys: Sequence[NestedKey] | None = None) -> int:
    """The bytes one item's fields ``keys`` (default: all) take, unpadded.

    Example:
        >>> from xpbank.spec.field import Field
        >>> item_bytes(Spec({"obs": Field((4,)), "action": Field((), torch.int64)}))
        24
    """
    return sum(spec[k].numel * spec[k].dtype.itemsize for k in (spec if keys is None else keys))


def device_memory(device: torch.device) -> int:
    """The memory of ``device`` in bytes: the machine's RAM, or a CUDA device's memory."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


_INT64_MAX = 2**63 - 1


def check_alloc(what: str, count: int, row_bytes: int, device: torch.device | None = None) -> int:
    """``count * row_bytes``, or a :class:`CapacityError` saying which limit it passes:
    int64 (torch's sizes), or, with ``device`` given, that device's memory.

    Example:
        >>> check_alloc("capacity", 2**62, 12)
        Traceback (most recent call last):
        ...
        xpbank.errors.CapacityError: capacity: 4611686018427387904 items x 12 bytes = 55340232221128654848 bytes; at most 2**63 - 1 bytes can be addressed
    """  # noqa: E501
    total = count * row_bytes
    if total > _INT64_MAX:
        raise CapacityError(
            f"{what}: {count} items x {row_bytes} bytes = {total} bytes; "
            "at most 2**63 - 1 bytes can be addressed"
        )
    if device is not None and total > (memory := device_memory(device)):
        raise CapacityError(
            f"{what}: {count} items x {row_bytes} bytes = {total} bytes, more than the {memory} bytes "
            f"of memory of device {str(device)!r}"
        )
    return total


def check_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` that exists here, or a :class:`DeviceError`."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise DeviceError(f"device: expected a torch device or its name, got {device!r}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"device {str(dev)!r} was asked for, but CUDA is not available here")
    return dev


def state_of(storage: Storage, size: int) -> dict[str, Any]:
    """The storage state of the first ``size`` slots: ``{"spec", "data"}`` (copies)."""
    spec = storage.spec
    if spec is None:
        return {"spec": None, "data": []}
    flat = storage.gather(torch.arange(size, dtype=torch.int64)) if size else {}
    return {"spec": spec.to_dict(), "data": [flat[k].cpu() if size else None for k in spec]}


def load_state(storage: Storage, state: Mapping[str, Any]) -> int:
    """Write a :func:`state_of` result back into slots ``[0, size)``; returns ``size``."""
    if state.get("spec") is None:
        return 0
    spec = Spec.from_dict(state["spec"])
    if storage.spec is None:
        storage.initialize(spec)
    elif storage.spec != spec:
        raise SpecError(f"state holds {spec}, but this storage holds {storage.spec}")
    data = state["data"]
    if len(data) != len(spec) or not data or data[0] is None:
        return 0
    size = int(data[0].shape[0])
    if size > storage.capacity:
        raise CapacityError(f"state holds {size} items, more than this storage's capacity {storage.capacity}")
    batch = dict(zip(spec, data, strict=True))
    spec.validate(batch)
    storage.write(slice(0, size), batch)
    return size


class StorageBase:
    """What every concrete storage shares: the spec, ``read`` over ``gather``, state.

    Subclasses set ``capacity``, ``device`` and ``_spec`` and implement ``initialize``,
    ``write`` and ``gather``.
    """

    capacity: int
    device: torch.device
    _spec: Spec | None

    @property
    def spec(self) -> Spec | None:
        return self._spec

    def __repr__(self) -> str:
        name, device = type(self).__name__, str(self.device)
        return f"{name}(capacity={self.capacity}, device={device!r}, spec={self._spec})"

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        raise NotImplementedError

    def read(self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None) -> TensorDict:
        return to_tensordict(self.gather(slots, keys), (slots.shape[0],), self.device)

    def state_dict(self, size: int) -> dict[str, Any]:
        return state_of(self, size)  # type: ignore[arg-type]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_state(self, state)  # type: ignore[arg-type]
