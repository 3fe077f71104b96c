"""Banks to break, shared by the bank tests (``test_bank_*.py``, ``tests/adversarial``).

:func:`small_bank` saves a small transition bank (the ``bank`` fixture of
``conftest.py``: capacity 8, 11 items, so it has wrapped); :func:`edit_manifest`
rewrites a bank's ``manifest.json`` through a function, keeping the JSON valid (the
checksums of the data files are left as they were). :func:`kill_at_random_moments` is
the machinery of the SIGKILL tests (save, checkpoint, merge).
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch

import xpbank
from helpers import make_batch, transition_spec
from xpbank import ReplayBuffer

__all__ = ["edit_manifest", "fork_child", "kill_at_random_moments", "small_bank"]

T = TypeVar("T")


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


def fork_child(target: Callable[[], None]) -> int:
    """Run ``target`` in a forked child (one torch thread) that never returns into pytest."""
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)  # OpenMP's pool does not survive fork: a parallel op would hang
            target()
        finally:
            os._exit(0)
    return pid


def kill_at_random_moments(
    work: Callable[[], None],
    outcome: Callable[[], T],
    *,
    step_s: float,
    seed: int,
    done: Callable[[list[T]], bool],
    kills: int = 24,
    most: int = 80,
) -> list[T]:
    """SIGKILL a child running ``work`` after a random delay in ``[0, 3 * step_s)`` (seeded),
    ``kills`` times and more (up to ``most``) until ``done(outcomes)``: kills must land on
    both sides of a commit even when a loaded machine slows the child down (past
    ``kills``, the delays stretch by 1.2x a kill, up to 8x). After each kill,
    ``outcome()`` checks what was left and says which side it was; returns them all."""
    rng = random.Random(seed)
    seen: list[T] = []
    while len(seen) < kills or (not done(seen) and len(seen) < most):
        stretch = min(8.0, 1.2 ** max(0, len(seen) - kills))
        pid = fork_child(work)
        time.sleep(rng.uniform(0, 3 * step_s * stretch))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        seen.append(outcome())
    return seen
