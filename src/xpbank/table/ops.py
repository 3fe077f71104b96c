"""A :class:`~xpbank.table.Table`'s write and sample paths: placing items (evicting by the
remover), drawing batches (:mod:`xpbank.table.select`), removing items (used up, evicted
or stale), priorities, and the waits of the rate limiter.

Each function takes the table; the buffer holds its lock around every call. Every check
runs before anything changes: a refused or timed-out call leaves the table as it was.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from xpbank.errors import CapacityError, EmptyBufferError, PriorityError, RateLimitTimeout, SpecError
from xpbank.sampler import sumtree
from xpbank.sampler.uniform import sample_distinct
from xpbank.spec.spec import Spec
from xpbank.table.select import accept_draws, counts_in_order

# ``t`` is the Table (typed Any: xpbank.table.table imports this module)
Table = Any

__all__ = ["rebuild_orders", "remove", "sample", "set_priorities", "write"]


# -- writing ------------------------------------------------------------------------------
def write(t: Table, rb: Any, flat: dict[Any, torch.Tensor], n: int, spec: Spec) -> Any:
    """Store ``n`` checked rows; returns their ids (a ``range`` when they count up by one,
    else a 1-D int64 tensor). Waits on the rate limiter first; when the table lacks room,
    the remover picks the items that leave (from those stored before the call). A batch
    of more than ``capacity`` rows keeps its last ``capacity`` (no rate limiter only)."""
    ring, storage = t.ring, rb._storage
    assert ring is not None
    if storage.spec is None:
        t.check_spec(rb, spec)
    versions = _versions_of(t, flat, n)
    start = max(0, n - ring.capacity)
    if start and t.limiter is not None:
        raise CapacityError(
            f"extend: {n} items can never fit a table of capacity {ring.capacity} whose rate limiter "
            "makes writers wait for room; write smaller batches"
        )
    m = n - start
    if t.limiter is not None and m:
        lim = t.limiter
        _wait(t, "insert", m, None, lambda: lim.can_insert(m), lambda: lim.check_fits(m, "insert"))
        lim.inserts += m
    if storage.spec is None:
        storage.initialize(spec)
    if m == 0:
        return range(ring.next_id, ring.next_id)
    if m > ring.free_count:
        remove(t, victims(t, m - ring.free_count))
    head = ring.free_head
    slots = ring.take_free(m)
    rows = slice(start, n)
    part = flat if start == 0 else {k: v[rows] for k, v in flat.items()}
    if ring.in_order and head + m <= ring.capacity:  # take_free gave head, head + 1, ...
        run: slice | None = slice(head, head + m)
    elif int(slots[-1]) - int(slots[0]) == m - 1 and bool((np.diff(slots) == 1).all()):
        run = slice(int(slots[0]), int(slots[0]) + m)
    else:
        run = None
    storage.write(torch.from_numpy(slots) if run is None else run, part)
    ids = ring.insert(slots, run)
    entered(t, slots, versions if isinstance(versions, int) else versions[start:], run)
    t.notify()
    first = int(ids[0])
    if m == 1 or (int(ids[-1]) - first == m - 1 and bool((np.diff(ids) == 1).all())):
        return range(first, first + m)
    return torch.from_numpy(ids)


def _versions_of(t: Table, flat: dict[Any, torch.Tensor], n: int) -> int | np.ndarray:
    """The rows' versions: the writer-side stamp (one int for all) or ``version_key``'s values."""
    if t.version_key is None:
        return int(t.writer_version)
    return flat[t.version_key].reshape(n).cpu().numpy().astype(np.int64)


def entered(t: Table, slots: np.ndarray, versions: int | np.ndarray, run: slice | None = None) -> None:
    """Enter newly inserted ``slots`` in every order the table keeps (``run``: the same
    slots as a slice, when they are contiguous)."""
    ring = t.ring
    assert ring is not None
    at = slots if run is None else run
    ring.priority[at] = t.default_priority
    ring.version[at] = versions
    n = slots.shape[0]
    if t.max_times_sampled is not None:
        t.budget += n * t.max_times_sampled
        if t.tree is not None:  # entered as priority 0 (stuck), moved by _push_priorities
            t.stuck += n * t.max_times_sampled
    if t.log is not None:
        t.log.append(ring, slots)
    if t.dense is not None:
        t.dense.add(slots)
    if t.min_heap is not None or t.max_heap is not None or t.tree is not None:
        _push_priorities(t, slots, True)
    if t.versions is not None:
        t.versions.push(
            ring, slots, np.full(n, versions, dtype=np.int64) if isinstance(versions, int) else versions
        )


def _push_priorities(t: Table, slots: np.ndarray, new: bool) -> None:
    """Enter the priorities of ``slots`` (``new``: just inserted, else changed) in the
    heaps and the sum-tree."""
    ring = t.ring
    assert ring is not None
    p = ring.priority[slots]
    for heap, keys in ((t.min_heap, p), (t.max_heap, -p)):
        if heap is not None:
            (heap.push if new else heap.rekey)(ring, slots, keys)
    if t.tree is not None:
        leaves = p**t.priority_exponent
        if t.max_times_sampled is not None:  # draws left that the selector cannot reach
            old = t.tree[0][slots] > 0
            left = t.max_times_sampled - ring.times[slots]
            t.stuck += int(left[old & (leaves == 0)].sum()) - int(left[~old & (leaves > 0)].sum())
        sumtree.set_leaves(t.tree, slots, leaves, np.add)


def victims(t: Table, k: int) -> np.ndarray:
    """The ``k`` live items the remover picks to leave (``k <= len``)."""
    ring = t.ring
    assert ring is not None
    kind = t.remover
    if kind == "fifo":
        return t.log.oldest(ring, k)
    if kind == "lifo":
        return t.log.newest(ring, k)
    if kind == "min_heap":
        return t.min_heap.best(ring, k)
    if kind == "max_heap":
        return t.max_heap.best(ring, k)
    dense = t.dense
    assert dense is not None
    return dense.slots[sample_distinct(dense.count, k, t._rb._generator).numpy()]


def remove(t: Table, slots: np.ndarray, used_up: bool = False) -> None:
    """Remove distinct live ``slots`` from the table (their ids become stale); ``used_up``:
    each was drawn ``max_times_sampled`` times (no draws left to take off the budget)."""
    ring = t.ring
    assert ring is not None
    if slots.size == 0:
        return
    if t.max_times_sampled is not None and not used_up:
        left = t.max_times_sampled - ring.times[slots]
        t.budget -= int(left.sum())
        if t.tree is not None:
            t.stuck -= int(left[t.tree[0][slots] == 0].sum())
    ring.release(slots)
    if t.limiter is not None:
        t.limiter.deletes += slots.shape[0]
    for heap in (t.min_heap, t.max_heap, t.versions):
        if heap is not None:
            heap.remove(ring, slots)
    if t.dense is not None:
        t.dense.remove(slots)
    if t.tree is not None:
        sumtree.set_leaves(t.tree, slots, np.zeros(slots.shape[0]), np.add)


def set_priorities(t: Table, slots: np.ndarray, priorities: np.ndarray) -> None:
    """:meth:`Table.update_priority`: the last value of a repeated slot wins."""
    ring = t.ring
    assert ring is not None
    if slots.size == 0:
        return
    ordered = np.sort(slots)
    if (ordered[1:] == ordered[:-1]).any():  # repeated slots: keep the last of each
        keep = slots.shape[0] - 1 - np.unique(slots[::-1], return_index=True)[1]
        slots, priorities = slots[keep], priorities[keep]
    ring.priority[slots] = priorities
    ring.restamp(slots)
    _push_priorities(t, slots, False)


def rebuild_orders(t: Table, dense: np.ndarray | None) -> None:
    """Rebuild every order from the ring's arrays (after a state was loaded)."""
    ring = t.ring
    assert ring is not None
    if t.log is not None:
        t.log.rebuild(ring)
    if t.min_heap is not None:
        t.min_heap.rebuild(ring, ring.priority)
    if t.max_heap is not None:
        t.max_heap.rebuild(ring, -ring.priority)
    if t.versions is not None:
        t.versions.rebuild(ring, ring.version)
    if t.dense is not None and dense is not None:
        t.dense.load(dense)
    if t.tree is not None:
        t.tree[0][: ring.capacity] = np.where(ring.live, ring.priority**t.priority_exponent, 0.0)
        sumtree.rebuild(t.tree, np.add)


