"""RolloutBuffer(pack=False) (a block per field, contiguous views) and advance() (a step
written through the views by a front-end), against the packed buffer and add()."""

from __future__ import annotations

import pytest
import torch

from xpbank import RolloutBuffer, Spec
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


def _direct(rb: RolloutBuffer, step: dict[str, torch.Tensor], env_ids=None) -> None:
    """A step written as a front-end writes it: at next_slots, through the views, then advance."""
    slots = rb.next_slots(env_ids)
    for key, value in step.items():
        rb.view(key).flatten(0, 1)[torch.from_numpy(slots)] = value
    rb.advance(env_ids, [step["terminated"], None])


@pytest.mark.parametrize("pack", [True, False])
def test_steps_written_through_the_views_are_stored_as_add_stores_them(pack):
    ref, ours = RolloutBuffer(E, T, seed=0), RolloutBuffer(E, T, seed=0, pack=pack)
    steps = _steps()
    ref.add(steps[0])
    ours.add(steps[0])  # the layout
    for step in steps[1:]:
        ref.add(step)
        _direct(ours, step)
        assert len(ours) == len(ref)
    assert ours.ready() and ref.ready()
    for key in steps[0]:
        assert torch.equal(ours.view(key), ref.view(key))
    assert ours.stats()["episode_length"] == ref.stats()["episode_length"]
    with pytest.raises(CapacityError, match="already holds horizon=4 steps"):
        ours.next_slots()
    with pytest.raises(CapacityError, match="already holds horizon=4 steps"):
        ours.advance()
    assert len(ours) == E * T


def _zeroed(rb: RolloutBuffer) -> RolloutBuffer:
    for key in rb.spec or ():
        rb.view(key).zero_()
    return rb


def test_envs_out_of_step_and_segments_advance_on_their_own():
    ref, ours = RolloutBuffer(E, T, seed=0), RolloutBuffer(E, T, seed=0, pack=False)
    steps = _steps(1)
    for rb in (ref, ours):
        rb.add(steps[0])
    ref.store({k: v[1:] for k, v in steps[1].items()}, [1, 2])
    _direct(ours, {k: v[1:] for k, v in steps[1].items()}, [1, 2])
    ref.store({k: v[:1] for k, v in steps[2].items()}, slice(0, 1))
    _direct(ours, {k: v[:1] for k, v in steps[2].items()}, slice(0, 1))
    assert len(ours) == len(ref) == 6  # steps 0 and 1 of every env
    assert torch.equal(ours.view("obs")[:2], ref.view("obs")[:2])
    spec = Spec.from_batch(steps[0], batch_ndim=1)
    seg_ref = _zeroed(RolloutBuffer.segmented(E, 2 * E * T, T, T, spec=spec, seed=0))
    seg = _zeroed(RolloutBuffer.segmented(E, 2 * E * T, T, T, spec=spec, seed=0, pack=False))
    for i, step in enumerate(_steps(2) * 2):
        ids = [0, 2] if i % 3 else [0, 1, 2]  # agents out of step: each takes rows on its own
        seg_ref.store({k: v[ids] for k, v in step.items()}, ids)
        _direct(seg, {k: v[ids] for k, v in step.items()}, ids)
    assert torch.equal(seg.view("obs"), seg_ref.view("obs")) and len(seg) == len(seg_ref)
    assert seg.stats() == seg_ref.stats()
