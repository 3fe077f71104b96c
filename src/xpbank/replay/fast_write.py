"""The write fast path: a batch shaped like the last good one goes straight into the rows.

Checking a batch against the spec (:meth:`Spec.conform <xpbank.Spec.conform>`) and
turning it into tensors costs tens of µs, which is all of an ``add`` of one transition.
Most of that depends only on the batch's *signature*: its type (and a TensorDict's
batch dims), keys, and each value's type, dtype, shape and device. So after a call that
went through the full checks, the buffer keeps a :class:`Signature` of that batch: for
each field, which kind of value came (a NumPy array, a Python number, a 0-d or n-d
torch tensor) and how it lands in the storage. A later batch that matches it field by
field is written without the full checks; anything else (a new key, dtype, shape,
device, a nested mapping, a value the signature's kind cannot take) is handed to the
full path, which raises its usual error or writes it and keys the signature on it.

What still runs on every fast call, because it depends on values, not signatures:

- a narrowing cast's range (a Python float, ``np.float64`` or float64 array into a
  float32 field; a Python int into an int64 or float field): a value outside
  the range where the conversion is exact or finite goes to the full path, which refuses
  an overflow and converts anything else exactly as before;
- the episode index's plan (env ids in range, whole env steps, episode ends): a buffer
  that keeps an index plans each write from the values, with the same checks
  (:meth:`EpisodeIndex.plan <xpbank.EpisodeIndex.plan>`); a refusal goes to the full
  path, which raises it. One lockstep env step (``num_envs=E`` and ``E`` rows, no env
  field) has nothing to refuse: its upkeep is one compiled call after the rows are
  stored, which reads the episode ends from them (:mod:`xpbank.ring.episode_step`).
  A storage that checks batches itself (``prepare_write``: a
  :class:`~xpbank.FrameStorage`) gets its own fast path, for one lockstep step of
  NumPy arrays (:mod:`xpbank.replay.fast_frames`: the frame checks still run).

A torch tensor's values are read as the cheapest exact conversion allows: a 0-d tensor
or a 1-d one of up to 8 values through ``tolist()`` (Python numbers, exact for every
dtype stored here; ~0.2 µs against ~0.55 µs for ``numpy()``), a larger one through
``numpy()`` (a view of a CPU tensor without grad). An ``add`` or ``extend`` whose fields
are all torch tensors skips both where every tensor is dense in memory on the CPU: one
compiled call copies their bytes into the rows (:mod:`xpbank.replay.raw_rows`; any
other tensor, a CUDA one included, or no numba, takes the readers above). An ``extend``
of NumPy arrays of their fields' dtypes (a vector env's step) is copied by the same
kind of call, which reads the arrays' addresses itself (~0.5 µs for six fields, against
~1.4 µs for six NumPy stores into strided columns); an array that is not C-contiguous
or overlaps the rows is stored by NumPy as before. ``tolist()``
raises for a sparse, mkldnn or meta tensor and a nested tensor has no shape, so each of
those declines.

The fast path never raises for bad input: it only declines, so every bad batch gets the
same error as before, with nothing written. It writes only where the storage exposes one
packed CPU block (:attr:`TensorStorage.host_block <xpbank.TensorStorage.host_block>`) and
the rows do not wrap; bytes land as the full path would write them (same dtypes, same
rounding: a value whose conversion could differ goes to the full path).

Costs, measured with ``benchmarks/profile_small_calls.py``: an ``add`` of one CartPole
transition of NumPy arrays and Python numbers falls from ~40 µs to a few µs
(``benchmarks/ab_small_writes.py`` compares each small write with SB3's ``add``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from xpbank.errors import XpbankError
from xpbank.replay import fast_values, raw_rows
from xpbank.replay.fast_frames import FrameSignature, frame_signature
from xpbank.ring.episode_step import lockstep_step, state_address
from xpbank.sampler.uniform import UniformSampler
from xpbank.spec.cast import NUMPY_DTYPES
from xpbank.spec.keys import NestedKey, normalize_key
from xpbank.spec.spec import Spec

__all__ = ["Signature", "remember", "signature_of", "try_write"]

# how a field's value is taken: the kinds of fast_values (which reads them)
_ARRAY, _TENSOR0, _TENSOR_LIST, _TENSOR = (
    fast_values.ARRAY,
    fast_values.TENSOR0,
    fast_values.TENSOR_LIST,
    fast_values.TENSOR,
)
_NUMBER, _BOUNDED, _ARRAY_NARROW = fast_values.NUMBER, fast_values.BOUNDED, fast_values.ARRAY_NARROW
_LIST_MAX = 8  # a 1-d tensor up to this long: tolist() + a store of numbers beat numpy() (even at 16)

# float64 -> float32 rounds once, as torch's conversion does; float16 is left to the full
# path (torch converts float64 -> float32 -> float16, which may round differently)
_F32_MAX = float(np.finfo(np.float32).max)
_INT64 = 2**63 - 1
_EXACT_INT = 2**53  # ints up to this convert to float64 exactly, so one rounding as torch's
_STRIDED = torch.strided


class Signature:
    """The signature of the last good batch of a buffer, and where its fields land.

    ``entries`` holds, per spec field in the block's record order, ``(input key, kind,
    want, shape, bound)``: ``want`` is the NumPy dtype, the Python / NumPy scalar type or
    the torch dtype the value must have, ``shape`` the value's full shape (with the
    batch dim of an ``extend``).
    """

    def __init__(
        self,
        rb: Any,
        block: Any,
        spec: Spec,
        n: int,
        mapping: type,
        batch_dims: int,
        entries: list[tuple[Any, ...]],
    ):
        self.storage, self.block, self.spec = rb._storage, block, spec
        self.episodes = episodes = rb._ring.episodes
        self.n = n  # rows per call; 0: an add (no batch dim)
        self.mapping = mapping  # dict or TensorDict
        self.batch_dims = batch_dims  # a TensorDict's batch dims (0 for a dict)
        self.sampler = sampler = rb._sampler
        # a sampler that places rows itself (a Table) offers runs of slots; the uniform
        # sampler tracks nothing: its on_write (a call, ~0.1 µs) is left out
        self.runs = rb.__dict__.get("_runs")  # (run_start, run_written), see xpbank.table.runs
        self.on_write = None if type(sampler) is UniformSampler or self.runs else sampler.on_write
        # one lockstep env step into slots that follow the ids: the index's upkeep in one
        # compiled call that reads the ends from the stored rows (episode_step.py)
        self.step = None
        if episodes is not None and self.runs is None:
            self.step = lockstep_step(episodes, spec, n or 1, block)
        if episodes is not None and self.step is None:  # the index plans from the values,
            # which it reads as arrays or numbers: no lists
            entries = [(e[0], _TENSOR, *e[2:]) if e[1] == _TENSOR_LIST else e for e in entries]
        self.entries = entries
        self.read = fast_values.reader(entries)  # src -> the values in record order, or None
        self.count = len(entries)
        self.keys = [e[0] for e in entries]
        self.views = [block.np_views[key] for key in self.keys]
        self.records = block.np_records
        # every field a torch tensor (an add or extend): dense CPU ones copied in one compiled call
        self.raw = None
        # an extend of NumPy arrays (each of its field's dtype): the same copy, its
        # addresses read in the compiled call (one call, ~0.5 µs, not a store a field)
        self.arrays = None
        if episodes is None or self.step is not None:  # no plan reads the values
            self.raw = raw_rows.plan(block, entries, n, (_TENSOR0, _TENSOR_LIST, _TENSOR))
            if n:
                self.arrays = raw_rows.plan_arrays(block, entries, _ARRAY)

    def __reduce__(self) -> tuple[Any, ...]:
        # it holds NumPy views of the storage: a pickled copy would write into copies
        return (_nothing, ())

    def source(self, batch: Any) -> Any:
        """The batch's own dict of values, or ``None``: not this signature's mapping."""
        if type(batch) is not self.mapping:
            return None
        if self.mapping is dict:
            src: Any = batch
        else:  # a TensorDict's own dict of entries (flat where every value is a tensor)
            # the batch dims check_item_dims passed (a TensorDict keeps them as _batch_size)
            if len(batch._batch_size) != self.batch_dims:  # type: ignore[attr-defined]
                return None
            src = batch._tensordict  # type: ignore[attr-defined]
        return src if len(src) == self.count else None

    def values(self, batch: Any) -> list[Any] | None:
        """The values to store, in record order, or ``None``: not this signature."""
        src = self.source(batch)
        return None if src is None else self.read(src)


def _nothing() -> None:
    return None


def signature_of(rb: Any, batch: Any, n: int) -> Signature | None:
    """The signature of ``batch`` (just written by the full path: its structure passed
    the checks), or ``None`` where the fast path does not apply."""
    storage, spec = rb._storage, rb.spec
    block = getattr(storage, "host_block", None)
    if block is None or spec is None or hasattr(storage, "prepare_write"):
        return None
    batch_dims = 0
    if type(batch) is dict:
        src: Mapping[Any, Any] = batch
    elif type(batch) is getattr(sys.modules.get("tensordict"), "TensorDict", None):
        src, batch_dims = batch._tensordict, batch.batch_dims
    else:
        return None
    if len(src) != len(spec):
        return None
    order = {m.key: i for i, m in enumerate(block.members)}
    entries: list[tuple[int, tuple[Any, ...]]] = []
    for key, value in src.items():
        if not isinstance(key, (str, tuple)) or normalize_key(key) != key or key not in order:
            return None
        entry = _entry(key, value, spec[key].dtype, spec[key].shape, n, rb._cast)
        if entry is None:
            return None
        entries.append((order[key], entry))
    entries.sort(key=lambda e: e[0])
    return Signature(rb, block, spec, n, type(batch), batch_dims, [e for _, e in entries])


def _entry(
    key: NestedKey, v: Any, dtype: torch.dtype, shape: tuple[int, ...], n: int, cast: bool
) -> tuple[Any, ...] | None:
    """How field ``key`` of this kind of value is taken (``None``: the full path's)."""
    np_dtype = NUMPY_DTYPES.get(dtype)
    if np_dtype is None or 0 in shape:  # an empty field: left to the full path
        return None
    full = (n, *shape) if n else shape
    if type(v) is np.ndarray:
        if v.shape != full:
            return None
        if v.dtype == np_dtype:
            return (key, _ARRAY, np_dtype, full, None)
        if cast and v.dtype == np.float64 and dtype == torch.float32:
            return (key, _ARRAY_NARROW, v.dtype, full, _F32_MAX)
        return None
    if type(v) is torch.Tensor:
        if v.dtype != dtype or v.is_nested or v.layout is not _STRIDED or tuple(v.shape) != full:
            return None
        if not full:
            return (key, _TENSOR0, dtype, full, None)
        if len(full) == 1 and full[0] <= _LIST_MAX:
            return (key, _TENSOR_LIST, dtype, full, None)
        return (key, _TENSOR, dtype, full, None)
    if n or shape:  # numbers are single values of a 0-d field
        return None
    return _number_entry(key, v, dtype, np_dtype, cast)


def _number_entry(
    key: NestedKey, v: Any, dtype: torch.dtype, np_dtype: np.dtype, cast: bool
) -> tuple[Any, ...] | None:
    """A Python or NumPy scalar into a 0-d field: kept exact, or bounded where the
    conversion (as the full path makes it, through a tensor) could overflow or round
    differently."""
    t = type(v)
    if isinstance(v, np.generic):
        if v.dtype == np_dtype:
            return (key, _NUMBER, t, (), None)
        if cast and t is np.float64 and dtype == torch.float32:
            return (key, _BOUNDED, t, (), _F32_MAX)
        return None
    if t is bool:
        return (key, _NUMBER, t, (), None) if cast or dtype == torch.bool else None
    if t is int:
        if dtype == torch.int64:
            return (key, _BOUNDED, t, (), _INT64)
        if cast and dtype in (torch.float32, torch.float64):
            return (key, _BOUNDED, t, (), _EXACT_INT)
        return None
    if t is float and dtype == torch.float64:
        return (key, _NUMBER, t, (), None)  # exact, as the full path (spec.batch.as_tensor)
    if t is float and dtype == torch.float32:  # a Python number takes its field's dtype
        return (key, _BOUNDED, t, (), _F32_MAX)
    return None


def remember(rb: Any, batch: Any, n: int) -> None:
    """Key the buffer's fast path on ``batch``, which the full path has just written
    (``n`` rows; 0: an ``add``). ``rb._fast_write = False`` turns the fast path off
    for that buffer (the tests compare the two paths)."""
    state = rb.__dict__
    if state.get("_fast_write", True):
        framed = hasattr(rb._storage, "prepare_write")
        state["_signature"] = frame_signature(rb, batch, n) if framed else signature_of(rb, batch, n)


def try_write(rb: Any, batch: Any, add: bool) -> int | None:
    """Write ``batch`` (one item when ``add``, else a batch) through the buffer's
    signature; its first id, or ``None``: the signature does not match (nothing was
    written: the full path takes the batch)."""
    state = rb.__dict__
    sig = state.get("_signature")
    if sig is None or (sig.n == 0) != add or state.get("_fast_write") is False:  # (switched off since)
        return None
    if type(sig) is FrameSignature:  # a FrameStorage's step (fast_frames.py)
        return sig.write(rb, batch)
    n = sig.n
    storage = rb._storage
    # a new spec is laid out anew (initialize), so a kept block means a kept spec
    if storage is not sig.storage or storage.host_block is not sig.block or rb._sampler is not sig.sampler:
        return None
    src = sig.source(batch)
    if src is None:
        return None
    raw = sig.raw  # all torch tensors: their pointers where each is dense on the CPU
    ptrs = None if raw is None else raw[2](src)
    if ptrs is None:
        values = sig.read(src)
        if values is None:
            return None
    ring = rb._ring
    rows = n or 1
    first = ring.next_id
    slot = first % ring.capacity
    if sig.runs is not None:  # the sampler picks the slots: a contiguous run now, or the full path
        start = sig.runs[0](rows)
        if start is None:
            return None
        slot = start
    elif slot + rows > ring.capacity:  # the wrap: the full path splits it
        return None
    episodes = ring.episodes
    if episodes is not sig.episodes:
        return None
    plan = None
    step = sig.step
    if episodes is not None and step is None:
        try:  # value checks (env ids, whole env steps): a refusal is the full path's to raise
            plan = episodes.plan(dict(zip(sig.keys, values, strict=True)), rows, sig.spec)
        except XpbankError:
            return None
    if ptrs is not None:  # one compiled copy; False (an overlap): nothing written
        if not raw[0](raw[1], slot, rows, ptrs):
            return None
    elif n == 0:
        sig.records[slot] = tuple(values)
    elif (arrays := sig.arrays) is None or not arrays[0](arrays[1], slot, n, tuple(values)):
        written = slice(slot, slot + n)  # made once, not per field; False above: nothing written
        for view, v in zip(sig.views, values, strict=True):
            view[written] = v
    if sig.runs is not None:
        return int(sig.runs[1](rows))
    if sig.on_write is not None:
        sig.on_write(slice(slot, slot + rows), ring)
    # Ring.advance inlined: the method call costs ~130 ns, 3% of a one-transition add
    ring.next_id = first + rows
    if ring.size < ring.capacity:
        ring.size = min(ring.size + rows, ring.capacity)
    if plan is not None:
        episodes.apply(plan)
    elif step is not None:  # one lockstep step: nothing to refuse, recorded after the write
        # record_step inlined (~0.15 µs of calls): the per-env state packed for the
        # kernel, still the index's where its last_end is (every path that replaces one
        # of the four arrays replaces last_end; ~30 ns a check); else packed again
        p = episodes._packed
        if p is None or episodes._last_end is not p[3]:
            p = (state_address(episodes),)
        step[0](step[1], p[0], first, first + rows - ring.size)
    return first
