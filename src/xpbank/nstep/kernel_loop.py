"""The n-step kernel's source: plain Python loops that :func:`xpbank.nstep.kernel.kernel`
compiles with numba (``xpbank._jit.compile_kernels``).

:func:`_nstep_gather` is the kernel; :func:`_window` and :func:`_cell` are the helpers it
calls, registered through ``helpers=`` and kept in this module, whose source numba's disk
cache checks. The wrappers that call the kernel, its copy plan and the switch live in
:mod:`xpbank.nstep.kernel`; run as Python (as tests do), the loops give the compiled
kernel's results.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from xpbank._jit.prefetch import prefetch, prefetch_once

__all__ = ["AHEAD"]

AHEAD = 8  # the kernel prefetches the lines of the item this many places ahead
# the bits of a (terminated, truncated) pair read as one uint16 that say terminated
_TERMINATED = int(np.array([1, 0], dtype=np.uint8).view(np.uint16)[0])


def _cell(k: Any, terminated: Any) -> Any:  # pragma: no cover - compiled into the kernel
    """A table cell's meta word: ``k`` in the low 16 bits, bit 16 set where it terminated."""
    meta = np.uint32(k)
    if terminated:
        meta |= np.uint32(0x10000)
    return meta


def _window(
    item: Any,
    s0: Any,
    lockstep: Any,
    capacity: Any,
    next_id: Any,
    nxt: Any,
    flags: Any,
    reward: Any,
    powers: Any,
) -> tuple[Any, Any, Any]:  # pragma: no cover - compiled into the kernel; run as Python by tests
    """Item ``item``'s window (it is in slot ``s0``): ``(last slot, k, return)``, the return
    summed in float64, step 0 first. Lockstep windows step ``lockstep`` slots on (wrapped
    without a division) and stop at the first step that ends its episode (``flags``) or
    whose env's next step has no id below ``next_id`` yet; link-following windows step to
    ``next`` until it is ``-1``. The slots after a window's end are never read."""
    n = powers.shape[0] - 1
    slot = s0
    acc = 0.0
    k = 1
    while True:
        acc += powers[k - 1] * np.float64(reward[slot])
        if k == n:
            break
        if lockstep > 0:
            item += lockstep  # the env's next step
            if flags[slot] != 0 or item >= next_id:  # the episode ended, or not written yet
                break
            slot += lockstep
            if slot >= capacity:
                slot %= capacity
        else:
            after = nxt[slot]
            if after < 0:
                break
            slot = after % capacity
        k += 1
    return slot, k, acc


