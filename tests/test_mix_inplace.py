"""A Mixture batch taken in place (xpbank.mix.inplace): sources of one packed layout draw
their shares straight into one batch, which is still exactly the sources' own samples
concatenated, in fresh memory, whatever the sources' samplers, repeats and state changes."""

from __future__ import annotations

import pytest
import torch

from xpbank import MemmapStorage, Mixture, PrioritizedSampler, ReplayBuffer, UniformSampler, open_bank, save
from xpbank.mix import Linear, assemble


def _data(n: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(n, 3, generator=g),
        "action": torch.randint(0, 4, (n,), generator=g),
        "done": torch.rand(n, generator=g) < 0.2,
    }


def _buffer(seed: int, sampler: object = None, n: int = 40) -> ReplayBuffer:
    rb = ReplayBuffer(32, seed=seed, sampler=sampler)
    rb.extend(_data(n, seed))  # n > 32 wraps the ring: ids are not slots
    if isinstance(sampler, PrioritizedSampler):
        g = torch.Generator().manual_seed(seed)
        rb.update_priority(torch.arange(n - 32, n), torch.rand(32, generator=g) + 0.05)
    return rb


def _expect(parts: list[tuple[ReplayBuffer, int]], states: list[torch.Tensor]) -> list[dict]:
    """The sources' own samples of the given sizes, drawn from the saved generator states."""
    for (rb, _), state in zip(parts, states, strict=True):
        rb.generator.set_state(state)
    return [rb.sample(k) for rb, k in parts]


def _same(batch: object, want: list[object]) -> None:
    for key in want[0].keys(True, True):
        expected = torch.cat([w[key] for w in want])
        assert batch[key].dtype == expected.dtype and torch.equal(batch[key], expected), key


