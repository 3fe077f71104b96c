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

The call's cost is numba's, not the work's: each argument is unboxed, and the
dispatcher types every one of them first (~0.1 µs per array). So the kernel reads each
item's ``terminated`` / ``truncated`` from the row just stored (the storage's packed
block, as bytes) instead of taking them as arrays, and every argument is an array of
the index's or the block's, made once: :func:`lockstep_step` compiles the kernel for
their types once and keeps that compiled function, which skips the type dispatch (one
step of 8 envs: ~0.3 µs instead of ~1.2 µs with the values' flags as arrays).

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

__all__ = ["lockstep_step", "record_step", "step_kernel", "stored_ends"]

log = logging.getLogger(__name__)


def step_kernel(
    links: np.ndarray,
    flags: np.ndarray,
    state: np.ndarray,
    block: np.ndarray,
    ends: np.ndarray,
    first: int,
    first_id: int,
) -> None:
    """Record items ``first .. first + E - 1`` (item ``i`` of env ``i``) after the ring
    advanced past them (``first_id``: its oldest live id then), and each env's state.

    ``links``: the index's ``[4, capacity]`` env, prev, next and start rows; ``flags``
    its ``[capacity, 2]`` end flags; ``state``: the per-env state packed as bytes (see
    :func:`_packed`); ``block``: the storage's rows as bytes ``[capacity, row_bytes]``,
    where each item's ``terminated`` / ``truncated`` were just stored; ``ends``: where
    (see :func:`stored_ends`). Read from the rows, the flags need no argument of their
    own (each array argument is a numba unboxing, and a user's array a type check)."""
    e = state.shape[0] // 18
    last_id = state[: 8 * e].view(np.int64)
    cur_start = state[8 * e : 16 * e].view(np.int64)
    last_end = state[16 * e : 17 * e].view(np.bool_)
    fresh = state[17 * e : 18 * e].view(np.bool_)
    t_at, t_size, t_float, u_at, u_size, u_float = ends[0], ends[1], ends[2], ends[3], ends[4], ends[5]
    c = links.shape[1]  # rows: env, prev, next, start (indexed in place: no row views)
    for i in range(e):
        item = first + i
        s = item % c
        term = _stored_flag(block, s, t_at, t_size, t_float)
        trunc = _stored_flag(block, s, u_at, u_size, u_float)
        pred = last_id[i]
        begins = fresh[i]
        links[0, s] = i
        links[1, s] = pred
        first_of_episode = item if begins else cur_start[i]
        links[3, s] = first_of_episode
        flags[s, 0] = term
        flags[s, 1] = trunc
        links[2, s] = -1
        if not begins and pred >= first_id:  # a live predecessor in the same episode
            links[2, pred % c] = item
        end = term or trunc
        last_id[i] = item
        cur_start[i] = first_of_episode
        last_end[i] = end
        fresh[i] = end


def _stored_flag(block: np.ndarray, row: int, offset: int, size: int, is_float: int) -> bool:
    """Whether the flag stored at bytes ``offset .. offset + size`` of ``row`` is not 0,
    as ``value != 0`` reads it (``offset < 0``: no such field, False). Little-endian:
    a float's sign bit is the top bit of its last byte, the one bit that -0.0 sets."""
    if offset < 0:
        return False
    for b in range(size):
        byte = np.int64(block[row, offset + b])
        if is_float and b == size - 1:
            byte &= 0x7F
        if byte != 0:
            return True
    return False


_compiled = _jit.compile_kernels(step_kernel, helpers=(_stored_flag,))
_kernel = None if _compiled is None else _compiled[0]


def lockstep_step(index: EpisodeIndex, spec: Spec, n: int, block: Any) -> tuple[Any, ...] | None:
    """What :func:`record_step` takes to record a write of ``n`` items of ``spec`` into
    the packed ``block`` (a :class:`~xpbank.storage.blocks.Block`) where it is one
    lockstep env step, else ``None`` (no numba, an env field, not one step, the index has
    not planned a write of ``spec``, or a flag field it cannot read from the rows)."""
    if _kernel is None or index._resolved_for is not spec or index._resolved is None:
        return None
    term_key, trunc_key, env_key = index._resolved
    if env_key is not None or n != (index.num_envs or 1) or index._last_id.shape[0] != n:
        return None
    ends = stored_ends(block, term_key, trunc_key)
    if ends is None or sys.byteorder != "little" or block.np_data is None:
        return None
    from numba import typeof  # type: ignore[import-untyped, unused-ignore]

    # the argument types of every call: the index's arrays, a state like _packed's, the
    # block's bytes and ends are made once and never replaced, the ids are Python ints
    a = index._arrays
    args = (a.rows, a.flags, np.zeros(18 * n, np.uint8), block.np_data, ends, 0, 0)
    kernel: Any = _kernel
    try:  # the compiled function for these types: no type dispatch per call (~0.3 µs)
        call = kernel.compile(tuple(typeof(x) for x in args))
    except Exception:  # not compiled: the caller plans and applies (the NumPy reference)
        log.debug("episode_step: no compiled step for %s", args[:5], exc_info=True)
        return None
    return call, block.np_data, ends


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
    p = index.__dict__.get("_packed")
    if (
        p is None
        or index._last_end is not p[3]
        or index._fresh is not p[4]
        or index._last_id is not p[1]
        or index._cur_start is not p[2]
    ):  # first call, or the other paths replaced the arrays since
        p = _packed(index)
    ring = index._ring
    step[0](p[6], p[7], p[0], step[1], step[2], first, ring.next_id - ring.size)


def _packed(index: EpisodeIndex) -> tuple[Any, ...]:
    """The index's per-env state (``last_id``, ``cur_start``: int64; ``last_end``,
    ``fresh``: bool) moved into one byte array, the index's arrays replaced by views of
    it (the other paths replace them, never mutate them: a plan may hold the old ones).
    Returns ``(bytes, *the four views, E, the index's [4, capacity] rows, its flags)``."""
    e = index._last_id.shape[0]
    state = np.empty(18 * e, dtype=np.uint8)
    views = (
        state[: 8 * e].view(np.int64),
        state[8 * e : 16 * e].view(np.int64),
        state[16 * e : 17 * e].view(np.bool_),
        state[17 * e :].view(np.bool_),
    )
    for view, old in zip(
        views, (index._last_id, index._cur_start, index._last_end, index._fresh), strict=True
    ):
        view[...] = old
    index._last_id, index._cur_start, index._last_end, index._fresh = views
    packed = (state, *views, e, index._arrays.rows, index._arrays.flags)
    index.__dict__["_packed"] = packed
    return packed
