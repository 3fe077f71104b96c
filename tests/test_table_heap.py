"""The compiled indexed heap (numba) against heapq's lazy heap, the path without numba:
the same first items, the same items below a bound, after the same random operations."""

from __future__ import annotations

import numpy as np
import pytest

from xpbank.table import heap as heap_module
from xpbank.table.orders import LazyHeap
from xpbank.table.slots import TableRing


@pytest.mark.parametrize("seed", range(6))
def test_indexed_heap_orders_as_the_lazy_heap(seed: int) -> None:
    kernels = heap_module.load()
    if kernels is None:
        pytest.skip("numba is not installed: only the heapq path runs")
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(1, 300))
    ring = TableRing(capacity)
    fast, lazy = heap_module.IndexedHeap(capacity, kernels), LazyHeap(capacity, "stamp")
    keys = np.zeros(capacity)
    for _ in range(60):
        op = rng.integers(4)
        live = np.flatnonzero(ring.live)
        if op == 0 and ring.free_count:  # insert
            slots = ring.take_free(int(rng.integers(1, ring.free_count + 1)))
            ring.insert(slots)
            keys[slots] = rng.integers(0, 4, slots.shape[0])  # ties: broken by seq
            fast.push(ring, slots, keys[slots])
            lazy.push(ring, slots, keys[slots])
        elif op == 1 and live.size:  # rekey (a slot may repeat: the last key wins)
            slots = rng.choice(live, int(rng.integers(1, live.size + 1)))
            new = rng.integers(0, 4, slots.shape[0]).astype(np.float64)
            _, last = np.unique(slots[::-1], return_index=True)
            keep = slots.shape[0] - 1 - last
            ring.restamp(slots[keep])
            keys[slots[keep]] = new[keep]
            fast.rekey(ring, slots[keep], new[keep])
            lazy.rekey(ring, slots[keep], new[keep])
        elif op == 2 and live.size:  # remove
            slots = rng.choice(live, int(rng.integers(1, live.size + 1)), replace=False)
            ring.release(slots)
            fast.remove(ring, slots)
            lazy.remove(ring, slots)
        elif op == 3 and live.size:  # pop below a bound (removed from the table)
            got = fast.below(ring, 1.0)
            assert got.tolist() == lazy.below(ring, 1.0).tolist()
            ring.release(got)
        k = int(rng.integers(1, capacity + 2))
        assert fast.best(ring, k).tolist() == lazy.best(ring, k).tolist()
        fresh = heap_module.IndexedHeap(capacity, kernels)
        fresh.rebuild(ring, keys)
        assert fresh.best(ring, capacity).tolist() == lazy.best(ring, capacity).tolist()
