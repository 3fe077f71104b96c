"""Write a bank from a stream of batches, never holding more than one batch in memory.

The bank is created empty, opened in place (``open_bank(..., "r+")``, memory-mapped
files) and each batch is appended; one :func:`~xpbank.bank.checkpoint` commits it at
the end. A failure on the way removes the half-written bank.

Example:
    >>> import tempfile, torch, xpbank
    >>> path = tempfile.mkdtemp() + "/b"
    >>> _ = write_bank(path, 4, iter([{"x": torch.zeros(2)}, {"x": torch.ones(2)}]))
    >>> xpbank.load(path).sample_all()["x"].tolist()
    [0.0, 0.0, 1.0, 1.0]
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from xpbank.bank import open_bank, save
from xpbank.errors import BankError, check_positive_int
from xpbank.replay import ReplayBuffer

__all__ = ["write_bank", "check_new_bank_path"]


def check_new_bank_path(path: str | os.PathLike[str], what: str = "output") -> Path:
    """``path`` as a Path, or a :class:`BankError` if something is there already."""
    target = Path(os.fspath(path))
    if target.exists():
        raise BankError(f"{what}: {target} already exists; choose a new path or remove it first")
    return target


def write_bank(
    path: str | os.PathLike[str],
    capacity: int,
    batches: Iterable[Any],
    *,
    progress: Callable[[int], None] | None = None,
    **buffer_options: Any,
) -> Path:
    """A new bank at ``path`` holding every item of ``batches``, in order.

    Args:
        path: must not exist.
        capacity: of the bank (the number of items, to keep them all).
        batches: anything :meth:`~xpbank.ReplayBuffer.extend` takes, one at a time.
        progress: called with each batch's item count after it is written.
        buffer_options: passed to :class:`~xpbank.ReplayBuffer` (``num_envs``, ...).

    Raises:
        BankError: ``path`` exists or cannot be written.
        SpecError: a batch does not match the first one (nothing is left at ``path``).
    """
    target = check_new_bank_path(path)
    save(ReplayBuffer(check_positive_int("capacity", capacity), **buffer_options), target)
    try:
        bank = open_bank(target, "r+")
        for batch in batches:
            written = bank.extend(batch)
            if progress is not None:
                progress(len(written))
        bank.checkpoint()
        del bank
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return target
