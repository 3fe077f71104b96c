"""Caller metadata in a bank's manifest: kept by save/load/checkpoint, checked at save."""

from __future__ import annotations

import pytest
import torch

import xpbank
from xpbank.bank import bank_metadata, open_bank


def _rb() -> xpbank.ReplayBuffer:
    rb = xpbank.ReplayBuffer(4)
    rb.extend({"x": torch.arange(3.0)})
    return rb


def test_metadata_round_trips_and_is_inherited(tmp_path):
    meta = {"max_size": None, "infos": [{"a": 1}, None], "nested": {"k": [1.5, "s", True]}}
    path = xpbank.save(_rb(), tmp_path / "b", metadata=meta)
    back = xpbank.load(path)
    assert bank_metadata(back) == meta
    again = xpbank.load(xpbank.save(back, tmp_path / "c"))  # inherited from the origin
    assert bank_metadata(again) == meta
    plain = xpbank.load(xpbank.save(_rb(), tmp_path / "d"))
    assert bank_metadata(plain) == {}


def test_metadata_survives_checkpoint(tmp_path):
    path = xpbank.save(_rb(), tmp_path / "b", metadata={"owner": "me"})
    opened = open_bank(path, "r+")
    opened.extend({"x": torch.ones(1)})
    opened.checkpoint()
    back = xpbank.load(path)
    assert bank_metadata(back) == {"owner": "me"} and len(back) == 4


@pytest.mark.parametrize(
    ("meta", "match"),
    [
        ({"t": object()}, "metadata: must be JSON-able"),
        ({"t": float("nan")}, "metadata: must be JSON-able"),
        ({"t": (1, 2)}, "does not survive JSON unchanged"),
        ([1, 2], "metadata: expected a dict, got list"),
    ],
)
def test_bad_metadata_refused_and_nothing_written(tmp_path, meta, match):
    with pytest.raises(xpbank.BankError, match=match):
        xpbank.save(_rb(), tmp_path / "b", metadata=meta)
    assert not (tmp_path / "b").exists()
