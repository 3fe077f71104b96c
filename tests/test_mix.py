"""xpbank.mix: exact per-batch shares, schedules, routing of updates, state, banks."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

import xpbank
from xpbank.mix import Constant, Linear, Mixture, split_counts


def _reference_counts(weights: list[int], batch_size: int) -> list[int]:
    """Largest remainders in exact rational arithmetic; ties to the lower source index."""
    total = sum(weights)
    quotas = [Fraction(batch_size * w, total) for w in weights]
    counts = [math.floor(q) for q in quotas]
    order = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[: batch_size - sum(counts)]:
        counts[i] += 1
    return counts


def _buffer(n: int, marker: float, seed: int, capacity: int = 1000, **kw) -> xpbank.ReplayBuffer:
    rb = xpbank.ReplayBuffer(capacity, seed=seed, **kw)
    if n:
        rb.extend({"x": torch.full((n,), marker), "step": torch.arange(n)})
    return rb


# -- counts --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("weights", "batch_size", "expected"),
    [
        ([1, 1, 1], 256, [86, 85, 85]),
        ([1, 1], 7, [4, 3]),
        ([9, 1], 7, [6, 1]),
        ([1, 3], 2, [1, 1]),  # remainders 0.5 and 0.5: the lower index first
        ([0, 1], 5, [0, 5]),
        ([0.25, 0.75], 10, [3, 7]),  # 2.5 / 7.5: tie to source 0
        ([1, 2, 3, 4], 1, [0, 0, 0, 1]),
    ],
)
def test_split_counts_hand_worked(weights, batch_size, expected) -> None:
    assert split_counts(weights, batch_size) == expected


def test_split_counts_matches_an_exact_reference() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        weights = [rng.randint(0, 9) for _ in range(rng.randint(1, 5))]
        if sum(weights) == 0:
            continue
        b = rng.randint(1, 300)
        got = split_counts(weights, b)
        assert got == _reference_counts(weights, b), (weights, b)
        assert sum(got) == b and all(c == 0 for c, w in zip(got, weights, strict=True) if w == 0)


def test_bad_weights_are_refused() -> None:
    with pytest.raises(xpbank.CapacityError, match="at least one weight > 0"):
        split_counts([0, 0], 4)
    with pytest.raises(xpbank.CapacityError, match=r"weights\[1\]: expected a finite number >= 0, got -1"):
        Mixture([_buffer(1, 0, 0), _buffer(1, 1, 1)], [1, -1])
    with pytest.raises(xpbank.CapacityError, match=r"Linear\.steps"):
        Linear(0.5, 0.0, steps=0)
    with pytest.raises(xpbank.CapacityError, match="one per source"):
        Mixture([_buffer(1, 0, 0)], [1, 1])


# -- composition -----------------------------------------------------------------
def test_every_batch_holds_exactly_its_share_under_a_linear_schedule() -> None:
    online, offline = _buffer(20, 0.0, 0), _buffer(50, 1.0, 1)
    mix = Mixture([online, offline], [Linear(0.5, 1.0, steps=4), Linear(0.5, 0.0, steps=4)])
    # offline quotas 5, 3.75, 2.5 (tie: online first), 1.25, 0, 0
    expected = [[5, 5], [6, 4], [8, 2], [9, 1], [10, 0], [10, 0]]
    for want in expected:
        batch = mix.sample(10)
        src = batch["source"]
        assert torch.bincount(src, minlength=2).tolist() == want
        assert src.tolist() == sorted(src.tolist())  # grouped in source order
        assert torch.equal(batch["x"], src.to(torch.float32))  # each item from its source
        assert bool((batch["index"] < torch.tensor([20, 50])[src]).all())
    assert mix.step == len(expected)


def test_constant_shares_over_many_batches_and_sizes() -> None:
    sources = [_buffer(30, float(i), i) for i in range(3)]
    weights = [3, 5, 2]
    mix = Mixture(sources, [Constant(3.0), 5, 2.0], seed=0)
    for b in [1, 2, 3, 7, 10, 64, 255, 256]:
        for _ in range(5):
            batch = mix.sample(b)
            assert torch.bincount(batch["source"], minlength=3).tolist() == _reference_counts(weights, b)
            assert torch.equal(batch["x"], batch["source"].to(torch.float32))


def test_sources_sample_with_their_own_samplers() -> None:
    online, offline = _buffer(40, 0.0, 3), _buffer(40, 1.0, 4)
    twin_on, twin_off = _buffer(40, 0.0, 3), _buffer(40, 1.0, 4)
    mix = Mixture([online, offline], [0.25, 0.75])
    for _ in range(4):
        batch = mix.sample(8)
        a, b = twin_on.sample(2), twin_off.sample(6)
        assert torch.equal(batch["index"], torch.cat([a["index"], b["index"]]))


def test_coin_flip_mode_is_seeded_and_has_the_right_mean() -> None:
    def run(seed: int) -> list[int]:
        mix = Mixture([_buffer(10, 0, 0), _buffer(10, 1, 1)], [0.7, 0.3], seed=seed, exact=False)
        return [int(mix.sample(100)["source"].sum()) for _ in range(200)]

    counts = run(5)
    assert counts == run(5)
    assert len(set(counts)) > 5  # not exact counts
    # binomial(20000, 0.3): sd ~ 65 items; 5 sd
    assert abs(sum(counts) - 6000) < 5 * math.sqrt(20000 * 0.3 * 0.7)


# -- importance weights and keys ---------------------------------------------------
def test_prioritized_weights_kept_as_the_source_gives_them_others_get_one() -> None:
    def prioritized() -> xpbank.ReplayBuffer:
        rb = _buffer(32, 1.0, 7, sampler=xpbank.PrioritizedSampler(alpha=0.6, beta=0.4))
        rb.update_priority(torch.arange(32), torch.linspace(0.1, 5.0, 32))
        return rb

    uniform, prio, twin = _buffer(16, 0.0, 2), prioritized(), prioritized()
    mix = Mixture([uniform, prio], [1, 3])
    batch = mix.sample(16)
    direct = twin.sample(12)
    assert torch.equal(batch["weight"][:4], torch.ones(4))
    assert torch.equal(batch["weight"][4:], direct["weight"])
    assert torch.equal(batch["index"][4:], direct["index"])
    assert batch["weight"].dtype == torch.float32


def test_different_keys_are_refused_or_reduced_to_common_ones() -> None:
    a = _buffer(8, 0.0, 0)
    b = xpbank.ReplayBuffer(100, seed=1)
    b.extend({"x": torch.ones(8), "extra": torch.zeros(8, 2)})
    with pytest.raises(xpbank.SpecError, match=r"only in 0: \['step'\], only in 1: \['extra'\]"):
        Mixture([a, b], [1, 1]).sample(4)
    batch = Mixture([a, b], [1, 1], keys="common").sample(4)
    assert sorted(batch.keys()) == ["index", "source", "x"]


def test_same_key_with_another_shape_is_refused() -> None:
    a = xpbank.ReplayBuffer(10, seed=0)
    a.extend({"x": torch.zeros(4, 3)})
    b = xpbank.ReplayBuffer(10, seed=0)
    b.extend({"x": torch.zeros(4, 2)})
    with pytest.raises(xpbank.SpecError, match=r"field 'x': source 0 gives \(3,\)"):
        Mixture([a, b], [1, 1]).sample(4)


# -- empty and small sources -------------------------------------------------------
def test_an_empty_source_with_a_share_is_refused_before_anything_is_drawn() -> None:
    full, empty = _buffer(8, 0.0, 0), _buffer(0, 1.0, 1)
    before = full.generator.get_state().clone()
    mix = Mixture([full, empty], [1, 1])
    with pytest.raises(xpbank.EmptyBufferError, match="source 1 is empty but its weight gives it 2 items"):
        mix.sample(4)
    assert torch.equal(full.generator.get_state(), before) and mix.step == 0
    assert Mixture([full, empty], [1, 0]).sample(4)["source"].tolist() == [0, 0, 0, 0]


def test_a_source_smaller_than_its_share() -> None:
    small, big = _buffer(2, 0.0, 0), _buffer(50, 1.0, 1)
    mix = Mixture([small, big], [1, 1])
    batch = mix.sample(10)  # with replacement: the 2 items repeat
    assert set(batch["index"][:5].tolist()) <= {0, 1}
    with pytest.raises(
        xpbank.CapacityError, match=r"source 0: 5 distinct items asked for \(replace=False\), but only 2"
    ):
        mix.sample(10, replace=False)


# -- routing of updates --------------------------------------------------------------
def _snapshot(rb: xpbank.ReplayBuffer) -> dict:
    return {k: v.clone() for k, v in rb.sample_all().items()}


def test_update_routes_each_row_to_its_source_only() -> None:
    sources = [_buffer(20, float(i), i) for i in range(3)]
    mix = Mixture(sources, [1, 1, 0])
    untouched = _snapshot(sources[2])
    batch = mix.sample(12, replace=False)
    new_x = torch.arange(12, dtype=torch.float32) + 100
    mix.update(batch["source"], batch["index"], {"x": new_x})
    for s in range(2):
        expected = torch.full((20,), float(s))
        rows = batch["source"] == s
        expected[batch["index"][rows]] = new_x[rows]
        assert torch.equal(sources[s].sample_all()["x"], expected)
    assert all(torch.equal(v, untouched[k]) for k, v in sources[2].sample_all().items())


def test_a_whole_mixed_batch_can_be_written_back() -> None:
    sources = [_buffer(20, float(i), i) for i in range(2)]
    mix = Mixture(sources, [1, 1])
    batch = mix.sample(6)
    batch["x"] += 10
    mix.update(batch["source"], batch["index"], batch)
    assert torch.equal(sources[1].sample_by_index(batch["index"][3:].tolist())["x"], batch["x"][3:])


def test_a_stale_id_in_one_source_writes_nothing_anywhere() -> None:
    a, b = _buffer(10, 0.0, 0, capacity=10), _buffer(10, 1.0, 1, capacity=10)
    mix = Mixture([a, b], [1, 1])
    batch = mix.sample(4)
    b.extend({"x": torch.full((10,), 5.0), "step": torch.arange(10)})  # every id of b is stale
    before = _snapshot(a)
    with pytest.raises(xpbank.StaleIndexError):
        mix.update(batch["source"], batch["index"], {"x": torch.zeros(4)})
    assert torch.equal(a.sample_all()["x"], before["x"])


def test_a_read_only_bank_refuses_updates_and_nothing_is_written(tmp_path) -> None:
    path = xpbank.save(_buffer(30, 1.0, 1), tmp_path / "offline")
    online = _buffer(10, 0.0, 0)
    mix = Mixture([online, str(path)], [1, 1])
    assert type(mix.sources[1].storage).__name__ == "MemmapStorage"
    batch = mix.sample(6)
    before = _snapshot(online)
    with pytest.raises(xpbank.ReadOnlyError, match="source 1 is a bank opened read-only"):
        mix.update(batch["source"], batch["index"], {"x": torch.zeros(6)})
    assert torch.equal(online.sample_all()["x"], before["x"])
    rows = batch["source"] == 0
    mix.update(batch["source"][rows], batch["index"][rows], {"x": torch.full((3,), 9.0)})
    assert set(online.sample_all()["x"].tolist()) == {0.0, 9.0}


def test_an_opened_bank_is_mapped_not_loaded(tmp_path) -> None:
    path = xpbank.save(_buffer(30, 1.0, 1), tmp_path / "offline")
    mix = Mixture([_buffer(10, 0.0, 0), xpbank.open_bank(path, "r")], [1, 1])
    storage = mix.sources[1].storage
    arrays = [v for v in vars(storage).values() if isinstance(v, dict)]
    mapped = [a for d in arrays for a in d.values() if isinstance(a, np.memmap)]
    assert mapped, "the bank's fields should be np.memmap views of its files"
    assert mix.sample(8)["x"][4:].eq(1.0).all()


def test_update_priority_routes_to_each_source() -> None:
    def pair(seed: int) -> tuple[xpbank.ReplayBuffer, xpbank.ReplayBuffer]:
        return tuple(_buffer(16, float(seed), seed, sampler=xpbank.PrioritizedSampler()) for _ in range(2))

    (a, a2), (b, b2), (c, c2) = pair(0), pair(1), pair(2)
    mix = Mixture([a, b, c], [1, 1, 0])
    batch = mix.sample(8)
    prio = torch.arange(1, 9, dtype=torch.float64)
    mix.update_priority(batch["source"], batch["index"], prio)
    a2.sample(4), b2.sample(4)  # the twins' samplers count their samples too
    a2.update_priority(batch["index"][:4], prio[:4])
    b2.update_priority(batch["index"][4:], prio[4:])
    for got, want in [(a, a2), (b, b2), (c, c2)]:
        g, w = got.sampler.state_dict(), want.sampler.state_dict()
        assert g.keys() == w.keys()
        for k in g:
            assert np.array_equal(np.asarray(g[k]), np.asarray(w[k])), k


def test_update_priority_refusals_write_nothing() -> None:
    prio = _buffer(16, 0.0, 0, sampler=xpbank.PrioritizedSampler())
    plain = _buffer(16, 1.0, 1)
    mix = Mixture([prio, plain], [1, 1])
    batch = mix.sample(4)
    state = prio.sampler.state_dict()
    with pytest.raises(xpbank.PriorityError, match=r"source 1 .* keeps no priorities"):
        mix.update_priority(batch["source"], batch["index"], torch.ones(4))
    with pytest.raises(xpbank.PriorityError, match="finite numbers >= 0"):
        mix.update_priority(batch["source"][:2], batch["index"][:2], torch.tensor([1.0, float("nan")]))
    after = prio.sampler.state_dict()
    assert all(np.array_equal(np.asarray(state[k]), np.asarray(after[k])) for k in state)
    with pytest.raises(xpbank.XpbankIndexError, match=r"source: expected numbers in \[0, 2\), got 5"):
        mix.update(torch.tensor([5]), torch.tensor([0]), {"x": torch.zeros(1)})


# -- state ---------------------------------------------------------------------------
@pytest.mark.parametrize("exact", [True, False])
def test_state_round_trip_resumes_bit_for_bit(exact: bool) -> None:
    sources = [_buffer(40, 0.0, 0), _buffer(40, 1.0, 1, sampler=xpbank.PrioritizedSampler())]
    mix = Mixture(sources, [Linear(0.2, 0.8, steps=6), 1.0], seed=3, exact=exact)
    for _ in range(3):
        mix.sample(16)
    saved = mix.state_dict(), [rb.state_dict() for rb in sources]
    first = [mix.sample(16) for _ in range(5)]
    mix.load_state_dict(saved[0])
    for rb, state in zip(sources, saved[1], strict=True):
        rb.load_state_dict(state)
    again = [mix.sample(16) for _ in range(5)]
    for x, y in zip(first, again, strict=True):
        assert all(torch.equal(x[k], y[k]) for k in ("index", "source", "weight", "x"))


def test_save_puts_the_state_in_the_bank_metadata(tmp_path) -> None:
    weights = [Linear(0.5, 1.0, steps=10), Linear(0.5, 0.0, steps=10)]
    online, offline = _buffer(40, 0.0, 0), _buffer(40, 1.0, 1)
    mix = Mixture([online, offline], weights, seed=1, exact=False)
    for _ in range(4):
        mix.sample(8)
    path = mix.save(tmp_path / "online", source=0)
    offline_state = offline.state_dict()  # the offline source's own state, saved its own way
    assert xpbank.bank_metadata(xpbank.load(path))["xpbank.mix"]["step"] == 4
    want = [mix.sample(8) for _ in range(3)]
    restored, offline2 = xpbank.load(path), _buffer(40, 1.0, 1)
    offline2.load_state_dict(offline_state)
    mix2 = Mixture([restored, offline2], weights, exact=False)
    mix2.load_saved(restored)
    assert mix2.step == 4
    got = [mix2.sample(8) for _ in range(3)]
    for x, y in zip(got, want, strict=True):
        assert torch.equal(x["source"], y["source"]) and torch.equal(x["index"], y["index"])


def test_load_state_of_another_mixture_is_refused() -> None:
    mix = Mixture([_buffer(4, 0, 0)], [1.0])
    other = Mixture([_buffer(4, 0, 0)], [Linear(1.0, 0.5, 3)])
    with pytest.raises(xpbank.SpecError, match="saved with weights"):
        mix.load_state_dict(other.state_dict())
    with pytest.raises(xpbank.BankError, match=r"no 'xpbank\.mix' entry"):
        mix.load_saved(_buffer(4, 0, 0))


# -- sources with their own options ---------------------------------------------------------
def _transitions(n: int, offset: float) -> dict[str, torch.Tensor]:
    obs = torch.arange(n, dtype=torch.float32) + offset
    terminated = torch.zeros(n, dtype=torch.bool)
    terminated[n // 2 - 1] = True
    return {"obs": obs, "next_obs": obs + 1, "reward": torch.ones(n), "terminated": terminated}


def test_nstep_sources_keep_their_own_targets() -> None:
    def nstep(seed: int, n: int, offset: float) -> xpbank.ReplayBuffer:
        rb = xpbank.ReplayBuffer(100, num_envs=1, nstep=xpbank.NStep(n, 0.5), seed=seed)
        rb.extend(_transitions(20, offset))
        return rb

    a, b = nstep(0, 3, 0.0), nstep(1, 2, 100.0)
    twin_a, twin_b = nstep(0, 3, 0.0), nstep(1, 2, 100.0)
    batch = Mixture([a, b], [1, 1]).sample(16)
    direct = [twin_a.sample(8), twin_b.sample(8)]
    for key in ("index", "nstep_return", "nstep_discount", "next_obs", "obs"):
        assert torch.equal(batch[key], torch.cat([d[key] for d in direct])), key
    plain = xpbank.ReplayBuffer(100, seed=2)
    plain.extend(_transitions(20, 0.0))
    with pytest.raises(
        xpbank.SpecError,
        match=r"only in 0: \['nstep_discount', 'nstep_return', 'nstep_steps', 'nstep_terminated'\], "
        r"only in 1: \[\]",
    ):
        Mixture([a, plain], [1, 1]).sample(4)


def test_sequence_sources_give_windows_and_a_source_per_step() -> None:
    def seq(seed: int, offset: float) -> xpbank.ReplayBuffer:
        rb = xpbank.ReplayBuffer(100, num_envs=1, sampler=xpbank.SequenceSampler(4), seed=seed)
        rb.extend(_transitions(30, offset))
        return rb

    batch = Mixture([seq(0, 0.0), seq(1, 100.0)], [3, 1]).sample(8)
    assert tuple(batch.batch_size) == (8, 4)
    assert torch.equal(batch["source"], torch.tensor([0] * 6 + [1] * 2)[:, None].expand(8, 4))
    assert bool((batch["obs"][6:] >= 100).all()) and bool((batch["obs"][:6] < 100).all())
    with pytest.raises(xpbank.SpecError, match="differ in shape beyond the item dim"):
        Mixture([seq(0, 0.0), _buffer(10, 0.0, 0)], [1, 1], keys="common").sample(4)