# -- sampling ---------------------------------------------------------------------------
def sample(
    t: Table,
    batch_size: int,
    generator: torch.Generator,
    replace: bool,
    timeout: float | None,
    max_staleness: int | None,
    current_version: int | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """``batch_size`` successive single samples (Reverb's batch), waiting on the rate
    limiter; stale items (``max_staleness``) are removed first."""
    ring = t.ring
    assert ring is not None
    if (max_staleness is None) != (current_version is None):
        raise SpecError("sample: max_staleness and current_version go together; got only one of them")
    if t.selector == "prioritized" and not replace:
        raise PriorityError(
            "replace=False: the prioritized selector draws with replacement; use replace=True"
        )
    b = batch_size
    most = ring.capacity if not replace else ring.capacity * (t.max_times_sampled or b)
    if b > most:
        raise CapacityError(f"sample: {b} draws can never be served by a table of capacity {ring.capacity}")
    if max_staleness is not None:  # checked first, then the stale items leave
        oldest = _count("current_version", current_version, None) - _count("max_staleness", max_staleness, 0)
        drop_stale(t, oldest)
    lim = t.limiter
    if lim is None:
        if not _available(t, b, replace):
            raise EmptyBufferError(_short(t, b, replace))
    else:
        _wait(t, "sample", b, timeout, lambda: lim.can_sample(b) and _available(t, b, replace),
              lambda: lim.check_fits(b, "sample"))  # fmt: skip
        lim.samples += b
    slots, info = (
        _ordered(t, b, replace)
        if t.selector not in ("uniform", "prioritized")
        else _random(t, b, replace, generator)
    )
    t.notify()
    return torch.from_numpy(slots), info


def _count(name: str, value: Any, low: int | None) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, np.integer))
        or (low is not None and value < low)
    ):
        raise SpecError(f"{name}: expected an int{'' if low is None else f' >= {low}'}, got {value!r}")
    return int(value)


