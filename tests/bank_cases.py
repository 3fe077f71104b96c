"""Banks to break, shared by the bank tests (``test_bank_*.py``, ``tests/adversarial``).

:func:`small_bank` saves a small transition bank (the ``bank`` fixture of
``conftest.py``: capacity 8, 11 items, so it has wrapped); :func:`edit_manifest`
rewrites a bank's ``manifest.json`` through a function, keeping the JSON valid (the
checksums of the data files are left as they were).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xpbank
from helpers import make_batch, transition_spec
from xpbank import ReplayBuffer

__all__ = ["edit_manifest", "small_bank"]


def small_bank(path: Path, capacity: int = 8, items: int = 11, **options: Any) -> Path:
    """Save a transition buffer of ``capacity`` holding items ``0 .. items-1`` at ``path``."""
    spec = transition_spec()
    rb = ReplayBuffer(capacity, spec, seed=0, **options)
    rb.extend(make_batch(spec, items))
    return xpbank.save(rb, path)


def edit_manifest(bank: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Apply ``edit`` to the bank's parsed ``manifest.json`` and write it back."""
    manifest = json.loads((bank / "manifest.json").read_text())
    edit(manifest)
    (bank / "manifest.json").write_text(json.dumps(manifest))
