"""A shared-memory TensorStorage seen from another process."""

from __future__ import annotations

import pickle

import torch
import torch.multiprocessing as mp

from xpbank import Field, Spec, TensorStorage

SPEC = Spec({"obs": Field((3,)), "done": Field((), torch.bool), ("next", "obs"): Field((3,))})


def _child_writes(storage: TensorStorage, value: float) -> None:
    n = 4
    storage.write(
        slice(2, 2 + n),
        {
            "obs": torch.full((n, 3), value),
            "done": torch.ones(n, dtype=torch.bool),
            ("next", "obs"): torch.full((n, 3), -value),
        },
    )


def test_writes_in_a_child_process_are_seen_by_the_parent() -> None:
    storage = TensorStorage(8, SPEC, shared=True)
    before = {"obs": torch.full((2, 3), 1.0), "done": torch.zeros(2, dtype=torch.bool)}
    storage.write(slice(0, 2), {**before, ("next", "obs"): torch.full((2, 3), -1.0)})
    ctx = mp.get_context("spawn")
    proc = ctx.Process(target=_child_writes, args=(storage, 7.0))
    proc.start()
    proc.join(timeout=120)
    assert proc.exitcode == 0
    got = storage.read(torch.arange(8))
    assert torch.equal(got["obs"][2:6], torch.full((4, 3), 7.0))
    assert torch.equal(got["next", "obs"][2:6], torch.full((4, 3), -7.0))
    assert got["done"][2:6].all() and not got["done"][:2].any()
    assert torch.equal(got["obs"][:2], torch.full((2, 3), 1.0))  # the parent's own rows are intact
    assert torch.equal(got["next", "obs"][:2], torch.full((2, 3), -1.0))


def test_pickled_copy_is_a_working_independent_storage() -> None:
    storage = TensorStorage(4, SPEC)
    _child_writes_small = {"obs": torch.ones(1, 3), "done": torch.ones(1, dtype=torch.bool)}
    storage.write(slice(0, 1), {**_child_writes_small, ("next", "obs"): torch.ones(1, 3)})
    clone = pickle.loads(pickle.dumps(storage))
    clone.write(slice(0, 1), {"obs": torch.full((1, 3), 5.0)})
    assert torch.equal(clone.read(torch.tensor([0]))["obs"], torch.full((1, 3), 5.0))
    assert torch.equal(storage.read(torch.tensor([0]))["obs"], torch.ones(1, 3))
    assert torch.equal(clone.read(torch.tensor([0]))["next", "obs"], torch.ones(1, 3))