def drop_stale(t: Table, oldest: int) -> None:
    """Remove every item whose version is below ``oldest``."""
    if t.versions is None:
        raise SpecError(
            "sample: max_staleness needs a versioned table: Table(version_key=...) or Table(versioned=True)"
        )
    assert t.ring is not None
    remove(t, t.versions.below(t.ring, oldest))


def _available(t: Table, b: int, replace: bool) -> bool:
    ring = t.ring
    assert ring is not None
    if not replace:
        return ring.size >= b
    if t.max_times_sampled is not None:
        return t.budget - t.stuck >= b
    return ring.size > 0 and (t.tree is None or sumtree.top_reduce(t.tree, np.add) > 0)


def _short(t: Table, b: int, replace: bool) -> str:
    ring = t.ring
    assert ring is not None
    if not replace or t.max_times_sampled is None:
        return f"sample: {b} {'distinct ' if not replace else ''}items asked for, {ring.size} can be drawn"
    return (
        f"sample: {b} draws asked for, but the {ring.size} items left may be drawn "
        f"{t.budget - t.stuck} more times (max_times_sampled={t.max_times_sampled})"
    )


def _ordered(t: Table, b: int, replace: bool) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """FIFO / LIFO / heap selectors: the first items, each as often as it may be drawn."""
    ring = t.ring
    assert ring is not None
    kind, limit = t.selector, t.max_times_sampled
    k = 1 if replace and limit is None else b
    if kind == "fifo":
        cand = t.log.oldest(ring, k)
    elif kind == "lifo":
        cand = t.log.newest(ring, k)
    else:
        cand = (t.min_heap if kind == "min_heap" else t.max_heap).best(ring, k)
    if limit == 1 or (limit is None and not replace):  # the first b (b are there), once each
        _consume(t, cand, np.ones(cand.shape[0], dtype=np.int64))
        return cand, {}
    left = np.full(cand.shape[0], b, dtype=np.int64) if limit is None else limit - ring.times[cand]
    if not replace:
        left = np.minimum(left, 1)
    counts = counts_in_order(left, b)
    used = cand[: counts.shape[0]]
    _consume(t, used, counts)
    return np.repeat(used, counts), {}


