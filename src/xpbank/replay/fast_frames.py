"""The write fast path of a :class:`~xpbank.FrameStorage`: one lockstep env step of
NumPy arrays, shaped like the last good one, written without the checks that depend
only on its signature.

The general path (:func:`xpbank.replay.writing.extend`) turns each array into a
tensor, checks the batch against the spec, plans the episode index's entries, hands
the whole batch to ``prepare_write`` (the frame-stack checks, then one compiled call
that writes the step's frames: :mod:`xpbank.storage.frame_step`), writes the other
fields and applies the plan: ~60 µs of Python around ~40 µs of copies for a step of 8
Atari frames. After such a write of a ``dict`` of NumPy arrays (or CPU tensors), the
buffer keeps a :class:`FrameSignature` (:func:`frame_signature`): each field's dtype
and shape, and where the other fields land (the packed block of the storage's other
fields). A later step that matches it field by field (a CPU tensor read as its NumPy
view) goes, where numba runs and the frames are whole 8-byte words of integers
(:func:`~xpbank.replay.frame_kernel.step_context`):

1. its frame-stack checks and frame write in one compiled call
   (:func:`~xpbank.replay.frame_kernel.step_call`, which reads the episode plan of a
   lockstep step from the index's per-env state); a failed check declines, with
   nothing changed;
2. the other fields copied into their rows in one compiled call
   (:func:`~xpbank.replay.raw_rows.copy_arrays`), the ring advanced, and the index's
   upkeep in one compiled call that reads the episode ends from the stored rows
   (:func:`~xpbank.ring.episode_step.record_step`).

Elsewhere (other frames, an unaligned step, or a test that swaps one of the functions
below to compare or count) it takes the two-kernel path:

1. its episode plan (:meth:`EpisodeIndex.plan <xpbank.EpisodeIndex.plan>`, the value
   checks: a refusal declines);
2. the frame-stack checks and the frame write (``plan_step``: the checks, always run
   where the storage verifies, ``step_obeys``; then ``apply_step``), on the arrays
   themselves (no tensors); anything but a checked lockstep step declines, with
   nothing changed;
3. the other fields stored into their rows, the ring advanced, and the index's upkeep
   as above.

It never raises for bad input: it declines, and the full path raises its usual error
with nothing written (or writes the batch). A ring wrap, a sampler that places rows,
an env field, a batch that is not one step of every env, or no numba: the full path's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from xpbank.errors import XpbankError
from xpbank.replay import frame_kernel, raw_rows
from xpbank.replay.fast_values import made
from xpbank.ring.episode_step import lockstep_step, record_step, state_address
from xpbank.sampler.uniform import UniformSampler
from xpbank.spec.cast import NUMPY_DTYPES
from xpbank.spec.keys import normalize_key
from xpbank.storage import frame_write, frames
from xpbank.storage.frame_step import StepWrite, compiled_write

__all__ = ["FrameSignature", "frame_signature"]


class FrameSignature:
    """The signature of the last good step written into a FrameStorage (see the module).

    ``entries`` holds, per input key, ``(key, dtype, shape)`` (the NumPy dtype of an
    array, the torch dtype of a CPU tensor, read as its NumPy view; the full shape,
    batch dim first); ``views`` the rows of the other fields, by key.
    """

    def __init__(self, rb: Any, n: int, entries: list[tuple[Any, np.dtype, tuple[int, ...]]], step: Any):
        storage = rb._storage
        self.storage, self.spec, self.n = storage, rb.spec, n
        self.block = storage._rest.host_block
        self.episodes, self.sampler = rb._ring.episodes, rb._sampler
        self.on_write = None if type(rb._sampler) is UniformSampler else rb._sampler.on_write
        self.entries, self.count, self.step = entries, len(entries), step
        self.keys = [e[0] for e in entries]
        self.obs_key, self.next_key = storage.obs_key, storage.next_key
        self.stacked = storage.stacked
        self.views = [
            (k, self.block.np_views[k]) for k in self.keys if k not in (self.obs_key, self.next_key)
        ]
        self.rest = [self.keys.index(k) for k, _ in self.views]
        # one compiled call for the checks and the frame write (frame_kernel.py), then one
        # for the other fields' rows (raw_rows.copy_arrays); None: the two-kernel path
        obs = entries[self.keys.index(self.obs_key)]
        item = obs[1].itemsize  # a NumPy or torch dtype: the arrays' item size either way
        self.fused = frame_kernel.step_context(storage, self.episodes, item, len(obs[2]))
        others = [(k, 0, _numpy(d), s) for k, d, s in (entries[j] for j in self.rest)]
        self.arrays = raw_rows.plan_arrays(self.block, others, 0) if self.fused is not None else None
        self.least = max(storage.stack, 2) * n  # the ring's size, with the step, plan_step asks
        if storage.capacity < self.least:
            self.fused = None
        self.read = _reader(entries, self.keys.index(self.obs_key), self.keys.index(self.next_key), self.rest)

    def __reduce__(self) -> tuple[Any, ...]:
        # it holds NumPy views of the storage: a pickled copy would write into copies
        return (_nothing, ())

    def write(self, rb: Any, batch: Any) -> int | None:
        """Write ``batch`` (an ``extend``'s) through this signature: its first id, or
        ``None`` (not this signature, or a step the fast path does not take: nothing
        was changed, the full path takes it)."""
        storage, ring = rb._storage, rb._ring
        if (
            type(batch) is not dict
            or len(batch) != self.count
            or storage is not self.storage
            or rb.spec is not self.spec
            or storage._spec is not self.spec
            or storage._rest.host_block is not self.block
            or rb._sampler is not self.sampler
            or ring.episodes is not self.episodes
        ):
            return None
        read = self.read
        if read is not None:  # NumPy arrays only: one generated function checks them
            got = read(batch)
            if got is None:
                return None
            obs, nxt, rest = got
            values = None
        else:
            values = {}
            ndarray, tensor, get = np.ndarray, torch.Tensor, batch.get
            for key, want, shape in self.entries:
                v = get(key)
                if type(v) is tensor:  # a dense CPU tensor without grad: its NumPy view
                    if v.dtype is not want:
                        return None
                    try:  # raises for any other tensor (the full path's then)
                        v = v.numpy()
                    except (RuntimeError, TypeError):
                        return None
                    if v.shape != shape:
                        return None
                elif type(v) is not ndarray or v.shape != shape or ((d := v.dtype) is not want and d != want):
                    return None
                values[key] = v
            obs, nxt = values[self.obs_key], values[self.next_key]
            rest = tuple(values[self.keys[j]] for j in self.rest)
        n, c = self.n, storage.capacity
        first = ring.next_id
        slot = first % c
        if slot + n > c:  # the wrap: the full path splits it
            return None
        if self.fused is not None and ring.size + n >= self.least and _own():
            done = self._fused(rb, obs, nxt, rest, first)
            if done is not None:
                return first if done else None
        if values is None:
            values = {k: batch[k] for k in self.keys}
        episodes = self.episodes
        try:  # value checks (env ids, whole env steps): a refusal is the full path's to raise
            plan = episodes.plan(values, n, self.spec)
        except XpbankError:
            return None
        obs, nxt = values[self.obs_key], values.get(self.next_key)
        if nxt is None:
            return None
        if not self.stacked:
            obs, nxt = obs[:, None], nxt[:, None]
        # the checks, then the write, that prepare_write makes (looked up in its module: the
        # same functions, wherever they are patched); nothing is changed before the write
        todo = frames.plan_step(storage, ring, obs, nxt, plan, n)
        if type(todo) is not StepWrite or not frames.apply_step(storage, todo):
            return None  # a failed check, or not one compiled step: the full path raises or plans it
        written = slice(slot, slot + n)
        for key, view in self.views:
            view[written] = values[key]
        if self.on_write is not None:
            self.on_write(written, ring)
        ring.advance(n)
        record_step(episodes, self.step, first)  # the plan's entries, from the stored ends
        return first

    def _fused(
        self, rb: Any, obs: np.ndarray, nxt: np.ndarray, rest: tuple[np.ndarray, ...], first: int
    ) -> bool | None:
        """The step through :func:`~xpbank.replay.frame_kernel.step_call`: ``True`` once
        written (and recorded), ``False``: a check failed (nothing written: the full path
        says which), ``None``: the kernel cannot take these arrays (the two-kernel path)."""
        storage, ring, episodes = self.storage, rb._ring, self.episodes
        call, context = self.fused  # type: ignore[misc]
        if not context.current(storage, episodes) and (context := self._new_context()) is None:
            return None
        state = state_address(episodes)  # the per-env state, as record_step packs it
        last, kept = storage._last, storage._stacks
        n, size, c = self.n, ring.size, storage.capacity
        first_id = first - size
        while True:
            code, a, b = call(context.address, state, first, first_id, size, last.nfree, kept.nfree, obs, nxt)
            if code == 0:
                last.nfree, kept.nfree = a, b
                break
            if code != 1:
                return False if code == 2 else None
            last.reserve(a)  # the rule of SlotPool.put; a context for the new stores
            kept.reserve(b)
            if (context := self._new_context()) is None:
                return None
        slot = first % c
        if (arrays := self.arrays) is None or not arrays[0](arrays[1], slot, n, rest):
            written = slice(slot, slot + n)  # False above: nothing written
            for (_, view), v in zip(self.views, rest, strict=True):
                view[written] = v
        if self.on_write is not None:
            self.on_write(slice(slot, slot + n), ring)
            state = state_address(episodes)  # the state again, as record_step reads it
        ring.next_id = first + n  # Ring.advance and record_step inlined (~0.3 µs of calls)
        if size < c:
            ring.size = size = min(size + n, c)
        step = self.step  # the index's entries, from the stored ends
        step[0](step[1], state, first, first + n - size)
        return True

    def _new_context(self) -> frame_kernel.StepContext | None:
        """A :class:`~xpbank.replay.frame_kernel.StepContext` of the storage's arrays now,
        kept with the call; ``None`` (and the one call dropped) where they do not suit it."""
        context = frame_kernel.StepContext(self.storage, self.episodes.links().start)
        if not context.ok:
            self.fused = None
            return None
        self.fused = self.fused[0], context  # type: ignore[index]
        return context


# the functions the two-kernel path looks up in their modules; where a test swaps one (to
# compare paths or count calls) the step takes the path it swapped into, not the fused call
_OWN = (frames.plan_step, frames.apply_step, frame_write.step_obeys, frame_write.compiled_write)


def _own() -> bool:
    """Whether the two-kernel path's functions are their modules' own."""
    own = _OWN
    return (
        frames.plan_step is own[0]
        and frames.apply_step is own[1]
        and frame_write.step_obeys is own[2]
        and frame_write.compiled_write is own[3]
    )


def _reader(entries: list[tuple[Any, Any, tuple[int, ...]]], obs: int, nxt: int, rest: list[int]) -> Any:
    """``read(batch) -> (obs, next obs, (the other fields' arrays))``, or ``None`` where a
    value is not a NumPy array of its entry's dtype and shape (what the loop in
    :meth:`FrameSignature.write` checks), written out field by field in one function made
    once per signature (~1 µs less than the loop for six fields); ``None`` where an entry
    is a torch dtype (a CPU tensor's: the loop reads its NumPy view). Only names appear
    in the text; keys, dtypes and shapes are its globals, never text."""
    if any(not isinstance(e[1], np.dtype) for e in entries):
        return None
    names: dict[str, Any] = {"A": np.ndarray}
    checks = []
    for i, (key, dtype, shape) in enumerate(entries):
        names[f"k{i}"], names[f"d{i}"], names[f"s{i}"] = key, dtype, shape
        checks.append(
            f"type(v{i}) is not A or v{i}.shape != s{i} or (v{i}.dtype is not d{i} and v{i}.dtype != d{i})"
        )
    others = "".join(f"v{j}, " for j in rest)
    text = (
        "def read(src):\n"
        "    get = src.get\n"
        + "".join(f"    v{i} = get(k{i})\n" for i in range(len(entries)))
        + f"    if {' or '.join(checks)}:\n"
        "        return None\n"
        f"    return v{obs}, v{nxt}, ({others})\n"
    )
    return made(text, f"<fast_frames.reader of {len(entries)} fields>", "read", names)


def _numpy(dtype: Any) -> np.dtype:
    """The NumPy dtype of an entry's (a NumPy dtype, or a torch dtype read through ``numpy()``)."""
    return dtype if isinstance(dtype, np.dtype) else np.dtype(NUMPY_DTYPES[dtype])


def _nothing() -> None:
    return None


def frame_signature(rb: Any, batch: Any, n: int) -> FrameSignature | None:
    """The signature of ``batch`` (an ``extend`` of ``n`` rows the full path has just
    written into a FrameStorage), or ``None`` where the fast path does not apply."""
    storage, spec, ring = rb._storage, rb.spec, rb._ring
    rest = getattr(storage, "_rest", None)
    episodes = ring.episodes
    if (
        n == 0
        or type(batch) is not dict
        or spec is None
        or storage._spec is not spec
        or rest is None
        or storage.next_key is None
        or rest.host_block is None
        or rest.host_block.np_data is None
        or episodes is None
        or not compiled_write()
        or rb.__dict__.get("_place") is not None
        or rb.__dict__.get("_runs") is not None
        or len(batch) != len(spec)
    ):
        return None
    if any(k not in rest.host_block.np_views for k in rest.spec):  # every other field in the block
        return None
    entries = []
    for key, value in batch.items():
        if not isinstance(key, (str, tuple)) or normalize_key(key) != key or key not in spec:
            return None
        field = spec[key]
        if type(value) is torch.Tensor:  # kept by its torch dtype, read through .numpy()
            if value.dtype != field.dtype or value.layout is not torch.strided or value.is_nested:
                return None
            if tuple(value.shape) != (n, *field.shape) or field.dtype not in NUMPY_DTYPES:
                return None
            entries.append((key, field.dtype, tuple(value.shape)))
            continue
        if type(value) is not np.ndarray or value.shape != (n, *field.shape):
            return None
        if NUMPY_DTYPES.get(field.dtype) != value.dtype:
            return None
        entries.append((key, value.dtype, value.shape))
    step = lockstep_step(episodes, spec, n, rest.host_block)  # no env field, one step of each env
    return None if step is None else FrameSignature(rb, n, entries, step)
