"""One env step of lockstep envs recorded in an :class:`~xpbank.EpisodeIndex` in one
compiled call: the write fast path's index upkeep (:mod:`xpbank.replay.fast_write`).

With ``num_envs=E`` (or one stream, ``E = 1``) and no env field, one step of every env
is ``E`` items whose ids follow the ring's ``next_id``; item ``i`` is env ``i``, its
predecessor is env ``i``'s newest item, and nothing about it can be refused (the
batch's shape already says it is one whole step). Its entries are then arithmetic on
the id and the env's state, which :func:`step_kernel` writes item by item: the same
entries as :meth:`EpisodeIndex.plan <xpbank.EpisodeIndex.plan>` then :meth:`apply
<xpbank.EpisodeIndex.apply>` (the NumPy reference, ~15 NumPy calls of ~0.3 µs at this
size), in one call. Without numba, :func:`lockstep_step` says no and the caller plans
and applies.

The call's cost is numba's, not the work's: each array argument is unboxed (~60 ns, a
Python int ~10 ns), and the dispatcher types every argument first (~0.1 µs per array).
So the kernel takes only ints: addresses of the index's arrays, of the storage's packed
rows (where it reads each item's ``terminated`` / ``truncated``, just stored, instead of
taking them as arrays) and of the packed per-env state, viewed as pointers in compiled
code (:func:`xpbank._jit.pointers`). :func:`lockstep_step` puts the addresses that never
change (the index's arrays are never replaced, a kept signature keeps its block) in one
int64 context array, and keeps the function compiled for four ints, which skips the
type dispatch: one step of 8 envs ~0.15 µs of call instead of ~0.45 µs with arrays
(~1.2 µs with the values' flags as arrays, through the dispatcher).

Example:
    >>> import numpy as np, torch
    >>> from xpbank import ReplayBuffer
    >>> rb = ReplayBuffer(8, num_envs=2)
    >>> _ = rb.extend({"obs": np.zeros((2, 1), np.float32), "terminated": np.array([False, True])})
    >>> _ = rb.extend({"obs": np.zeros((2, 1), np.float32), "terminated": np.array([False, False])})
    >>> rb.episodes.episode_start([2, 3]).tolist(), rb.episodes.predecessors([2, 3]).tolist()
    ([0, 3], [0, -1])
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from xpbank import _jit
from xpbank.spec.spec import NestedKey, Spec

if TYPE_CHECKING:
    from xpbank.ring.episodes import EpisodeIndex

__all__ = ["lockstep_step", "record_step", "state_address", "step_kernel", "stored_ends"]

log = logging.getLogger(__name__)


def step_kernel(ctx: int, state: int, first: int, first_id: int) -> None:
    """Record items ``first .. first + E - 1`` (item ``i`` of env ``i``) after the ring
    advanced past them (``first_id``: its oldest live id then), and each env's state.

    Every argument is a Python int (an array argument costs numba an unboxing, ~60 ns
    each, an int ~10 ns). ``ctx``: the address of the step's int64 context (see
    :func:`lockstep_step`): the index's ``[4, capacity]`` env, prev, next and start rows,
    its ``[capacity, 2]`` end flags, the storage's rows as bytes ``[capacity,
    row_bytes]`` (where each item's ``terminated`` / ``truncated`` were just stored),
    the row size, the capacity and where the two flags lie (:func:`stored_ends`);
    ``state``: the address of the per-env state packed as bytes, ``E`` first (see
    :func:`_packed`)."""
    w = _int64s(ctx)
    links, flags, block = _int64s(w[0]), _bytes(w[1]), w[2]
    row_bytes, c = w[3], w[4]
    e = _int64s(state)[0]
    last_id, cur_start = _int64s(state + 8), _int64s(state + 8 + 8 * e)
    last_end, fresh = _bytes(state + 8 + 16 * e), _bytes(state + 8 + 17 * e)
    s = first % c
    for i in range(e):  # links: rows env, prev, next, start at 0, c, 2c, 3c
        item = first + i
        row = block + s * row_bytes
        term = _stored_flag(row, w[5], w[6], w[7])
        trunc = _stored_flag(row, w[8], w[9], w[10])
        pred = last_id[i]
        begins = fresh[i] != 0
        first_of_episode = item if begins else cur_start[i]
        links[s] = i
        links[c + s] = pred
        links[2 * c + s] = -1
        links[3 * c + s] = first_of_episode
        flags[2 * s] = term
        flags[2 * s + 1] = trunc
        if not begins and pred >= first_id:  # a live predecessor in the same episode:
            p = s - (item - pred)  # 0 < item - pred < capacity (pred is live)
            links[2 * c + (p + c if p < 0 else p)] = item
        end = term | trunc
        last_id[i] = item
        cur_start[i] = first_of_episode
        last_end[i] = end
        fresh[i] = end
        s = 0 if s + 1 == c else s + 1


def _stored_flag(row: int, offset: int, size: int, is_float: int) -> int:
    """1 where the flag stored at bytes ``offset .. offset + size`` of the row at address
    ``row`` is not 0, as ``value != 0`` reads it, else 0 (``offset < 0``: no such field).
    Little-endian: a float's sign bit is the top bit of its last byte, the one bit that
    -0.0 sets."""
    if offset < 0:
        return 0
    at = _bytes(row + offset)
    for b in range(size):
        byte = np.int64(at[b])
        if is_float and b == size - 1:
            byte &= 0x7F
        if byte != 0:
            return 1
    return 0


# the memory at an address as a pointer to int64, to bytes (set by _compile)
_int64s: Any = _jit.compiled_only
_bytes: Any = _jit.compiled_only


def _compile() -> Any:
    global _int64s, _bytes
    ptrs = _jit.pointers("int64", "uint8")
    if ptrs is None:
        return None
    _int64s, _bytes = ptrs  # the kernel's globals, resolved when it compiles
    kernels = _jit.compile_kernels(step_kernel, helpers=(_stored_flag,))
    return None if kernels is None else kernels[0]


_kernel = _compile()
_call: list[Any] = []  # the kernel compiled for four ints, once (on the first lockstep_step)


def _compiled() -> Any:
    """:func:`step_kernel` compiled for four ints (no type dispatch per call, ~0.1 µs), or
    ``None`` (no numba, or it failed to compile: the caller plans and applies)."""
    if not _call:
        call = None
        if _kernel is not None:
            from numba import types  # type: ignore[import-untyped, unused-ignore]

            kernel: Any = _kernel
            try:
                call = kernel.compile((types.int64,) * 4)
            except Exception:
                log.debug("episode_step: no compiled step", exc_info=True)
        _call.append(call)
    return _call[0]


def lockstep_step(index: EpisodeIndex, spec: Spec, n: int, block: Any) -> tuple[Any, ...] | None:
    """What :func:`record_step` takes to record a write of ``n`` items of ``spec`` into
    the packed ``block`` (a :class:`~xpbank.storage.blocks.Block`) where it is one
    lockstep env step, else ``None`` (no numba, an env field, not one step, the index has
    not planned a write of ``spec``, or a flag field it cannot read from the rows).

    Returns ``(compiled kernel, address of the context, the context)``: the context is
    int64 ``[links, flags, rows, row bytes, capacity, *ends]`` (addresses of the index's
    ``[4, capacity]`` rows and ``[capacity, 2]`` flags, which are never replaced, and of
    the block's bytes, which a kept signature keeps)."""
    if _kernel is None or index._resolved_for is not spec or index._resolved is None:
        return None
    term_key, trunc_key, env_key = index._resolved
    if env_key is not None or n != (index.num_envs or 1) or index._last_id.shape[0] != n:
        return None
    ends = stored_ends(block, term_key, trunc_key)
    data, a = block.np_data, index._arrays
    if ends is None or sys.byteorder != "little" or data is None or a.rows is None:
        return None
    c = a.rows.shape[1]
    if data.ndim != 2 or data.dtype != np.uint8 or data.shape[0] < c or a.flags.shape != (c, 2):
        return None
    if not (data.flags.c_contiguous and a.rows.flags.c_contiguous and a.flags.flags.c_contiguous):
        return None  # the kernel addresses each as base + row * row length
    call = _compiled()
    if call is None:
        return None
    addrs = [a.rows.ctypes.data, a.flags.ctypes.data, data.ctypes.data, data.shape[1], c]
    ctx = np.array([*addrs, *ends.tolist()], dtype=np.int64)
    return call, ctx.ctypes.data, ctx


def stored_ends(block: Any, term_key: NestedKey | None, trunc_key: NestedKey | None) -> np.ndarray | None:
    """``[offset, size, is_float]`` of the terminated and truncated fields in ``block``'s
    rows (``-1``: no such field), or ``None``: one is not a single real number per item."""
    members = {m.key: m for m in block.members}
    ends = np.full(6, -1, dtype=np.int64)
    for j, key in enumerate((term_key, trunc_key)):
        if key is None:
            continue
        m = members.get(key)
        if m is None or m.dtype.is_complex or m.nbytes != m.dtype.itemsize:
            return None
        ends[3 * j : 3 * j + 3] = (m.start, m.nbytes, int(m.dtype.is_floating_point))
    return ends


def record_step(index: EpisodeIndex, step: tuple[Any, ...], first: int) -> None:
    """Record one lockstep step (``step``: from :func:`lockstep_step`) written at ids
    ``first ..``, after the ring advanced past it and its rows were stored. The per-env
    state arrays are written in place: no plan holds them between two calls of this path."""
    ring = index._ring
    step[0](step[1], state_address(index), first, ring.next_id - ring.size)


def state_address(index: EpisodeIndex) -> int:
    """The address of the index's per-env state packed for :func:`step_kernel`, packed
    again where the other paths replaced the arrays (they replace them, never mutate
    them: a plan may hold the old ones) or this is the first call. Each path that
    replaces any of the four replaces ``last_end``: the write fast path checks only that
    one (tests/test_fast_write_steps.py checks every path)."""
    p = index._packed
    if (
        p is None
        or index._last_id is not p[1]
        or index._cur_start is not p[2]
        or index._last_end is not p[3]
        or index._fresh is not p[4]
    ):
        p = _packed(index)
    return int(p[0])


def _packed(index: EpisodeIndex) -> tuple[Any, ...]:
    """The index's per-env state (``last_id``, ``cur_start``: int64; ``last_end``,
    ``fresh``: bool) moved into one byte array after its length ``E`` (int64), the
    index's arrays replaced by views of it. Returns ``(its address, *the four views,
    the bytes)``; kept as the index's ``_packed`` (pickling leaves it out)."""
    e = index._last_id.shape[0]
    state = np.empty(8 + 18 * e, dtype=np.uint8)
    state[:8].view(np.int64)[0] = e
    views = (
        state[8 : 8 + 8 * e].view(np.int64),
        state[8 + 8 * e : 8 + 16 * e].view(np.int64),
        state[8 + 16 * e : 8 + 17 * e].view(np.bool_),
        state[8 + 17 * e :].view(np.bool_),
    )
    for view, old in zip(
        views, (index._last_id, index._cur_start, index._last_end, index._fresh), strict=True
    ):
        view[...] = old
    index._last_id, index._cur_start, index._last_end, index._fresh = views
    packed = (state.ctypes.data, *views, state)
    index.__dict__["_packed"] = packed
    return packed