def _consume(t: Table, slots: np.ndarray, counts: np.ndarray) -> None:
    """Count draws of distinct ``slots``; remove the items used up."""
    ring = t.ring
    assert ring is not None
    if t.max_times_sampled == 1:  # live items were never drawn: each drawn once, used up
        ring.times[slots] = 1
        t.budget -= slots.shape[0]
        remove(t, slots, True)
        return
    ring.times[slots] += counts
    if t.max_times_sampled is not None:
        t.budget -= int(counts.sum())
        remove(t, slots[ring.times[slots] >= t.max_times_sampled])


def _random(
    t: Table, b: int, replace: bool, generator: torch.Generator
) -> tuple[np.ndarray, dict[str, torch.Tensor]]:
    """Uniform / prioritized selectors: rounds of i.i.d. draws, kept by rejection."""
    ring = t.ring
    assert ring is not None
    limit = t.max_times_sampled
    if t.selector == "uniform" and (not replace or limit == 1):
        dense = t.dense
        assert dense is not None
        slots = dense.slots[sample_distinct(dense.count, b, generator).numpy()]
        _consume(t, slots, np.ones(b, dtype=np.int64))
        return slots, {}
    out, probs = [], []
    need = b
    while need:
        draws, p = _propose(t, need, generator)
        usable = ring.live[draws] if t.tree is None else ring.live[draws] & (t.tree[0][draws] > 0)
        left = np.full(need, need) if limit is None else limit - ring.times[draws]
        keep = accept_draws(draws, usable, left)
        kept = draws[keep]
        uniq, counts = np.unique(kept, return_counts=True)
        _consume(t, uniq, counts)
        out.append(kept)
        probs.append(p[keep])
        need -= kept.shape[0]
    slots = np.concatenate(out)
    info = {} if t.tree is None else {"probability": torch.from_numpy(np.concatenate(probs))}
    return slots, info


def _propose(t: Table, n: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``n`` i.i.d. draws from the current distribution, with their probabilities."""
    if t.tree is None:
        dense = t.dense
        assert dense is not None
        pos = torch.randint(0, dense.count, (n,), generator=generator).numpy()
        return dense.slots[pos], np.full(n, 1.0 / dense.count)
    fractions = torch.rand(n, generator=generator, dtype=torch.float64).numpy()
    slots, total = sumtree.find_prefix_sum(t.tree, fractions)
    return slots, t.tree[0][slots] / total


# -- waiting ------------------------------------------------------------------------------
def _wait(t: Table, what: str, n: int, timeout: float | None, ready: Any, fits: Any) -> None:
    """Wait on the buffer's lock until ``ready()``, at most ``timeout`` (the table's by default).

    Raises:
        CapacityError: ``n`` could never be admitted (``fits`` raises it).
        RateLimitTimeout: still not ready after the timeout; nothing changed.
    """
    if ready():
        return
    fits()
    limit = t.timeout if timeout is None else float(timeout)
    if not limit >= 0:
        raise CapacityError(f"timeout: expected a number >= 0, got {timeout!r}")
    cond = t.condition()
    deadline = time.monotonic() + limit
    while not ready():
        left = deadline - time.monotonic()
        if left <= 0:
            ring = t.ring
            lim, other = t.limiter, "samples" if what == "insert" else "inserts"
            raise RateLimitTimeout(
                f"Table: {what} of {n} items still blocked after {limit:g} s ({ring.size} of "
                f"{ring.capacity} slots live; {lim!r}: inserts={lim.inserts}, samples={lim.samples}, "
                f"deletes={lim.deletes}); no {other} came to unblock it"
            )
        poll = t.poll_interval  # a backend whose items arrive from outside polls for them
        cond.wait(left if poll is None else min(left, poll))
        if t.on_wait is not None:
            t.on_wait()  # holding the lock again, e.g. pull published rows into the ring
