"""The committed format-version-1 bank (tests/data/bank_v1, made by make_golden_bank.py)
must keep loading, bit for bit, in every later version of xpbank."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import xpbank

GOLDEN = Path(__file__).parent / "data" / "bank_v1"


def _expected(item: torch.Tensor) -> dict[object, torch.Tensor]:
    """What make_golden_bank.py wrote for items ``item`` (brute force, per item)."""
    i = item
    return {
        "obs": torch.stack([i, -i], 1).float(),
        "action": i * 10,
        "terminated": i % 3 == 0,
        "logits": torch.stack([i, i + 1], 1).to(torch.bfloat16),
        "frame": (i[:, None, None] + torch.arange(4).reshape(1, 2, 2)).to(torch.uint8),
        ("next", "obs"): torch.stack([i + 1, -i - 1], 1).float(),
    }


@pytest.mark.parametrize("how", ["load", "open_bank"])
def test_golden_v1_bank_loads_bit_for_bit(how: str, tmp_path: Path) -> None:
    path = shutil.copytree(GOLDEN, tmp_path / "bank_v1")  # open_bank must not touch the original
    rb = xpbank.load(path) if how == "load" else xpbank.open_bank(path, "r")
    assert (len(rb), rb.capacity) == (6, 6)
    assert rb.state_dict(data=False)["ring"] == {"capacity": 6, "next_id": 8, "size": 6}
    got = rb.sample_all()
    assert got["index"].tolist() == [2, 3, 4, 5, 6, 7]  # oldest first; slots 0, 1 hold items 6, 7
    for key, want in _expected(torch.arange(2, 8)).items():
        assert got[key].dtype == want.dtype and torch.equal(got[key], want), key
    # the RNG comes back exactly: the saved buffer was seeded and had not sampled yet
    assert torch.equal(rb.generator.get_state(), torch.Generator().manual_seed(12345).get_state())
    assert rb.config() == {"capacity": 6, "sampler": {"name": "uniform", "config": {}}}


def test_golden_v1_manifest_and_files_as_documented() -> None:
    manifest = json.loads((GOLDEN / "manifest.json").read_text())
    assert (manifest["format"], manifest["format_version"]) == ("xpbank-bank", 1)
    assert manifest["session_id"] == "20261122_060000_0123abcd"
    assert (manifest["size"], manifest["next_id"], manifest["cursor"]) == (6, 8, 2)
    frame = np.load(GOLDEN / "data" / "frame.npy", allow_pickle=False)  # plain NumPy reads it
    assert frame.shape == (6, 2, 2) and frame[0, 0, 0] == 6 and frame[2, 1, 1] == 2 + 3
    logits = np.load(GOLDEN / "data" / "logits.npy", allow_pickle=False)  # bfloat16 held as int16
    assert logits.dtype == np.int16
    assert torch.equal(torch.from_numpy(logits).view(torch.bfloat16)[0], torch.tensor([6.0, 7.0]).bfloat16())
    listed = xpbank.list_banks(GOLDEN.parent)
    assert [(b.path.name, b.size, b.capacity) for b in listed] == [("bank_v1", 6, 6)]


def test_the_banks_guide_example_runs() -> None:
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "banks.md").read_text()
    match = re.search(r"# Banks on disk\n.*?```python\n(.*?)```", text, re.S)
    assert match is not None, "the banks guide has no example"
    scope: dict[str, object] = {}
    exec(compile(match.group(1), "docs/guides/banks.md", "exec"), scope)
    back, both, banks = scope["back"], scope["both"], scope["banks"]
    assert back.sample_by_index(scope["sampled"] - back.sample_by_index(0)["index"])["reward"].sum() == 0
    assert len(both) == 64 + 16 + 64 and [b.size for b in banks] == [80]
    del scope
