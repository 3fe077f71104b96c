"""Smoke test of an installed xpbank (run from outside the source tree, in a clean venv):
import, a buffer, a bank round trip, the command line."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

import xpbank

here = Path(xpbank.__file__).resolve()
assert "site-packages" in here.parts, f"xpbank imported from {here}, not from the installed wheel"
rb = xpbank.ReplayBuffer(1_000, seed=0)
rb.extend({"obs": torch.randn(64, 4), "reward": torch.ones(64)})
assert rb.sample(8)["obs"].shape == (8, 4)
with tempfile.TemporaryDirectory() as root:
    path = xpbank.save(rb, Path(root) / "bank")
    back = xpbank.load(path)
    assert torch.equal(back.sample(16)["index"], rb.sample(16)["index"]), "the bank samples otherwise"
    assert [b.size for b in xpbank.list_banks(root)] == [64]
    cli = shutil.which("xpbank", path=str(Path(sys.executable).parent))
    assert cli is not None, "the xpbank console script is not installed"
    help_text = subprocess.run([cli, "--help"], capture_output=True, text=True, check=True).stdout
    assert "Usage:" in help_text and "inspect" in help_text
    listing = subprocess.run([cli, "ls", root], capture_output=True, text=True, check=True).stdout
    assert "1 bank(s)" in listing, listing
print(f"smoke test passed: xpbank {xpbank.__version__} from {here.parent}")
