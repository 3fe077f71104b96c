"""Wide rows (images) are gathered field by field from the packed block: same bytes back,
contiguous fields; and every storage reports the bytes it holds."""

from __future__ import annotations

import pytest
import torch

from xpbank import Field, FrameStorage, MemmapStorage, Spec, TensorStorage
from xpbank.storage.tensor import _WIDE_ROW_BYTES

SPEC = Spec(
    {
        "obs": Field((4, 32, 32), torch.uint8),
        "logits": Field((6,), torch.bfloat16),
        "action": Field((), torch.int64),
        "done": Field((), torch.bool),
        ("next", "obs"): Field((4, 32, 32), torch.uint8),
    }
)


def _data(n: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    out = {}
    for key, field in SPEC.items():
        values = torch.randint(0, 200, (n, *field.shape), generator=gen)
        out[key] = values.to(field.dtype)
    return out


@pytest.mark.parametrize("keys", [None, ["obs"], ["action", "logits"], [("next", "obs"), "done"]])
def test_wide_rows_gather_what_was_written(keys) -> None:
    st = TensorStorage(50, SPEC)
    assert st._blocks[0].row_bytes >= _WIDE_ROW_BYTES  # the wide-row path
    data = _data(50)
    st.write(slice(0, 50), data)
    idx = torch.tensor([3, 49, 0, 3, 17])
    got = st.gather(idx, keys)
    assert list(got) == (list(SPEC) if keys is None else keys)
    for key, value in got.items():
        assert value.dtype == SPEC[key].dtype
        assert torch.equal(value, data[key].index_select(0, idx))
        assert value.is_contiguous()
    got["obs" if "obs" in got else next(iter(got))].zero_()  # a fresh copy: storage unchanged
    assert torch.equal(st.gather(idx, ["obs"])["obs"], data["obs"].index_select(0, idx))


def test_every_storage_reports_nbytes(tmp_path) -> None:
    row = sum(f.numel * f.dtype.itemsize for f in SPEC.values())
    assert TensorStorage(10, SPEC).nbytes() >= 10 * row
    assert TensorStorage(10, SPEC, pack=False).nbytes() >= 10 * row
    assert MemmapStorage(10, tmp_path / "m", SPEC).nbytes() == 10 * row
    frames = FrameStorage(10, SPEC).nbytes()
    assert 10 * 32 * 32 < frames < 10 * row / 4
    assert FrameStorage(10).nbytes() == 0  # nothing laid out yet
