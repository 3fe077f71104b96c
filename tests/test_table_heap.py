"""The compiled indexed heap (numba) against heapq's lazy heap, the path without numba:
the same first items, the same items below a bound, after the same random operations."""

from __future__ import annotations

import pickle

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


@pytest.mark.parametrize("capacity", [1, 16, 17, 257, 4097])
def test_tournament_tree_across_levels_and_taken_items(capacity: int) -> None:
    """Trees of 1 to 4 levels, many ties: the first items taken by ``best`` stay taken
    (updated, removed, or put back by the next ``best``/``below``) and the order equals
    heapq's; once put back, the tree equals one built from scratch (every node is a
    function of its children)."""
    kernels = heap_module.load()
    if kernels is None:
        pytest.skip("numba is not installed: only the heapq path runs")
    rng = np.random.default_rng(capacity)
    ring = TableRing(capacity)
    fast, lazy = heap_module.IndexedHeap(capacity, kernels), LazyHeap(capacity, "stamp")
    keys = np.zeros(capacity)
    for step in range(40):
        spread = (2, 1000)[step % 2]  # ties (broken by seq) or mostly distinct keys
        live = np.flatnonzero(ring.live)
        op = rng.integers(4)
        if op == 0 and ring.free_count:
            slots = ring.take_free(int(rng.integers(1, ring.free_count + 1)))
            ring.insert(slots)
            keys[slots] = rng.integers(-spread, spread, slots.shape[0]) / 2
            fast.push(ring, slots, keys[slots])
            lazy.push(ring, slots, keys[slots])
        elif op == 1 and live.size:  # often the items just taken by best
            taken = fast.best(ring, int(rng.integers(1, 300)))
            slots = np.concatenate([taken, rng.choice(live, int(rng.integers(0, 8)))])
            new = rng.integers(-spread, spread, slots.shape[0]) / 2
            _, last = np.unique(slots[::-1], return_index=True)
            keep = slots.shape[0] - 1 - last
            ring.restamp(slots[keep])
            keys[slots[keep]] = new[keep]
            fast.rekey(ring, slots, new)  # in order: a repeated slot keeps its last
            lazy.rekey(ring, slots[keep], new[keep])
        elif op == 2 and live.size:
            taken = fast.best(ring, int(rng.integers(1, 300)))
            slots = np.unique(np.concatenate([taken[: rng.integers(0, taken.size + 1)], rng.choice(live, 3)]))
            ring.release(slots)
            fast.remove(ring, slots)
            lazy.remove(ring, slots)
        elif op == 3 and live.size:
            fast.best(ring, int(rng.integers(1, 300)))
            bound = float(rng.integers(-spread, spread)) / 2
            got = fast.below(ring, bound)
            assert got.tolist() == lazy.below(ring, bound).tolist()
            ring.release(got)
        for k in (1, int(rng.integers(1, capacity + 2)), capacity):
            assert fast.best(ring, k).tolist() == lazy.best(ring, k).tolist()
        fast.best(ring, 0)  # puts the taken items back
        fresh = heap_module.IndexedHeap(capacity, kernels)
        fresh.rebuild(ring, keys)
        for mine, built in zip(fast.t[:5], fresh.t[:5], strict=True):  # leaves and nodes
            assert np.array_equal(mine, built)


def test_order_bits_keeps_the_float_order() -> None:
    values = np.array([-np.inf, -1e300, -2.5, -1e-310, -0.0, 0.0, 1e-310, 2.5, 1e300, np.inf])
    bits = heap_module.order_bits(values)
    assert bits.dtype == np.int64
    for i in range(values.size):
        for j in range(values.size):
            assert (bits[i] < bits[j]) == (values[i] < values[j])
            assert (bits[i] == bits[j]) == (values[i] == values[j])  # -0.0 == 0.0


def test_pickled_heap_table_samples_as_the_original() -> None:
    """A heap's compiled calls read its arrays through a context of addresses: pickled
    copies (their runner-ups back in one block) take the same first items as a twin
    never pickled, whatever another copy does meanwhile."""
    import pickle

    import torch

    from xpbank import Field, ReplayBuffer, Spec, Table

    def build() -> ReplayBuffer:
        rb = ReplayBuffer(5000, Spec({"x": Field(())}), sampler=Table("max_heap"))
        ids = torch.as_tensor(rb.extend({"x": torch.arange(3000.0)}))
        rb.update_priority(
            ids, torch.rand(3000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        )
        rb.sample(300, replace=False)  # some items taken when pickled
        return rb

    twin, rb = build(), build()
    same, other = pickle.loads(pickle.dumps(rb)), pickle.loads(pickle.dumps(rb))
    gen = torch.Generator().manual_seed(1)
    for _ in range(5):
        new = torch.rand(300, dtype=torch.float64, generator=gen)
        want = twin.sample(300, replace=False)["index"]
        for b in (rb, same, other):
            got = b.sample(300, replace=False)["index"]
            if b is not other:
                assert torch.equal(got, want)
            b.update_priority(got, new.flip(0) if b is other else new)
        twin.update_priority(want, new)


def test_taken_indices_written_on_demand_and_old_pickles() -> None:
    """A pop leaves the taken items' indices unwritten; a removal or an update of taken
    items out of the sample's order writes them first (the order stays heapq's); a heap
    pickled when ``n`` had two entries (its indices written) unpickles with a third."""
    kernels = heap_module.load()
    if kernels is None:
        pytest.skip("numba is not installed: only the heapq path runs")
    capacity = 300
    ring = TableRing(capacity)
    fast, lazy = heap_module.IndexedHeap(capacity, kernels), LazyHeap(capacity, "stamp")
    slots = ring.take_free(capacity)
    ring.insert(slots)
    keys = np.random.default_rng(0).permutation(capacity).astype(np.float64)
    fast.push(ring, slots, keys)
    lazy.push(ring, slots, keys)
    taken = fast.best(ring, 40)
    assert taken.tolist() == lazy.best(ring, 40).tolist() and fast.n[2] == 1
    assert (fast.t[9] == -1).all()  # no index written by the pops
    updated, new = taken[::-1][:5], np.array([500.0, 501, 502, 503, 504])  # out of order
    ring.restamp(updated)
    fast.rekey(ring, updated, new)
    lazy.rekey(ring, updated, new)
    assert fast.n[2] == 0 and fast.t[9][taken].tolist() == list(range(40))
    ring.release(taken[:3])
    fast.remove(ring, taken[:3])
    lazy.remove(ring, taken[:3])
    state = pickle.loads(pickle.dumps(fast.__getstate__()))
    state["n"] = state["n"][:2].copy()  # as pickled before n had a third entry
    old = heap_module.IndexedHeap.__new__(heap_module.IndexedHeap)
    old.__setstate__(state)
    assert old.n.tolist() == [fast.n[0], fast.n[1], 0]
    expected = lazy.best(ring, capacity).tolist()
    assert fast.best(ring, capacity).tolist() == expected == old.best(ring, capacity).tolist()
