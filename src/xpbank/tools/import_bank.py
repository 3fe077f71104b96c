"""Write a bank from a stream of batches, never holding more than one batch in memory.

A bank is created empty in a hidden sibling directory, opened in place
(``open_bank(..., "r+")``, memory-mapped files) and each batch is appended; it is then
saved to ``path`` with :func:`~xpbank.save` (streaming from the mapped files, with
checksums, which a bank modified in place does not keep) and the sibling removed. A
failure on the way leaves nothing at ``path``. :func:`merge_banks` does the same with
:func:`~xpbank.bank.merge_into`.

Example:
    >>> import tempfile, torch, xpbank
    >>> path = tempfile.mkdtemp() + "/b"
    >>> _ = write_bank(path, 4, iter([{"x": torch.zeros(2)}, {"x": torch.ones(2)}]))
    >>> xpbank.load(path).sample_all()["x"].tolist()
    [0.0, 0.0, 1.0, 1.0]
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from xpbank.bank import merge_into, open_bank, save
from xpbank.bank.format import remove_dead_temporaries
from xpbank.bank.ops import check_same_spec
from xpbank.errors import BankError, check_positive_int
from xpbank.replay.buffer import ReplayBuffer
from xpbank.sampler import make_sampler, sampler_config

__all__ = ["write_bank", "merge_banks", "check_new_bank_path"]


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
    empty = ReplayBuffer(check_positive_int("capacity", capacity), **buffer_options)

    def fill(bank: ReplayBuffer) -> None:
        for batch in batches:
            written = bank.extend(batch)
            if progress is not None:
                progress(len(written))

    return _build(target, empty, fill)


def merge_banks(
    a: str | os.PathLike[str],
    b: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    capacity: int | None = None,
    verify: bool = True,
) -> Path:
    """A new bank at ``out`` with ``a``'s items, then ``b``'s: :func:`~xpbank.merge` on disk.

    Neither bank is loaded whole: both are opened read-only and copied in chunks into
    the new bank's mapped files, so banks larger than memory merge. The result has
    ``a``'s sampler kind and capacity ``a.capacity + b.capacity`` unless given.
    ``verify`` (default): both banks' checksums are checked before anything is copied,
    so a damaged bank is never laundered into one with fresh checksums.

    Raises:
        SpecError: the specs differ (naming the fields); nothing is written.
        BankError: ``out`` exists; ``a`` or ``b`` is not a bank.
        CorruptBankError: a file of ``a`` or ``b`` is damaged (naming it); nothing is written.
    """
    target = check_new_bank_path(out)
    first, second = open_bank(a, "r", verify=verify), open_bank(b, "r", verify=verify)
    check_same_spec(first.spec, second.spec, ("a", "b"))
    size = check_positive_int(
        "capacity", capacity if capacity is not None else first.capacity + second.capacity
    )
    empty = ReplayBuffer(size, first.spec or second.spec, sampler=make_sampler(sampler_config(first.sampler)))

    def fill(bank: ReplayBuffer) -> None:
        merge_into(bank, first)
        merge_into(bank, second)

    return _build(target, empty, fill)


def _build(target: Path, empty: ReplayBuffer, fill: Callable[[ReplayBuffer], None]) -> Path:
    tmp = target.parent / f".{target.name}.import-{os.getpid()}-{secrets.token_hex(4)}"
    remove_dead_temporaries(target)  # of merges and imports killed before they finished
    try:
        save(empty, tmp)
        bank = open_bank(tmp, "r+")
        fill(bank)
        bank.checkpoint()
        del bank
        save(open_bank(tmp, "r"), target)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
