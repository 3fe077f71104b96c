"""Banks of experience on disk: save, load, open lazily, checkpoint, list, merge.

A bank is a directory of plain ``.npy`` files and a JSON manifest (see
``docs/bank-format.md``): safe to open (nothing is unpickled), memory-mappable, and
written so that a crash at any moment leaves a whole bank.

Modules: :mod:`~xpbank.bank.format` (bytes and files), :mod:`~xpbank.bank.manifest`
(the manifest, checked entry by entry), :mod:`~xpbank.bank.codec` (the pickle-free
state codec), :mod:`~xpbank.bank.snapshot` (consistent reads),
:mod:`~xpbank.bank.bank` (save, load, open_bank, checkpoint), :mod:`~xpbank.bank.rebuild`
(the buffer a manifest describes, its options and state checked), :mod:`~xpbank.bank.ops`
(list_banks, merge).
"""

from __future__ import annotations

from xpbank.bank.bank import bank_metadata, bank_of, load, save
from xpbank.bank.manifest import new_session_id
from xpbank.bank.opened import checkpoint, open_bank
from xpbank.bank.ops import BankSummary, list_banks, merge, merge_into

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
