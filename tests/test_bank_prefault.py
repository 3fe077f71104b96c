"""load's host fast path (bank/prefault.py, straight copies into host_view) against its
fallback through storage.write, and prefaulting leaves memory contents alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import xpbank
from xpbank.bank.prefault import prefault
from xpbank.spec.spec import Field, Spec
from xpbank.storage import TensorStorage


def _buffer() -> xpbank.ReplayBuffer:
    spec = Spec(
        {
            "obs": Field((3,)),
            ("next", "obs"): Field((3,)),
            "action": Field((), torch.int64),
            "half": Field((2,), torch.bfloat16),
            "done": Field((), torch.bool),
            "empty": Field((0,)),
        }
    )
    rb = xpbank.ReplayBuffer(50, spec, seed=3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):  # 63 items: wraps
        rb.extend(
            {
                "obs": torch.randn(21, 3, generator=gen),
                ("next", "obs"): torch.randn(21, 3, generator=gen),
                "action": torch.randint(0, 9, (21,), generator=gen),
                "half": torch.randn(21, 2, generator=gen).to(torch.bfloat16),
                "done": torch.rand(21, generator=gen) < 0.3,
                "empty": torch.zeros(21, 0),
            }
        )
    return rb


def _same(a: xpbank.ReplayBuffer, b: xpbank.ReplayBuffer) -> None:
    x, y = a.sample_all(), b.sample_all()
    assert set(x.keys(True, True)) == set(y.keys(True, True))
    for key in x.keys(True, True):
        assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), key
    assert torch.equal(a.sample(7)["index"], b.sample(7)["index"])


@pytest.mark.parametrize("host", [True, False], ids=["host_view", "storage_write"])
def test_load_paths_bit_for_bit(tmp_path, monkeypatch, host):
    rb = _buffer()
    path = xpbank.save(rb, tmp_path / "b")
    if not host:  # the CUDA path, on the CPU: no host views, rows go through write()
        monkeypatch.setattr(TensorStorage, "host_view", lambda self, key: None)
    _same(xpbank.load(path), rb)


def test_prefault_keeps_contents_and_load_is_bit_for_bit():
    storage = TensorStorage(1 << 15, Spec({"x": Field((64,)), "y": Field((), torch.int64)}))  # ~8.5 MB
    block = storage.host_view("x")
    rng = np.random.default_rng(0)
    block[:100] = rng.standard_normal((100, 64), dtype=np.float32)  # already touched
    before = block[:100].copy()
    filler = prefault(storage, storage.spec)
    if filler is None:
        pytest.skip("no madvise on this system")
    filler.join()
    filler.join()  # idempotent
    np.testing.assert_array_equal(block[:100], before)
    storage.host_view("y")[:] = np.arange(1 << 15)  # the whole region stays writable
    assert int(storage.host_view("y")[-1]) == (1 << 15) - 1


def test_prefault_nothing_to_do():
    small = TensorStorage(10, Spec({"x": Field((3,))}))
    assert prefault(small, small.spec) is None  # under 4 MB: faults are cheap
    assert prefault(object(), Spec({"x": Field((3,))})) is None  # no host memory
