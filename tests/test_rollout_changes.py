"""Every RolloutBuffer iterator is made for one state of the rollout.

A ``clear()`` (and so any write: a complete rollout has room again only after one), or an
``update`` that changes a stored ``terminated`` / ``truncated`` flag, made after the
iterator was made, raises :class:`~xpbank.BufferChangedError` at its next ``next()``;
in-place updates of other fields, and a minibatch passed back whole, do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

from xpbank import BufferChangedError, CapacityError, RolloutBuffer, XpbankError

E, T = 4, 6


def step(t: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn(E, 3, generator=gen),
        "reward": torch.rand(E, generator=gen),
        "value": torch.rand(E, generator=gen),
        "terminated": torch.tensor([t == 2, False, t == 4, False]),
        "truncated": torch.tensor([False, t == 3, False, False]),
    }


def fill(rb: RolloutBuffer, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for t in range(T):
        rb.add(step(t, gen))


def full() -> RolloutBuffer:
    rb = RolloutBuffer(num_envs=E, horizon=T, seed=0)
    fill(rb)
    return rb


# each iterator of a full [T, E] rollout, by the name its error message uses
ITERATORS: dict[str, Callable[[RolloutBuffer], Iterator[Any]]] = {
    "minibatches": lambda rb: rb.minibatches(2, epochs=2),
    "recurrent_minibatches": lambda rb: rb.recurrent_minibatches(2, epochs=2, by="trajectory"),
    "recurrent_minibatches (by env)": lambda rb: rb.recurrent_minibatches(2, epochs=2, by="env"),
    "segment_minibatches": lambda rb: rb.segment_minibatches(2, bptt_horizon=3, minibatch_segments=2),
    "steps": lambda rb: rb.steps(),
}


def flip(rb: RolloutBuffer, key: str, slot: int) -> None:
    """Rewrite the stored ``key`` flag of ``slot`` to its opposite."""
    old = rb.view(key).reshape(-1)[slot]
    rb.update(rb.index_of([slot]), {key: (~old).reshape(1)})


CHANGES: dict[str, tuple[Callable[[RolloutBuffer], None], str]] = {
    "clear": (lambda rb: rb.clear(), "cleared"),
    "clear and write": (lambda rb: (rb.clear(), fill(rb, seed=1)), "cleared"),
    "terminated set": (lambda rb: flip(rb, "terminated", 1 * E + 1), r"episode ends \['terminated'\]"),
    "terminated unset": (lambda rb: flip(rb, "terminated", 2 * E + 0), r"episode ends \['terminated'\]"),
    "truncated set": (lambda rb: flip(rb, "truncated", 4 * E + 3), r"episode ends \['truncated'\]"),
}


@pytest.mark.parametrize("change", list(CHANGES))
@pytest.mark.parametrize("name", list(ITERATORS))
def test_a_change_after_the_iterator_is_made_raises_at_next(name: str, change: str) -> None:
    rb = full()
    batches = ITERATORS[name](rb)
    next(batches)
    do, how = CHANGES[change]
    do(rb)
    what = name.split(" ")[0]
    with pytest.raises(BufferChangedError, match=rf"{what}: the buffer was .*{how}.* during iteration"):
        next(batches)
    # made before the first next(): the plan is of the state at the call all the same
    rb = full()
    batches = ITERATORS[name](rb)
    do(rb)
    with pytest.raises(BufferChangedError):
        next(batches)


def test_the_error_is_an_xpbank_error_and_a_runtime_error() -> None:
    assert issubclass(BufferChangedError, XpbankError) and issubclass(BufferChangedError, RuntimeError)


def test_segmented_layout_segments_raise_after_an_ends_update() -> None:
    rb = RolloutBuffer.segmented(total_agents=2, batch_size=8, bptt_horizon=2, minibatch_size=4, seed=0)
    for _ in range(4):
        rb.store({"obs": torch.randn(2, 3), "terminated": torch.zeros(2, dtype=torch.bool)}, [0, 1])
    batches = rb.segment_minibatches(2)
    next(batches)
    rb.update(rb.index_of([3]), {"terminated": torch.tensor([True])})
    with pytest.raises(BufferChangedError, match="segment_minibatches: the buffer was updated"):
        next(batches)


@pytest.mark.parametrize("name", list(ITERATORS))
def test_updates_that_keep_the_episode_ends_leave_iterators_running(name: str) -> None:
    """Writing values back, repeating the stored flags or passing a minibatch back whole
    (what PPO loops do) is no change: every planned minibatch comes."""
    rb, ref = full(), full()
    rb.compute_returns(torch.zeros(E), final_values=torch.zeros(T, E))
    ref.compute_returns(torch.zeros(E), final_values=torch.zeros(T, E))
    want = sum(1 for _ in ITERATORS[name](ref))
    got = 0
    for batch in ITERATORS[name](rb):
        td = batch.data if hasattr(batch, "data") else batch
        index = td["index"]
        rb.update(index, {"value": torch.zeros(index.shape)})
        rb.update(index, {"terminated": td["terminated"], "truncated": td["truncated"]})
        rb.update(index, td)  # the minibatch passed back whole (reserved entries ignored)
        got += 1
    assert got == want


def test_a_write_needs_a_clear_first() -> None:
    """Why a write needs no marker of its own: a complete rollout takes none until cleared."""
    rb = full()
    batches = rb.minibatches(2)
    with pytest.raises(CapacityError):
        rb.add(step(0, torch.Generator().manual_seed(0)))
    assert sum(1 for _ in batches) == 2


def test_a_new_iterator_sees_the_updated_episode_ends() -> None:
    """The recurrent plan is cut at the ends stored when it is made: after an update that
    adds an episode end, a new iterator has one more trajectory, found by brute force."""
    rb = full()
    before = sum(b.data["mask"].shape[1] for b in rb.recurrent_minibatches(1, by="trajectory"))
    flip(rb, "terminated", 1 * E + 1)  # env 1 ends at t = 1 now, as well as t = 3 (truncated)
    term = rb.view("terminated") | rb.view("truncated")
    after = sum(b.data["mask"].shape[1] for b in rb.recurrent_minibatches(1, by="trajectory"))
    brute = sum(1 + int(term[:-1, e].sum()) for e in range(E))  # an end before the last step starts one
    assert after == before + 1 == brute
