"""An indexed priority queue of slots by ``(key, seq)``: a 16-ary tournament tree in
compiled loops (numba).

With numba (the ``fast`` extra) a :class:`~xpbank.table.Table`'s heaps (min- and
max-heap selectors and removers, the versions' index) are this. The leaves are the
slots: each slot's key (:func:`order_bits` of the float key: int64 in the same order)
and seq, ``(EMPTY, EMPTY)`` for a slot not in the tree, which loses to every item. Each
node above holds the winner of its 16 children (key, seq, slot; ``(EMPTY, EMPTY, -1)``
when none), each leaf group also its runner-up (or *used*: unknown until the group is
read again; a group's runner-up key, seq and slot share a cache line). A node's
children are 16 contiguous entries (128 bytes of keys): at 1M slots, 5 levels (62,500
leaf groups -> 3,907 -> 245 -> 16 -> 1). Ties are broken by the ring's ``seq``
(insertion order): the order is total, the same items come first as from
:class:`~xpbank.table.orders.LazyHeap` (``heapq``, the path without numba, and the
reference the tests compare this one with), whatever the changes that built the tree.

- Changing or removing a slot recomputes its group and the nodes above, up to the first
  that stays the same; a slot entering (an insert, a taken item put back) only meets its
  group's winner and runner-up, and climbs while it wins (most do not: no climb). A
  batch prefetches what the items a few ahead read. One compiled call per batch. The
  scans and a group's changes are selects (no branch to mispredict), helpers inlined.
- The ``k`` first items (:meth:`IndexedHeap.best`): the root's winner, ``k`` times, each
  taken out of the tree (its group's runner-up takes its place, or a used one's group is
  read again) and set aside as *taken*; its ancestors 1-3 levels below the root become
  their changed child or their siblings' best, found before the pop (which leaves them
  as they are): the best of those is the likely next winner, its lines prefetched.
  :meth:`IndexedHeap.take` also reads their ids and counts their draws. Taken items
  still count: an update of one only sets its kept key, a removal only drops it; the
  next call that reads the order (``best``, ``below``) first puts them back. So the
  usual loop (a sample of the first ``k``, then an update of those ``k``) enters each
  once with its new key, and never writes a slot's index among the taken (only an
  update or removal out of that order needs them: :func:`_index`).

The kernels below are plain Python over NumPy arrays; :func:`load` compiles them once.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from xpbank import _jit
from xpbank._jit.prefetch import prefetch
from xpbank.table.heap_store import EMPTY, MASK, RUNNER, SHIFT, USED, B, IndexedHeap, order_bits

__all__ = ["IndexedHeap", "load", "order_bits"]

AHEAD = 8  # a batch prefetches the leaf group of the item this far ahead


def _win(k: Any, q: Any, lo: Any, skip: Any) -> Any:
    """The first of entries ``[lo, lo + 16)`` but position ``skip``, by ``(k, q)``:
    ``(key, seq, position)``: the smallest key, then the smallest seq among its holders."""
    bk = EMPTY
    for i in range(lo, lo + B):
        bk = min(bk, k[i] if i != skip else EMPTY)
    bq, at = EMPTY, lo if skip != lo else lo + 1  # every entry empty (their seqs too): the first
    for i in range(lo, lo + B):
        x = k[i] == bk and q[i] < bq and i != skip
        bq = q[i] if x else bq
        at = i if x else at
    return bk, bq, at


def _best(k: Any, q: Any, lo: Any) -> Any:
    """:func:`_win` with nothing skipped."""
    bk = k[lo]
    for i in range(lo + 1, lo + B):
        bk = min(bk, k[i])
    bq, at = EMPTY, lo
    for i in range(lo, lo + B):
        x = k[i] == bk and q[i] < bq
        bq = q[i] if x else bq
        at = i if x else at
    return bk, bq, at


def _other(k: Any, q: Any, lo: Any, skip: Any) -> Any:
    """:func:`_win`, called rather than inlined (numba's inliner trips over it in a branch)."""
    return _win(k, q, lo, skip)


def _group(lk: Any, lq: Any, nk: Any, nq: Any, ns: Any, rk: Any, rq: Any, rs: Any, g: Any) -> Any:
    """Recompute leaf group ``g``'s winner and runner-up; whether its winner changed."""
    lo = g << SHIFT
    bk, bq, bi = _best(lk, lq, lo)
    ck, cq, ci = _win(lk, lq, lo, bi)
    rk[g], rq[g], rs[g] = ck, cq, ci if ck != EMPTY else -1
    bi = bi if bk != EMPTY else -1
    if nk[g] == bk and nq[g] == bq and ns[g] == bi:
        return False
    nk[g], nq[g], ns[g] = bk, bq, bi
    return True


def _up(nk: Any, nq: Any, ns: Any, off: Any, g: Any) -> None:
    """Recompute the nodes above leaf group ``g``, up to the first that stays the same."""
    for level in range(1, off.shape[0] - 1):
        child = off[level - 1] + ((g >> SHIFT) << SHIFT)
        g >>= SHIFT
        bk, bq, i = _best(nk, nq, child)
        at = off[level] + g
        if nk[at] == bk and nq[at] == bq and ns[at] == ns[i]:
            return
        nk[at], nq[at], ns[at] = bk, bq, ns[i]


def _others(off: Any, g: Any, level: Any) -> Any:
    """Leaf group ``g``'s ancestor at ``level`` and the first of its 16 siblings: places."""
    a = g >> (SHIFT * level)
    return off[level] + a, off[level] + ((a >> SHIFT) << SHIFT)


def _before(ka: Any, qa: Any, kb: Any, qb: Any) -> Any:
    """Whether ``(ka, qa)`` comes before ``(kb, qb)`` (no branch)."""
    return (ka < kb) | ((ka == kb) & (qa < qb))


def _at(t: Any) -> Any:
    """The addresses :func:`_lines` prefetches from (``.ctypes`` is slow: once a call)."""
    return (
        np.int64(t[0].ctypes.data), np.int64(t[1].ctypes.data), np.int64(t[9].ctypes.data),
        np.int64(t[2].ctypes.data), np.int64(t[3].ctypes.data), np.int64(t[4].ctypes.data),
        np.int64(t[5].ctypes.data),
    )  # fmt: skip


def _lines(at: Any, s: Any, whole: Any, siblings: Any) -> None:
    """Prefetch what setting or taking slot ``s`` reads: its keys and seqs (``whole``: its
    group's), group's winner and runner-up (``siblings``: its parent's 16)."""
    g = s >> SHIFT
    line = (g << SHIFT) * 8 if whole else s * 8
    for a in at[:2]:
        prefetch(a + line)
        if whole:
            prefetch(a + line + 64)
    for a in at[3:6]:
        prefetch(a + g * 8)
    prefetch(at[6] + g * (RUNNER * 8))
    if siblings:
        line = ((g >> SHIFT) << SHIFT) * 8
        for a in at[3:6]:
            prefetch(a + line)
            prefetch(a + line + 64)


def _ahead(at: Any, slots: Any, j: Any, mode: Any) -> None:
    """Prefetch what ``mode`` (:func:`_apply`) reads for ``slots[j + AHEAD]``, if any."""
    if j + AHEAD < slots.shape[0]:
        s = slots[j + AHEAD]
        if s >= 0:
            if mode == 1:
                prefetch(at[2] + s * 8)
                prefetch(at[0] + s * 8)
            else:
                _lines(at, s, mode == 2, False)
                if mode == 2:
                    prefetch(at[2] + s * 8)


def _apply(t: Any, n: Any, slots: Any, keys: Any, seqs: Any, mode: Any) -> None:
    """``slots[j]`` set to ``keys[j]`` in order, with its path replayed. ``mode``: 0 enter
    (not in the tree; ties by ``seqs``), 1 new key (a taken one only keeps it), 2 out
    for good (neither in nor taken: skipped), 3 put back the taken ones (``slots`` is
    their list, -1 where removed meanwhile; ``keys``, ``seqs``: theirs)."""
    lk, lq, nk, nq, ns, rk, rq, rs, off, taken, ts, tk = t[:12]
    at = _at(t)
    if mode == 1 or mode == 2:
        _index(taken, ts, n)
    for j in range(slots.shape[0]):
        _ahead(at, slots, j, mode)
        s = slots[j]
        if mode == 0 or mode == 3:
            if s < 0:  # (3) removed while taken
                continue
            n[0] += 1
            if mode == 3 and n[2] == 0:
                taken[s] = -1
            # it meets its group's winner and runner-up only: it becomes the winner (the old
            # one the runner-up) or the runner-up (unless used), or changes nothing (selects)
            key, seq, g = keys[j], seqs[j], s >> SHIFT
            lk[s], lq[s] = key, seq
            wk, wq, ws, xk, xq, xs = nk[g], nq[g], ns[g], rk[g], rq[g], rs[g]
            win = key < wk or (key == wk and seq < wq)
            second = xs != USED and (key < xk or (key == xk and seq < xq))
            nk[g], nq[g], ns[g] = key if win else wk, seq if win else wq, s if win else ws
            rk[g] = wk if win else (key if second else xk)
            rq[g] = wq if win else (seq if second else xq)
            rs[g] = ws if win else (s if second else xs)
            level = 1
            while win and level < off.shape[0] - 1:  # a new winner climbs while it wins (most lose)
                g >>= SHIFT
                x = off[level] + g
                win = key < nk[x] or (key == nk[x] and seq < nq[x])
                if win:
                    nk[x], nq[x], ns[x] = key, seq, s
                level += 1
            continue
        elif mode == 1:
            if taken[s] >= 0:
                tk[taken[s]] = keys[j]
                continue
            lk[s] = keys[j]
        else:
            if taken[s] >= 0:  # out of the tree already
                ts[taken[s]] = -1
                taken[s] = -1
                continue
            if lq[s] == EMPTY:
                continue
            lk[s], lq[s] = EMPTY, EMPTY
            n[0] -= 1
        g = s >> SHIFT
        if _group(lk, lq, nk, nq, ns, rk, rq, rs, g):
            _up(nk, nq, ns, off, g)


def _index(taken: Any, ts: Any, n: Any) -> None:
    """Each taken item's place among them into ``taken``, where a pop left them out (``n[2]``)."""
    if n[2]:
        for j in range(n[1]):
            if ts[j] >= 0:
                taken[ts[j]] = j
        n[2] = 0


def _settle(t: Any, n: Any) -> None:
    """Put the taken items back (with their kept keys)."""
    m = n[1]
    n[1] = 0
    _apply(t, n, t[10][:m], t[11][:m], t[12][:m], 3)
    n[2] = 0


def _bits(keys: Any) -> Any:
    """:func:`order_bits` of float64 ``keys``, compiled."""
    bits = (keys + 0.0).view(np.int64)
    return bits ^ ((bits >> 63) & MASK)


def push(t: Any, n: Any, slots: Any, keys: Any, seqs: Any) -> None:
    """Enter ``slots`` (not in the tree) under float ``keys``, ties by ``seqs``."""
    _apply(t, n, slots, _bits(keys), seqs, 0)


def rekey(t: Any, n: Any, slots: Any, keys: Any) -> None:
    """Give ``slots`` (in the tree or taken) new float ``keys``, in order (a repeated
    slot keeps its last); a taken one only keeps it."""
    bits = _bits(keys)
    _apply(t, n, slots, bits, bits, 1)


def remove(t: Any, n: Any, slots: Any) -> None:
    """Take ``slots`` out for good (those neither in the tree nor taken are skipped)."""
    _apply(t, n, slots, slots, slots, 2)


def first(t: Any, n: Any, k: Any, out: Any, ids: Any, times: Any, got: Any) -> Any:
    """The ``k`` first slots in order into ``out`` (fewer if fewer are in); they are
    taken (see the module docstring). Where ``got`` is not empty, also each one's id
    (``ids[slot]``) into it, and its ``times`` counted up by one. Returns how many."""
    lk, lq, nk, nq, ns, rk, rq, rs, off, _, ts, tk, tq = t
    count, lines = got.shape[0] > 0, (ids.ctypes.data, times.ctypes.data)
    _settle(t, n)
    m = min(k, n[0])
    top = off.shape[0] - 2  # the root's level
    root, at = off[top], _at(t)
    for j in range(m):
        w = ns[root]
        out[j] = w
        g = w >> SHIFT
        # w's ancestors 1-3 levels below the root (c1, c2, c3) and their siblings' best (o1, o2, o3)
        c1 = c2 = c3 = o1 = o2 = o3 = root
        k1 = k2 = k3 = q1 = q2 = q3 = EMPTY
        if top >= 1:
            c1, o1 = _others(off, g, top - 1)
            k1, q1, o1 = _other(nk, nq, o1, c1)
        if top >= 2:
            c2, o2 = _others(off, g, top - 2)
            k2, q2, o2 = _other(nk, nq, o2, c2)
        if top >= 3:
            c3, o3 = _others(off, g, top - 3)
            k3, q3, o3 = _other(nk, nq, o3, c3)
        if top >= 1 and j + 1 < m:  # the next winner, unless it is in w's group or its parent's
            i = o2 if _before(k2, q2, k1, q1) else o1
            i = o3 if _before(k3, q3, nk[i], nq[i]) else i
            if ns[i] >= 0:
                _lines(at, ns[i], True, True)
                if count:
                    prefetch(lines[0] + ns[i] * 8)
                    prefetch(lines[1] + ns[i] * 8)
        ts[j], tk[j], tq[j] = w, nk[root], nq[root]
        if count:
            got[j] = ids[w]
            times[w] += 1
        lk[w], lq[w] = EMPTY, EMPTY
        if rs[g] != USED:  # its runner-up takes its place
            nk[g], nq[g], ns[g] = rk[g], rq[g], rs[g]
            rs[g] = USED
        else:  # read the group again
            _group(lk, lq, nk, nq, ns, rk, rq, rs, g)
        for level in range(1, top - 2):  # the path up to c3, each node the best of its children
            bk, bq, i = _best(nk, nq, off[level - 1] + ((g >> (SHIFT * level)) << SHIFT))
            x = off[level] + (g >> (SHIFT * level))
            nk[x], nq[x], ns[x] = bk, bq, ns[i]
        if top >= 3:  # then each ancestor is its changed child or the best of the others
            i = o3 if _before(k3, q3, nk[c3], nq[c3]) else c3
            nk[c2], nq[c2], ns[c2] = nk[i], nq[i], ns[i]
        if top >= 2:
            i = o2 if _before(k2, q2, nk[c2], nq[c2]) else c2
            nk[c1], nq[c1], ns[c1] = nk[i], nq[i], ns[i]
        if top >= 1:
            i = o1 if _before(k1, q1, nk[c1], nq[c1]) else c1
            nk[root], nq[root], ns[root] = nk[i], nq[i], ns[i]
    n[0] -= m
    n[1], n[2] = m, m > 0  # their places not in ``taken`` (see _index)
    return m


def first_at(ctx: Any, k: Any, got: Any) -> Any:
    """:func:`first` (counting draws: ``got`` not empty) on the arrays whose addresses
    and lengths ``ctx`` holds (:meth:`IndexedHeap.context`): one array for numba to
    unbox instead of 17 (~2 µs a call -> ~0.3)."""
    leaves, nodes, taken = ctx[13], ctx[14], ctx[17]  # lengths
    runners = _carray(_int64s(ctx[5]), (ctx[15], RUNNER))
    t = (
        _carray(_int64s(ctx[0]), leaves), _carray(_int64s(ctx[1]), leaves),
        _carray(_int64s(ctx[2]), nodes), _carray(_int64s(ctx[3]), nodes), _carray(_int64s(ctx[4]), nodes),
        runners[:, 0], runners[:, 1], runners[:, 2], _carray(_int64s(ctx[6]), ctx[16]),
        _carray(_int64s(ctx[7]), taken), _carray(_int64s(ctx[8]), taken),
        _carray(_int64s(ctx[9]), taken), _carray(_int64s(ctx[10]), taken),
    )  # fmt: skip
    n, out = _carray(_int64s(ctx[11]), 3), _carray(_int64s(ctx[12]), taken)
    ids, times = _carray(_int64s(ctx[18]), ctx[20]), _carray(_int64s(ctx[19]), ctx[20])
    return first(t, n, k, out, ids, times, got)


def below(t: Any, n: Any, bound: Any, out: Any) -> Any:
    """Take out for good every slot with a key below ``bound``, in order, into ``out``: how many."""
    nk, ns, off = t[2], t[4], t[8]
    _settle(t, n)
    root = off[off.shape[0] - 2]
    m = 0
    while n[0] > 0 and nk[root] < bound:
        out[m] = ns[root]
        _apply(t, n, out[m : m + 1], out, out, 2)
        m += 1
    return m


def build(t: Any) -> None:
    """Every node from the leaves up, O(N) (padding nodes stay empty)."""
    lk, lq, nk, nq, ns, rk, rq, rs, off = t[:9]
    size = lk.shape[0] >> SHIFT  # nodes at the level being built
    for g in range(size):
        _group(lk, lq, nk, nq, ns, rk, rq, rs, g)
    for level in range(1, off.shape[0] - 1):
        size = -(-size // B)
        for g in range(size):
            at = off[level] + g
            nk[at], nq[at], i = _best(nk, nq, off[level - 1] + (g << SHIFT))
            ns[at] = ns[i]


# the memory at an address as a pointer to int64; numba.carray (set by load)
_int64s: Any = _jit.compiled_only
_carray: Any = _jit.compiled_only

_KERNELS: SimpleNamespace | None = None
_LOADED = False


def load() -> SimpleNamespace | None:
    """The compiled kernels (compiled on first use), or ``None`` without numba."""
    global _KERNELS, _LOADED, _int64s, _carray
    if not _LOADED:
        ptrs = _jit.pointers("int64")
        if ptrs is not None:
            from numba import carray  # type: ignore[import-untyped, unused-ignore]

            (_int64s,), _carray = ptrs, carray  # first_at's globals
        kernels = (push, rekey, remove, first, below, build, first_at)
        helpers: tuple[Any, ...] = (_bits, _win, _other, _best, _group, _up, _others, _before)
        helpers += (_at, _lines, _ahead, _index, _apply, _settle, first)  # first: first_at calls it
        inline = (_best, _win, _group, _up, _others, _before)
        fns = _jit.compile_kernels(*kernels, helpers=helpers, inline=inline)
        names = ("push", "rekey", "remove", "first", "below", "build", "first_at")
        _KERNELS = None if fns is None else SimpleNamespace(**dict(zip(names, fns, strict=True)))
        _LOADED = True
    return _KERNELS
