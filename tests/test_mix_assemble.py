"""Mixture.sample gives what the sources' own sample() calls give, concatenated, bit for bit:
through the joined records (sources of one packed layout), the per-field join (other
storages, n-step), and a subclass's own sample."""

from __future__ import annotations

import pytest
import torch

import xpbank
from xpbank import Mixture, NStep, PrioritizedSampler, ReplayBuffer, TensorStorage
from xpbank.mix import assemble


def _data(n: int, seed: int, half: bool = True) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.randn(n, 5, generator=g),
        ("next", "obs"): torch.randn(n, 5, generator=g),
        "action": torch.randint(0, 4, (n,), generator=g),
        "reward": torch.randn(n, generator=g),
        "terminated": torch.rand(n, generator=g) < 0.1,
        "half": torch.randn(n, 2, generator=g).to(torch.bfloat16),
    }
    if not half:  # every field of a NumPy dtype
        del data["half"]
    return data


def _make(kind: str, seed: int, tmp_path: object, half: bool = True) -> ReplayBuffer:
    if kind == "packed":
        rb = ReplayBuffer(64, seed=seed)
    elif kind == "prioritized":
        rb = ReplayBuffer(64, seed=seed, sampler=PrioritizedSampler())
    elif kind == "unpacked":
        rb = ReplayBuffer(64, seed=seed, storage=TensorStorage(64, pack=False))
    elif kind == "nstep":
        rb = ReplayBuffer(64, seed=seed, nstep=NStep(2, 0.9))
    else:  # a bank opened "r": memmap fields
        src = ReplayBuffer(64, seed=seed)
        src.extend(_data(80, seed, half))
        return xpbank.open_bank(xpbank.save(src, f"{tmp_path}/bank{seed}"), "r")
    rb.extend(_data(80, seed, half))  # wraps the ring
    if kind == "prioritized":
        rb.update_priority(
            torch.arange(16, 80), torch.rand(64, generator=torch.Generator().manual_seed(seed))
        )
    return rb


KINDS = ["packed", "prioritized", "unpacked", "nstep", "bank"]


@pytest.mark.parametrize("half", [True, False])
@pytest.mark.parametrize("first", KINDS)
@pytest.mark.parametrize("second", KINDS)
def test_a_mixed_batch_is_the_sources_own_samples_concatenated(
    first: str, second: str, half: bool, tmp_path
) -> None:
    a, b = _make(first, 1, tmp_path, half), _make(second, 2, tmp_path, half)
    ga, gb = a._generator.get_state(), b._generator.get_state()
    mix = Mixture([a, b], [0.25, 0.75], keys="common")
    got = [mix.sample(40) for _ in range(3)]
    a._generator.set_state(ga)
    b._generator.set_state(gb)
    for batch in got:
        parts = [a.sample(10), b.sample(30)]
        want = {k for k in parts[0].keys(True, True)} & {k for k in parts[1].keys(True, True)}
        weighted = any("weight" in p for p in parts)
        assert set(batch.keys(True, True)) == want | {"source"} | ({"weight"} if weighted else set())
        for key in want - {"weight"}:
            expected = torch.cat([p[key] for p in parts])
            assert batch[key].dtype == expected.dtype and torch.equal(batch[key], expected), key
        if weighted:
            ones = [p["weight"] if "weight" in p else torch.ones(p.batch_size) for p in parts]
            assert torch.equal(batch["weight"], torch.cat(ones))
        assert batch["source"].tolist() == [0] * 10 + [1] * 30


def test_sources_of_one_layout_are_joined_in_one_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _make("packed", 1, None), _make("packed", 2, None)
    calls = []
    real = assemble._join_rows
    monkeypatch.setattr(assemble, "_join_rows", lambda parts: calls.append(real(parts)) or calls[-1])
    batch = Mixture([a, b], [1, 1]).sample(8)
    assert calls and calls[0] is not None  # the records path was taken
    assert batch["obs"].shape == (8, 5) and batch["half"].dtype == torch.bfloat16
    other = ReplayBuffer(64, seed=3, storage=TensorStorage(64, pack=False))
    other.extend(_data(10, 3))
    calls.clear()
    Mixture([a, other], [1, 1]).sample(8)
    assert calls == [None]  # another layout: joined field by field


def test_a_plain_uniform_source_is_drawn_through_its_fast_sample(monkeypatch: pytest.MonkeyPatch) -> None:
    """A packed uniform source's share takes the sample fast path's draw (the same draws:
    the first test compares the batches), a prioritized one its general path."""
    from xpbank.replay import fast_read

    a, b = _make("packed", 1, None), _make("prioritized", 2, None)
    taken = []
    real = fast_read.draw_records
    monkeypatch.setattr(fast_read, "draw_records", lambda rb, k: taken.append(real(rb, k)) or taken[-1])
    Mixture([a, b], [1, 1]).sample(8)
    assert len(taken) == 2 and taken[0] is not None and taken[1] is None
    a._fast_read = False  # the switch the tests use turns it off here too
    taken.clear()
    Mixture([a, b], [1, 1]).sample(8)
    assert taken == [None, None]


def test_sources_on_two_devices_need_device_and_a_bad_device_is_refused() -> None:
    """Without a GPU: a buffer on "meta" stands in for one on CUDA beside a CPU one."""
    cpu = xpbank.ReplayBuffer(10, seed=0)
    cpu.extend({"x": torch.arange(3.0)})
    meta = xpbank.ReplayBuffer(10, storing_device="meta", seed=0)
    meta.extend({"x": torch.zeros(3)})
    with pytest.raises(xpbank.DeviceError, match=r"expected one device, got \['cpu', 'meta'\]; pass device="):
        Mixture([cpu, meta], [1, 1])
    with pytest.raises(
        xpbank.DeviceError, match=r"^device: expected a torch device or its name, got 'gpu0'$"
    ):
        Mixture([cpu], [1], device="gpu0")
    assert len(cpu) == len(meta) == 3 and cpu.sample_all()["x"].tolist() == [0.0, 1.0, 2.0]
    mix = Mixture([cpu], [1], seed=0, device="cpu")  # the sources' own device: as without device=
    assert mix.sample(4)["x"].device.type == "cpu"
