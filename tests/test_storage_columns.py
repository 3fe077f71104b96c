"""TensorStorage.columns: whole fields read in one pass, on packed and unpacked storage."""

from __future__ import annotations

import pytest
import torch

from xpbank import Field, Spec, TensorStorage

SPEC = Spec(
    {
        "obs": Field((3,)),
        "count": Field((), torch.int64),
        "reward": Field(()),
        "half": Field((2,), torch.float16),
        "done": Field((), torch.bool),
    }
)


@pytest.mark.parametrize("pack", [True, False])
def test_columns_equal_the_written_fields_and_are_copies(pack: bool) -> None:
    st = TensorStorage(5, SPEC, pack=pack)
    g = torch.Generator().manual_seed(0)
    batch = {
        "obs": torch.randn(5, 3, generator=g),
        "count": torch.arange(5) * 7,
        "reward": torch.randn(5, generator=g),
        "half": torch.randn(5, 2, generator=g).half(),
        "done": torch.tensor([True, False, True, False, False]),
    }
    st.write(slice(0, 5), batch)
    for keys in (["reward", "done"], ["half", "count"], ["done"], list(SPEC)):
        got = st.columns(keys)
        assert list(got) == keys
        for k in keys:
            assert torch.equal(got[k], batch[k]) and got[k].is_contiguous()
    got = st.columns(["reward"])["reward"]
    got += 100.0
    assert torch.equal(st.columns(["reward"])["reward"], batch["reward"])


def test_columns_before_initialize() -> None:
    with pytest.raises(RuntimeError, match="columns before initialize"):
        TensorStorage(2).columns(["x"])
