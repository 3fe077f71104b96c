"""TensorStorage.gather_host: every field of rows given as a NumPy index, as gather reads them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import make_batch
from xpbank import Field, Spec, TensorStorage


@pytest.mark.parametrize("pack", [True, False], ids=["packed", "per-field"])
def test_gather_host_equals_gather_in_spec_order(rich_spec, pack):
    # a wide image (4 KB rows: read field by field) beside the narrow packed fields
    spec = Spec({**dict(rich_spec.items()), "pixels": Field((4, 32, 32), torch.uint8)})
    st = TensorStorage(9, spec, pack=pack)
    batch = make_batch(spec, 9, start=3)
    st.write(slice(0, 9), batch)
    rows = np.array([8, 0, 4, 4, 2], dtype=np.int64)
    got = st.gather_host(rows)
    want = st.gather(torch.from_numpy(rows))
    assert sorted(map(str, got)) == sorted(map(str, spec))  # every field (in layout order)
    for key, value in got.items():
        assert value.dtype == spec[key].dtype and value.shape == (5, *spec[key].shape)
        assert torch.equal(value, want[key]) and torch.equal(value, batch[key][rows])
    for value in got.values():  # fresh tensors: changing them leaves the storage alone
        value.zero_()
    for key, value in st.gather_host(rows).items():
        assert torch.equal(value, batch[key][rows])