def _in_place_spy(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    seen: list[bool] = []
    real = assemble._join_rows

    def spy(parts: list) -> object:
        seen.append(all(p[3] is not None and p[3][2] is not None for p in parts))
        return real(parts)

    monkeypatch.setattr(assemble, "_join_rows", spy)
    return seen


def test_one_buffer_twice_gives_its_two_samples_in_turn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The uniform fast draw reuses one slot array per batch size: each share is taken
    before the next draw, so a source listed twice gives two different draws."""
    seen = _in_place_spy(monkeypatch)
    for sampler in (None, PrioritizedSampler()):
        rb = _buffer(1, sampler)
        state = rb.generator.get_state()
        mix = Mixture([rb, rb], [1, 1])
        batch = mix.sample(16)
        rb.generator.set_state(state)
        want = [rb.sample(8), rb.sample(8)]
        _same(batch, want)
        assert not torch.equal(want[0]["index"], want[1]["index"])
        assert batch["source"].tolist() == [0] * 8 + [1] * 8
    assert seen == [True, True]


def test_a_batch_in_place_is_fresh_memory() -> None:
    a, b = _buffer(1), _buffer(2, PrioritizedSampler())
    mix = Mixture([a, b], [1, 1])
    before = {k: a.storage.view(k).clone() for k in ("obs", "action", "done")}
    first = mix.sample(8)
    for value in first.values(True, True):
        value.zero_()
    second = mix.sample(8)
    assert second["source"].tolist() == [0] * 4 + [1] * 4  # the kept column was not written
    assert bool((second["weight"][:4] == 1).all())
    for k, v in before.items():
        assert torch.equal(a.storage.view(k), v)  # nor the sources' storage


@pytest.mark.parametrize("sampler", [None, "prioritized"])
def test_a_source_joining_later_under_a_schedule(sampler: str | None, monkeypatch) -> None:
    """The sources with a share change with the step: the layout is found again."""
    seen = _in_place_spy(monkeypatch)
    a = _buffer(1, PrioritizedSampler() if sampler else None)
    b = _buffer(2)
    mix = Mixture([a, b], [Linear(1.0, 0.5, steps=1), Linear(0.0, 0.5, steps=1)])
    states = [a.generator.get_state(), b.generator.get_state()]
    got = [mix.sample(10), mix.sample(10)]
    a.generator.set_state(states[0])
    b.generator.set_state(states[1])
    want = [a.sample(10), a.sample(5), b.sample(5)]
    _same(got[0], want[:1])
    _same(got[1], [w.exclude("weight") for w in want[1:]])
    if sampler:
        assert torch.equal(got[1]["weight"], torch.cat([want[1]["weight"], torch.ones(5)]))
    assert got[1]["source"].tolist() == [0] * 5 + [1] * 5
    assert seen == [True, True]


class _OwnUniform(UniformSampler):
    """A sampler of another type: its slots are not trusted to be in range."""


class _Float64Weights(PrioritizedSampler):
    """Weights of another dtype than a prioritized sampler's float32."""

    def sample(self, ring, batch_size, generator, replace=True):
        slots, info = super().sample(ring, batch_size, generator, replace)
        return slots, {"weight": info["weight"].double()}


@pytest.mark.parametrize("first", [None, PrioritizedSampler])
@pytest.mark.parametrize("other", [_OwnUniform, _Float64Weights])
def test_other_samplers_are_read_their_own_way_and_joined(
    first: type | None, other: type, monkeypatch
) -> None:
    """A share that is not taken in place: the shares that were are joined with it."""
    seen = _in_place_spy(monkeypatch)
    a, b = _buffer(1, first() if first else None), _buffer(2, other())
    states = [a.generator.get_state(), b.generator.get_state()]
    batch = Mixture([a, b], [1, 3]).sample(12)
    want = _expect([(a, 3), (b, 9)], states)
    _same(batch, [w.exclude("weight") for w in want])
    if first or other is _Float64Weights:
        weights = [w["weight"] if "weight" in w else torch.ones(w.batch_size) for w in want]
        assert torch.equal(batch["weight"], torch.cat(weights))
    else:
        assert "weight" not in batch
    assert seen[-1] is False  # joined share by share, not in place


def _memmapped(tmp_path: object, seed: int, kind: str) -> ReplayBuffer:
    """A bank opened "r" (uniform or prioritized), or a buffer over a MemmapStorage."""
    if kind == "own sampler memmap":
        rb = ReplayBuffer(32, seed=seed, sampler=_OwnUniform(), storage=MemmapStorage(32, f"{tmp_path}/mm"))
        rb.extend(_data(40, seed))
        return rb
    src = _buffer(seed, PrioritizedSampler() if kind == "prioritized bank" else None)
    return open_bank(save(src, f"{tmp_path}/bank{seed}"), "r")


@pytest.mark.parametrize("second", ["bank", "prioritized bank", "own sampler memmap"])
def test_a_bank_and_a_buffer_are_taken_field_by_field_in_place(
    second: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A memory-mapped source: every field's rows go straight into the batch (no join)."""
    joined = []
    real = assemble.Assembler.join
    monkeypatch.setattr(assemble.Assembler, "join", lambda self, *a: joined.append(1) or real(self, *a))
    a, b = _buffer(1), _memmapped(tmp_path, 2, second)
    states = [a.generator.get_state(), b.generator.get_state()]
    mix = Mixture([a, b, a], [1, 2, 1])
    got = mix.sample(12)
    want = [*_expect([(a, 3), (b, 6)], states), a.sample(3)]
    _same(got, [w.exclude("weight") for w in want])
    if second == "prioritized bank":
        ones = torch.ones(3)
        assert torch.equal(got["weight"], torch.cat([ones, want[1]["weight"], ones]))
    assert got["source"].tolist() == [0] * 3 + [1] * 6 + [2] * 3
    assert joined == []
    got["obs"].zero_()  # fresh memory: the bank (opened "r") is not written
    assert not torch.equal(mix.sample(12)["obs"], torch.zeros(12, 3))


@pytest.mark.parametrize("sampler", [None, "prioritized"])
def test_a_source_laid_out_anew_between_batches(sampler: str | None, monkeypatch) -> None:
    """The layout kept from the last batch is checked share by share: a source whose block
    is read through a new reader since (as after unpickling) is read apart and joined,
    and the next batch finds the layout again and is taken in place."""
    seen = _in_place_spy(monkeypatch)
    a, b = _buffer(1), _buffer(2, PrioritizedSampler() if sampler else None)
    mix = Mixture([a, b], [1, 1])
    states = [a.generator.get_state(), b.generator.get_state()]
    got = [mix.sample(8)]
    b.storage._lay_out(b.storage._blocks)  # a new RecordReader of the same block
    got += [mix.sample(8), mix.sample(8)]
    a.generator.set_state(states[0])
    b.generator.set_state(states[1])
    want = [[a.sample(4), b.sample(4)] for _ in range(3)]
    for batch, parts in zip(got, want, strict=True):
        _same(batch, [p.exclude("weight") for p in parts])
        if sampler:
            assert torch.equal(batch["weight"], torch.cat([torch.ones(4), parts[1]["weight"]]))
        else:
            assert "weight" not in batch
    assert seen == [True, False, True]
