"""RolloutBuffer(pack=False) (a block per field, contiguous views) and advance() (a step
written through the views by a front-end), against the packed buffer and add()."""

from __future__ import annotations

import pytest
import torch

from xpbank import RolloutBuffer
from xpbank.errors import CapacityError

E, T = 3, 4


def _steps(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        {
            "obs": torch.randn(E, 2, generator=g),
            "action": torch.randint(0, 5, (E,), generator=g),
            "reward": torch.randn(E, generator=g),
            "value": torch.randn(E, generator=g),
            "terminated": torch.rand(E, generator=g) < 0.3,
        }
        for _ in range(T)
    ]


@pytest.mark.parametrize("segmented", [False, True])
def test_unpacked_buffer_stores_and_reads_as_the_packed_one(segmented):
    def make(pack: bool) -> RolloutBuffer:
        if segmented:
            return RolloutBuffer.segmented(E, E * T, T, T, seed=1, pack=pack)
        return RolloutBuffer(E, T, seed=1, pack=pack)

    packed, unpacked = make(True), make(False)
    for step in _steps():
        packed.add(step) if not segmented else packed.store(step, range(E))
        unpacked.add(step) if not segmented else unpacked.store(step, range(E))
    for key in ("obs", "action", "reward", "value", "terminated"):
        view = unpacked.view(key)
        assert view.is_contiguous() and torch.equal(view, packed.view(key)), key
    a = packed.compute_returns(torch.zeros(E), 0.9, 0.8)
    b = unpacked.compute_returns(torch.zeros(E), 0.9, 0.8)
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert unpacked.view("advantage").is_contiguous()
    if not segmented:
        for x, y in zip(packed.minibatches(2, 2), unpacked.minibatches(2, 2), strict=True):
            assert all(torch.equal(x[k], y[k]) for k in x.keys())  # noqa: SIM118 (rows otherwise)


@pytest.mark.parametrize("pack", [True, False])
def test_advance_counts_a_step_written_through_the_views(pack):
    ref, ours = RolloutBuffer(E, T, seed=0), RolloutBuffer(E, T, seed=0, pack=pack)
    steps = _steps()
    ref.add(steps[0])
    ours.add(steps[0])  # the layout
    for step in steps[1:]:
        ref.add(step)
        t = len(ours) // E
        for key, value in step.items():
            ours.view(key)[t] = value
        ours.advance()
        assert len(ours) == len(ref)
    assert ours.ready() and ref.ready()
    for key in steps[0]:
        assert torch.equal(ours.view(key), ref.view(key))
    with pytest.raises(CapacityError, match="advance: the envs are not all at one free step"):
        ours.advance()  # full
    assert len(ours) == E * T
    ours.clear()
    ours.store({k: v[:1] for k, v in steps[0].items()}, [0])
    with pytest.raises(CapacityError, match="not all at one free step"):
        ours.advance()  # env 0 is a step ahead
    assert len(ours) == 1
    seg = RolloutBuffer.segmented(E, E * T, T, T)
    seg.store(steps[0], range(E))
    with pytest.raises(CapacityError, match="not all at one free step"):
        seg.advance()