def _nstep_gather(
    ids: Any,
    next_id: Any,
    first_id: Any,
    lockstep: Any,
    capacity: Any,
    nxt: Any,
    flags: Any,
    reward: Any,
    powers: Any,
    table: Any,
    table_state: Any,
    words: Any,
    runs: Any,
    mixed: Any,
    extra: Any,
    rows: Any,
) -> None:  # pragma: no cover - compiled by numba; run only through kernel()
    """The kernel (numba nopython; ``rows`` and the table written in place).

    Where the table is in use (``table_state[1]``), it first fills the cells of the
    items completed since its last call, in id order, and advances ``table_state[0]``
    (``hi``). Then iteration ``i`` prefetches item ``i``'s lines and reads item
    ``i - AHEAD``: its window from its cell where its id is below ``hi`` and the cell is
    filled, else walked (:func:`_window`; a walked window below ``hi`` is kept), then
    its output row (the copy written out here: as a call it cost ~7 us a batch):
    the words of ``runs`` and ``mixed`` from the item's row and the last one's, and the
    n-step values at the byte offsets ``extra`` (the order of
    :data:`~xpbank.nstep.kernel.EXTRAS`). A table read is one line where a walk reads a
    reward line per step and the flags (a full window's pairs lie within
    ``2 * (n - 1) * lockstep + 2`` bytes, one line or two).
    ``terminated`` of the last slot is its flags' ``_TERMINATED`` bits. Word indices are
    unsigned (no negative-index checks in the copy loops, which then compile to vector
    moves)."""
    b = ids.shape[0]
    n = powers.shape[0] - 1
    table_ret, table_meta = table.view(np.float32)[:, 0], table[:, 1]
    hi = np.int64(0)
    if table_state[1] != 0 and lockstep > 0:
        hi = np.int64(table_state[0])
        if hi > next_id:  # the ring went back (a loaded state): nothing is known
            table_meta[:] = 0
            hi = np.int64(0)
        start = max(hi, np.int64(first_id))
        hi = max(start, np.int64(next_id - (n - 1) * lockstep))
        s = start % capacity
        for t in range(start, hi):  # the windows completed since the last call
            slot, k, acc = _window(t, s, lockstep, capacity, next_id, nxt, flags, reward, powers)
            table_ret[s] = np.float32(acc)
            table_meta[s] = _cell(k, (flags[slot] & _TERMINATED) != 0)
            s += 1
            if s == capacity:
                s = 0
        table_state[0] = hi
    f32, i64, u8 = rows.view(np.float32), rows.view(np.int64), rows.view(np.uint8)
    o_ret, o_disc, o_steps, o_done, o_last = (
        extra[0] // 4,
        extra[1] // 4,
        extra[2] // 8,
        extra[3],
        extra[4] // 8,
    )
    row_bytes = np.int64(words.strides[0])
    word = np.int64(words.strides[1])
    base = np.int64(words.ctypes.data)
    nxt_base, flags_base = np.int64(nxt.ctypes.data), np.int64(flags.ctypes.data)
    rew_base, rew_step = np.int64(reward.ctypes.data), np.int64(reward.strides[0])
    meta_base, meta_step = np.int64(table_meta.ctypes.data), np.int64(table_meta.strides[0])
    for i in range(b + AHEAD):
        if i < b:  # prefetch item i: its row's item words, its cell or its window's rewards and flags
            item = np.int64(ids[i])
            s0 = item % capacity
            last = s0
            if lockstep > 0:  # the window's slots are known: a full window's
                for _ in range(1, n):
                    last += lockstep
                    if last >= capacity:
                        last %= capacity
                if item < hi:
                    prefetch(meta_base + s0 * meta_step)
                else:
                    prefetch(flags_base + s0 * 2)
                    for j in range(n):
                        prefetch(rew_base + ((s0 + j * lockstep) % capacity) * rew_step)
                    if (flags_base + last * 2) >> 6 != (flags_base + s0 * 2) >> 6:
                        prefetch(flags_base + last * 2)
            else:  # following links: only the first is known
                prefetch(flags_base + s0 * 2)
                prefetch(rew_base + s0 * rew_step)
                prefetch(nxt_base + s0 * 8)
            for r in range(runs.shape[0]):
                if runs[r, 2] == 1 and lockstep == 0:
                    continue  # following links: the window's last row is not known yet
                row = base + (s0 if runs[r, 2] == 0 else last) * row_bytes
                line = row + np.int64(runs[r, 0]) * word
                line -= line % 64
                end = row + np.int64(runs[r, 1]) * word
                while line < end:
                    prefetch_once(line)
                    line += 64
            for q in range(mixed.shape[0]):
                prefetch_once(base + s0 * row_bytes + np.int64(mixed[q, 0]) * word)
                prefetch_once(base + last * row_bytes + np.int64(mixed[q, 0]) * word)
        j = i - AHEAD
        if j < 0:
            continue
        item = np.int64(ids[j])
        s0 = item % capacity
        meta = table_meta[s0] if item < hi else np.uint32(0)
        if meta != 0:  # the cell's: a lockstep window's last slot from its length
            k = np.int64(meta & np.uint32(0xFFFF))
            ended = (meta >> np.uint32(16)) != 0
            total = table_ret[s0]
            slot = s0 + (k - 1) * lockstep
            if slot >= capacity:
                slot %= capacity
        else:  # walked
            slot, k, acc = _window(item, s0, lockstep, capacity, next_id, nxt, flags, reward, powers)
            ended = (flags[slot] & _TERMINATED) != 0
            total = np.float32(acc)
            if item < hi:  # a complete window: keep it
                table_ret[s0] = total
                table_meta[s0] = _cell(k, ended)
        for r in range(runs.shape[0]):
            src = s0 if runs[r, 2] == 0 else slot
            for w in range(runs[r, 0], runs[r, 1]):
                rows[j, w] = words[src, w]
        for q in range(mixed.shape[0]):
            w = mixed[q, 0]
            rows[j, w] = (words[s0, w] & mixed[q, 1]) | (words[slot, w] & mixed[q, 2])
        f32[j, o_ret] = total
        f32[j, o_disc] = np.float32(0.0) if ended else np.float32(powers[k])
        i64[j, o_steps] = k
        u8[j, o_done] = ended
        i64[j, o_last] = slot
