"""Banks of experience on disk: save, load, open lazily, checkpoint, list, merge.

A bank is a directory of plain ``.npy`` files and a JSON manifest (see
``docs/bank-format.md``): safe to open (nothing is unpickled), memory-mappable, and
written so that a crash at any moment leaves a whole bank.

Modules: :mod:`~xpbank.bank.format` (bytes and files), :mod:`~xpbank.bank.manifest`
(the manifest, checked entry by entry in :mod:`~xpbank.bank.manifest_check`),
:mod:`~xpbank.bank.codec` (the pickle-free state codec), :mod:`~xpbank.bank.snapshot`
(consistent reads), :mod:`~xpbank.bank.bank` (save, load, open_bank, checkpoint),
:mod:`~xpbank.bank.rebuild` (the buffer a manifest describes, its options and state
checked), :mod:`~xpbank.bank.ops` (list_banks, merge), :mod:`~xpbank.bank.summary`
(what ``list_banks`` and ``xpbank ls`` say about a bank).

The names below load on first use, so ``xpbank ls`` can read manifests
(:mod:`~xpbank.bank.summary`) without importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from xpbank.bank.bank import bank_metadata, bank_of, load, save
    from xpbank.bank.manifest import new_session_id
    from xpbank.bank.opened import checkpoint, open_bank
    from xpbank.bank.ops import list_banks, merge, merge_into
    from xpbank.bank.summary import BankSummary

_WHERE = {
    "save": "bank",
    "load": "bank",
    "bank_of": "bank",
    "bank_metadata": "bank",
    "open_bank": "opened",
    "checkpoint": "opened",
    "list_banks": "ops",
    "merge": "ops",
    "merge_into": "ops",
    "BankSummary": "summary",
    "new_session_id": "manifest",
}

__all__ = [
    "save",
    "load",
    "open_bank",
    "checkpoint",
    "bank_of",
    "bank_metadata",
    "list_banks",
    "merge",
    "merge_into",
    "BankSummary",
    "new_session_id",
]


def __getattr__(name: str) -> Any:
    """Import the module that defines ``name`` on first use."""
    if name in _WHERE:
        value = getattr(importlib.import_module(f"xpbank.bank.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'xpbank.bank' has no attribute {name!r}")
