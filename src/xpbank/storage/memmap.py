"""Storage in memory-mapped NumPy ``.npy`` files: one file per field, in one directory.

The files are plain ``.npy`` (``numpy.load(path, mmap_mode="r", allow_pickle=False)``
reads them) and are created sparse: a 10M-slot storage costs no RAM and, on file systems
with sparse files, no disk until slots are written. Reads touch only the pages of the
slots read, so capacities far beyond RAM work. A nested key ``("next", "obs")`` is the
file ``next/obs.npy``.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xpbank._paths import safe_file_parts
from xpbank.errors import ReadOnlyError, SpecError
from xpbank.spec.keys import NestedKey, key_str
from xpbank.spec.spec import Spec
from xpbank.storage.base import Slots, StorageBase, check_alloc, check_capacity
from xpbank.storage.dtypes import as_torch, numpy_dtype

__all__ = ["MemmapStorage", "field_path"]


def field_path(root: Path, key: NestedKey) -> Path:
    """The file of field ``key`` under ``root``: ``obs.npy``, ``next/obs.npy``.

    Raises:
        SpecError: a key part is not a plain file name (``..``, ``/``, leading dot).
    """
    parts = safe_file_parts(key)
    return root.joinpath(*parts[:-1], parts[-1] + ".npy")


class MemmapStorage(StorageBase):
    """Slots kept in memory-mapped ``.npy`` files on disk.

    Args:
        capacity: number of slots.
        path: the directory for the files; created if missing. ``None`` makes a
            temporary directory that is deleted when this storage is garbage collected.
        spec: the item layout; ``None`` to take it from the first write.

    Example:
        >>> import torch
        >>> from xpbank import Field, MemmapStorage, Spec
        >>> st = MemmapStorage(1000, spec=Spec({"x": Field((2,))}))
        >>> st.write(slice(0, 1), {"x": torch.tensor([[1.0, 2.0]])})
        >>> st.read(torch.tensor([0]))["x"]
        tensor([[1., 2.]])
    """

    def __init__(self, capacity: int, path: str | Path | None = None, spec: Spec | None = None):
        self.capacity = check_capacity(capacity)
        self.device = torch.device("cpu")
        self._cleanup: weakref.finalize[Any, Any] | None = None
        if path is None:
            self.path = Path(tempfile.mkdtemp(prefix="xpbank-memmap-"))
            self._cleanup = weakref.finalize(self, shutil.rmtree, str(self.path), True)
        else:
            self.path = Path(path)
        self._spec: Spec | None = None
        self._arrays: dict[NestedKey, np.memmap] = {}
        self._views: dict[NestedKey, torch.Tensor] = {}
        self.mode = "w+"
        if spec is not None:
            self.initialize(spec)

    @classmethod
    def from_arrays(
        cls, capacity: int, spec: Spec, arrays: Mapping[NestedKey, np.memmap], path: str | Path, mode: str
    ) -> MemmapStorage:
        """A storage over memmaps already opened on existing files (e.g. a bank's).

        Args:
            capacity: number of slots; every array has ``capacity`` rows.
            spec: the item layout; ``arrays[key]`` has shape ``(capacity, *shape)``.
            arrays: one memmap per field, as its NumPy storage dtype (:func:`numpy_dtype`).
            path: the directory the files are in (for messages; nothing is created).
            mode: ``"r"`` refuses every write with :class:`~xpbank.errors.ReadOnlyError`;
                ``"r+"`` writes through to the files.

        Raises:
            SpecError: an array's shape or dtype differs from the spec.
        """
        if mode not in ("r", "r+"):
            raise SpecError(f"mode: expected 'r' or 'r+', got {mode!r}")
        storage = cls(capacity, path)
        for key, field in spec.items():
            array = arrays[key]
            want = (storage.capacity, *field.shape)
            if array.shape != want or array.dtype != numpy_dtype(field.dtype):
                raise SpecError(
                    f"field {key_str(key)!r}: file holds {array.shape} {array.dtype}, "
                    f"expected {want} {numpy_dtype(field.dtype)}"
                )
        with warnings.catch_warnings():  # read-only maps: torch warns that they are not writable
            warnings.simplefilter("ignore", UserWarning)
            storage._views = {key: as_torch(arrays[key], spec[key].dtype) for key in spec}
        storage._arrays = dict(arrays)
        storage._spec = spec
        storage.mode = mode
        return storage

    def __repr__(self) -> str:
        return f"MemmapStorage(capacity={self.capacity}, path={str(self.path)!r}, spec={self._spec})"

    def initialize(self, spec: Spec) -> None:
        """Create one sparse ``.npy`` file per field (any existing file is replaced).

        Raises:
            SpecError: a key that is no safe file name. CapacityError: a field's
                ``capacity`` rows pass int64 bytes. Both before any file is made.
        """
        self._check_writable()
        paths = {key: field_path(self.path, key) for key in spec}  # check every name first
        for key, field in spec.items():  # and every size: numpy's own error names no field
            row = field.numel * field.dtype.itemsize
            check_alloc(f"capacity (field {key_str(key)!r})", self.capacity, row)
        arrays = {}
        for key, field in spec.items():
            paths[key].parent.mkdir(parents=True, exist_ok=True)
            arrays[key] = np.lib.format.open_memmap(
                paths[key], mode="w+", dtype=numpy_dtype(field.dtype), shape=(self.capacity, *field.shape)
            )
        self._arrays = arrays
        self._views = {key: as_torch(arr, spec[key].dtype) for key, arr in arrays.items()}
        self._spec = spec

    def _check_writable(self) -> None:
        if self.mode == "r":
            raise ReadOnlyError(
                f"MemmapStorage at {str(self.path)!r} was opened with mode='r' (read-only): "
                "writes are refused; open it with mode='r+' to append or update"
            )

    def write(self, slots: Slots, batch: Mapping[NestedKey, torch.Tensor]) -> None:
        if self._spec is None:
            raise RuntimeError("MemmapStorage.write before initialize(spec)")
        self._check_writable()
        if isinstance(slots, slice):
            for key, value in batch.items():
                self._views[key][slots].copy_(value.detach())
            return
        index = slots.cpu()
        for key, value in batch.items():
            self._views[key].index_copy_(0, index, value.detach().cpu())

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        if self._spec is None:
            raise RuntimeError("MemmapStorage.gather before initialize(spec)")
        index = slots.cpu()
        return {
            key: self._views[key].index_select(0, index) for key in (self._spec if keys is None else keys)
        }

    def host_view(self, key: NestedKey) -> np.ndarray | None:
        """Every slot of field ``key``: the memmap itself (no copy). For bulk readers (banks)."""
        return self._arrays.get(key)

    def nbytes(self) -> int:
        """Bytes of data the files hold (allocated sparsely: disk use grows as slots fill)."""
        return int(sum(arr.nbytes for arr in self._arrays.values()))

    def flush(self) -> None:
        """Write dirty pages to disk (``msync``); the OS does so eventually anyway."""
        if self.mode == "r":
            return
        for array in self._arrays.values():
            array.flush()
