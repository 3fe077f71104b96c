"""Storage in torch tensors: CPU RAM, pinned RAM, shared memory, or a CUDA device.

With ``pack=True`` (the default) every field of an item lives in one row of bytes: a
single ``uint8`` block ``[capacity, row_bytes]`` in which each field is a column range,
aligned for its dtype and viewed back as that dtype. Reading a batch is then ONE
``index_select`` of whole rows (one random memory access per item instead of one per
field), and on the CPU a write assembles the rows in a small, cache-hot scratch buffer
with NumPy and copies them into the block in one contiguous copy. ``benchmarks/`` has
the numbers. Batches larger than the cache (a few hundred image frames) are instead
written field by field, straight into the block, and rows of 4 KB or more (images) are
read field by field from the block (see ``_WIDE_ROW_BYTES``). ``pack=False`` keeps one block per
field.

CUDA storage goes through the same field views with torch ops (no NumPy).

On the CPU a sample is one NumPy ``take`` of whole rows as records (the block's
``np_records``; fancy indexing would copy records field by field), viewed per field
through the record dtype without copies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from xpbank.errors import CapacityError, DeviceError
from xpbank.spec.keys import NestedKey
from xpbank.spec.spec import Spec
from xpbank.storage.base import Slots, StorageBase, check_alloc, check_capacity, check_device
from xpbank.storage.blocks import Block, Member, RecordReader, as_numpy, layout, torch_view
from xpbank.storage.dtypes import as_torch
from xpbank.storage.hugepages import advise_huge_pages
from xpbank.storage.pair_rows import PairRows, block_pair_rows

__all__ = ["TensorStorage"]

# Rows are assembled in a scratch buffer only while it stays in cache; past this a
# batch (e.g. 256 Atari frames, 14 MB) is written field by field straight into the
# block, which measured about 2x faster than assembling it and copying it again. A
# rollout step of 4096 envs x 256 B (1 MB) also measured ~20% faster field by field.
_SCRATCH_BYTES = 1 << 19

# Rows at least this wide are gathered field by field from the packed block (still one
# block, so the fields of an item stay together): profiled on Atari rows (56 KB), the
# whole-row gather matched raw, but viewing the gathered rows as records afterwards ran
# with cold caches and cost 25-40 us at B=32 (0.8x raw); per-field gathers ran at 0.96-
# 0.99x raw and give contiguous fields. Below this width whole rows stay (narrow rows).
_WIDE_ROW_BYTES = 4096


class TensorStorage(StorageBase):
    """A fixed number of slots held in preallocated torch tensors.

    Args:
        capacity: number of slots.
        spec: the item layout; ``None`` to take it from the first write.
        device: where to keep the data (``"cpu"``, ``"cuda"``, ``"cuda:1"`` ...).
        pin_memory: allocate page-locked CPU memory (fast, asynchronous copies to CUDA).
        shared: put the data in shared memory, so that other processes that receive
            this storage (e.g. through ``torch.multiprocessing``) see the same data.
        pack: keep all fields of an item in one row of bytes (faster); a sampled batch
            is then one fresh block of memory and its fields are strided views into it:
            call ``.contiguous()`` where a kernel needs contiguous input.

    Example:
        >>> import torch
        >>> from xpbank import Field, Spec, TensorStorage
        >>> st = TensorStorage(8, Spec({"obs": Field((3,)), "reward": Field(())}))
        >>> st.write(slice(0, 2), {"obs": torch.ones(2, 3), "reward": torch.zeros(2)})
        >>> st.read(torch.tensor([1]))["obs"]
        tensor([[1., 1., 1.]])
    """

    def __init__(
        self,
        capacity: int,
        spec: Spec | None = None,
        *,
        device: Any = "cpu",
        pin_memory: bool = False,
        shared: bool = False,
        pack: bool = True,
    ):
        self.capacity = check_capacity(capacity)
        self.device = check_device(device)
        if (pin_memory or shared) and self.device.type != "cpu":
            raise DeviceError(f"pin_memory/shared apply to CPU storage, not to device {str(self.device)!r}")
        if pin_memory and shared:
            raise DeviceError("pin_memory and shared cannot both be set; choose one")
        self.pin_memory = pin_memory
        self.shared = shared
        self.pack = pack
        self._spec: Spec | None = None
        self._blocks: list[Block] = []
        self._block_of: dict[NestedKey, Block] = {}
        self._reader: RecordReader | None = None  # gather() of every field: see _lay_out
        self._host_block: Block | None = None
        if spec is not None:
            self.initialize(spec)

    def initialize(self, spec: Spec) -> None:
        """Allocate for ``spec``. Uninitialized (``torch.empty``): on the CPU the pages of
        a large block are only mapped when first written (2 MB at a time: plain CPU blocks
        ask for huge pages, see hugepages.py), so a 10 GB buffer costs no RAM until it
        fills. Slots are never read before they are written.

        Raises:
            CapacityError: ``capacity`` rows of ``spec`` pass int64 bytes, or the
                allocator refuses them (nothing is laid out then)."""
        groups = [list(spec)] if self.pack else [[key] for key in spec]
        blocks = []
        for keys in groups:
            members, row = layout(spec, keys)
            total = check_alloc("capacity", self.capacity, row)
            try:
                data = torch.empty(
                    (self.capacity, row), dtype=torch.uint8, device=self.device, pin_memory=self.pin_memory
                )
            except (RuntimeError, MemoryError) as exc:  # the allocator's refusal, e.g. past RAM + swap
                raise CapacityError(
                    f"capacity: {self.capacity} items x {row} bytes = {total} bytes could not be "
                    f"allocated on {str(self.device)!r}; lower the capacity"
                ) from exc
            if self.shared:
                data.share_memory_()
            elif not self.pin_memory:
                advise_huge_pages(data)
            blocks.append(Block(members, row, data))
        self._spec = spec
        self._lay_out(blocks)

    def _lay_out(self, blocks: list[Block]) -> None:
        """Take ``blocks`` (of ``self._spec``) as the storage's, with the reader of every
        field at once where they are one packed CPU block of narrow rows (a sample)."""
        self._blocks = blocks
        self._block_of = {m.key: b for b in blocks for m in b.members}
        one = blocks[0] if len(blocks) == 1 and blocks[0].np_data is not None else None
        self._host_block = one  # host_block: looked up on every add
        narrow = one is not None and not _by_field(one, one.members)
        self._reader = RecordReader(one, list(self._spec)) if narrow else None  # type: ignore[arg-type]

    def _to_device(self, value: torch.Tensor) -> torch.Tensor:
        if value.device == self.device:
            return value
        return value.to(self.device, non_blocking=self.device.type == "cuda")

    def write(self, slots: Slots, batch: Mapping[NestedKey, torch.Tensor]) -> None:
        if self._spec is None:
            raise RuntimeError("TensorStorage.write before initialize(spec)")
        if not isinstance(slots, slice):
            index = self._to_device(slots)
            for key, value in batch.items():
                view = self._block_of[key].views[key]
                view.index_copy_(0, index, self._to_device(value.detach()))
            return
        n = slots.stop - slots.start
        if n <= 0:
            return
        for block in self._blocks:
            if block.np_data is None:  # CUDA: torch copies into the field views
                for key in block.views.keys() & batch.keys():
                    # blocking: the caller may reuse its (pinned) source as soon as we return
                    block.views[key][slots].copy_(batch[key].detach())
            elif (
                len(block.members) > 1
                and len(batch) == len(self._block_of)
                and n * block.row_bytes <= _SCRATCH_BYTES
            ):
                # rows assembled where they are cache-hot, then one contiguous copy
                block.np_data[slots] = block.fill_rows(batch, n)
            else:
                for m in block.members:
                    if m.key in batch:
                        block.np_views[m.key][slots] = as_numpy(batch[m.key])

    def gather(
        self, slots: torch.Tensor, keys: Sequence[NestedKey] | None = None
    ) -> dict[NestedKey, torch.Tensor]:
        if self._spec is None:
            raise RuntimeError("TensorStorage.gather before initialize(spec)")
        if keys is None and self._reader is not None and slots.device.type == "cpu":
            return self._reader.read(slots.numpy())  # every field: one take of whole rows
        index = self._to_device(slots)
        out: dict[NestedKey, torch.Tensor] = {}
        wanted = None if keys is None else set(keys)
        for block in self._blocks:
            chosen = block.members if wanted is None else [m for m in block.members if m.key in wanted]
            if not chosen:
                continue
            if block.np_data is not None:  # CPU: NumPy's row copies beat index_select here
                _read_host(block, index.numpy(), chosen, out)
            elif _by_field(block, chosen):
                for m in chosen:
                    out[m.key] = block.views[m.key].index_select(0, index)
            else:
                rows = block.data.index_select(0, index)
                for m in chosen:
                    out[m.key] = torch_view(rows, m)
        order = self._spec if keys is None else keys
        return {k: out[k] for k in order}

    def gather_pairs(
        self, slots: np.ndarray, keys: Sequence[NestedKey], second: Collection[NestedKey]
    ) -> dict[NestedKey, torch.Tensor]:
        """Fields of items paired with other items, in one read: ``slots`` holds ``B``
        items then their ``B`` partners; a field in ``second`` comes from the partners,
        every other one of ``keys`` from the items (n-step: an item's own fields, and
        the next fields of its window's last item).

        On the CPU each block of narrow rows is ONE gather of all ``2B`` rows (NumPy's
        ``take``, faster than ``index_select`` here), the halves and fields viewed out of
        it without copies. CUDA and wide rows read each half with :meth:`gather`.

        Example:
            >>> import numpy as np, torch
            >>> from xpbank import Field, Spec, TensorStorage
            >>> st = TensorStorage(4, Spec({"obs": Field(()), "next_obs": Field(())}))
            >>> st.write(slice(0, 4), {"obs": torch.arange(4.0), "next_obs": torch.arange(1.0, 5.0)})
            >>> out = st.gather_pairs(np.array([0, 1, 2, 3]), ["obs", "next_obs"], {"next_obs"})
            >>> out["obs"].tolist(), out["next_obs"].tolist()
            ([0.0, 1.0], [3.0, 4.0])
        """
        if self._spec is None:
            raise RuntimeError("TensorStorage.gather_pairs before initialize(spec)")
        b = slots.shape[0] // 2
        out: dict[NestedKey, torch.Tensor] = {}
        wanted = set(keys)
        for block in self._blocks:
            chosen = [(i, m) for i, m in enumerate(block.members) if m.key in wanted]
            if not chosen:
                continue
            if block.np_records is None or block.row_bytes >= _WIDE_ROW_BYTES:
                index = torch.from_numpy(slots)
                for part, half in ((False, index[:b]), (True, index[b:])):
                    part_keys = [m.key for _, m in chosen if (m.key in second) == part]
                    if part_keys:
                        out.update(self.gather(half, part_keys))
                continue
            records = block.np_records.take(slots)  # as in gather: one take of whole records
            halves = records[:b], records[b:]
            for i, m in chosen:
                out[m.key] = as_torch(halves[m.key in second][block.names[i]], m.dtype)
        return {k: out[k] for k in keys}

    def pair_rows(self, keys: Sequence[NestedKey], second: Collection[NestedKey]) -> PairRows | None:
        """:meth:`gather_pairs` as a plan for a compiled kernel: the packed CPU rows that
        hold every field of ``keys``, and which words of an output row come from the item
        and which (the fields in ``second``) from its partner (see
        :mod:`xpbank.storage.pair_rows`). ``None`` where the fields are not all in one
        CPU block (CUDA, ``pack=False``). Made once per ``(keys, second)``.

        Example:
            >>> from xpbank import Field, Spec, TensorStorage
            >>> st = TensorStorage(4, Spec({"obs": Field((2,)), "next_obs": Field((2,))}))
            >>> st.pair_rows(["obs", "next_obs"], ["next_obs"]).plan.run_src.tolist()
            [0, 1]
        """
        if self._spec is None:
            raise RuntimeError("TensorStorage.pair_rows before initialize(spec)")
        block = self._block_of[keys[0]] if keys else None
        if block is None or block.np_data is None or any(self._block_of[k] is not block for k in keys):
            return None
        cache = (tuple(keys), tuple(second))
        found = block.pairs.get(cache)
        if found is None:
            found = block.pairs[cache] = block_pair_rows(block, keys, second)
        return found

    @property
    def host_block(self) -> Block | None:
        """The one packed CPU block every field lives in, or ``None`` (CUDA,
        ``pack=False``, not laid out yet). The front-end's write fast path
        (:mod:`xpbank.replay.fast_write`) stores checked rows straight into its NumPy
        views; a new layout (:meth:`initialize`, unpickling) makes a new block, which
        tells it that what it kept is stale."""
        return self._host_block

    @property
    def host_reader(self) -> RecordReader | None:
        """What :meth:`gather` of every field reads through where they all live in one
        packed CPU block of narrow rows (spec order), else ``None``. The front-end's read
        fast path (:mod:`xpbank.replay.fast_read`) keeps it; a new layout makes a new one."""
        return self._reader

    def view(self, key: NestedKey) -> torch.Tensor:
        """Field ``key`` of every slot, ``[capacity, *shape]``, as a view of the storage.

        Writing into it writes the storage (no validation: the caller keeps dtypes and
        shapes); with ``pack=True`` it is strided (every field sits in a row of bytes).

        Example:
            >>> import torch
            >>> from xpbank import Field, Spec, TensorStorage
            >>> st = TensorStorage(2, Spec({"r": Field(())}))
            >>> st.view("r").fill_(3.0).shape, st.gather(torch.tensor([1]))["r"].tolist()
            (torch.Size([2]), [3.0])
        """
        if self._spec is None:
            raise RuntimeError("TensorStorage.view before initialize(spec)")
        return self._block_of[key].views[key]

    def columns(self, keys: Sequence[NestedKey]) -> dict[NestedKey, torch.Tensor]:
        """Fields ``keys`` of every slot, ``{key: [capacity, *shape]}``, as fresh tensors.

        For whole-buffer math (a rollout's returns): each block is read once, over the
        byte span that holds the chosen fields, so a few narrow fields of packed rows
        cost about one pass over the rows rather than one per field.
        """
        if self._spec is None:
            raise RuntimeError("TensorStorage.columns before initialize(spec)")
        wanted, out = set(keys), {}
        for block in self._blocks:
            chosen = [m for m in block.members if m.key in wanted]
            if not chosen:
                continue
            align = max(m.dtype.itemsize for m in block.members)  # the row's alignment
            start = min(m.start for m in chosen) // align * align
            stop = min(block.row_bytes, -(-max(m.start + m.nbytes for m in chosen) // align) * align)
            span = block.data[:, start:stop].clone(memory_format=torch.contiguous_format)  # one pass
            for m in chosen:
                out[m.key] = torch_view(span, replace(m, start=m.start - start)).contiguous()
        return {k: out[k] for k in keys}

    def __getstate__(self) -> dict[str, Any]:
        # Send the tensors (shared ones travel by handle through torch.multiprocessing)
        # and rebuild the NumPy views on arrival: pickled views would be private copies.
        state = {
            k: v
            for k, v in self.__dict__.items()
            if k not in ("_blocks", "_block_of", "_reader", "_host_block")
        }
        state["_block_parts"] = [(b.members, b.row_bytes, b.data) for b in self._blocks]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        parts = state.pop("_block_parts")
        self.__dict__.update(state)
        self._lay_out([Block(members, row, data) for members, row, data in parts])

    def nbytes(self) -> int:
        """Bytes allocated for the data."""
        return sum(b.data.numel() for b in self._blocks)

    def host_view(self, key: NestedKey) -> np.ndarray | None:
        """Every slot of field ``key`` as a NumPy view (no copy; strided when packed),
        or ``None`` on CUDA. For bulk readers (banks); writing through it bypasses checks."""
        block = self._block_of.get(key)
        return None if block is None else block.np_views.get(key)

    def gather_host(self, rows: np.ndarray) -> dict[NestedKey, torch.Tensor]:
        """Every field of ``rows`` (a NumPy int64 index), in the storage's layout order
        (not the spec's): :meth:`gather` of all fields for a caller that holds the index in
        NumPy already and orders the fields itself (``FrameStorage``, whose other fields
        live here), without gather's per-call choices.

        Example:
            >>> import numpy as np, torch
            >>> from xpbank import Field, Spec
            >>> st = TensorStorage(4, Spec({"a": Field((), torch.int64), "b": Field((2,))}))
            >>> st.write(slice(0, 4), {"a": torch.arange(4), "b": torch.ones(4, 2)})
            >>> out = st.gather_host(np.array([3, 1]))
            >>> out["a"].tolist(), out["b"].shape
            ([3, 1], torch.Size([2, 2]))
        """
        if self.device.type != "cpu":
            return self.gather(torch.from_numpy(rows))
        out: dict[NestedKey, torch.Tensor] = {}
        for block in self._blocks:
            _read_host(block, rows, block.members, out)
        return out


def _by_field(block: Block, chosen: Sequence[Member]) -> bool:
    """Whether to gather ``chosen`` field by field: wide rows (images), or a few narrow
    fields (less than half the row); else whole rows in one gather."""
    return block.row_bytes >= _WIDE_ROW_BYTES or 2 * sum(m.nbytes for m in chosen) < block.row_bytes


def _read_host(
    block: Block, rows: np.ndarray, chosen: Sequence[Member], out: dict[NestedKey, torch.Tensor]
) -> None:
    """Fields ``chosen`` of a CPU block's ``rows`` into ``out``, as fresh tensors."""
    if _by_field(block, chosen):
        for m in chosen:
            out[m.key] = as_torch(block.np_views[m.key][rows], m.dtype)
        return
    # one NumPy take of whole records (20 -> 9 us at B=32, 208 -> 177 at 2,560; fancy
    # indexing, unlike take, copies records field by field: 6x slower)
    records = block.np_records.take(rows)  # type: ignore[union-attr]
    every = chosen is block.members
    for name, m in zip(block.names, block.members, strict=True):
        if every or m in chosen:
            value = torch.from_numpy(records[name])  # as_torch, inlined: a call per field
            out[m.key] = value if value.dtype == m.dtype else value.view(m.dtype)
