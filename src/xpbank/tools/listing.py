"""``xpbank ls``: the banks in a directory as a table that fits 80 columns.

One row per bank (name, items/capacity, a compact field summary, last update, size on
disk); banks whose manifest is corrupt follow in their own section, one line each with
the reason. ``--long`` prints every manifest entry :func:`~xpbank.list_banks` returns
(session id, created, the full spec) instead of the table. Manifests are read without
torch (:func:`summarize`), so ``ls`` starts in a fraction of a second.

Example:
    >>> compact_spec("{'obs': (*, 4) float32, 'next.obs': (*, 4) float32, 'action': (*) int64}")
    'obs[4] f32, next.obs[4] f32, action i64'
    >>> human_bytes(12_345_678)
    '11.8 MiB'
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpbank.errors import require

if TYPE_CHECKING:
    from xpbank.bank.summary import BankSummary

__all__ = ["cmd_ls", "compact_spec", "human_bytes", "bank_bytes", "summarize"]

# one field of a Spec's repr: 'next.obs': (*, 4) float32
_FIELD = re.compile(r"'(?P<key>(?:[^'\\]|\\.)*)': \(\*(?:, (?P<shape>[^)]*))?\) (?P<dtype>\w+)")
_SHORT = {"float": "f", "int": "i", "uint": "u", "bool": "bool", "bfloat": "bf", "complex": "c"}


def compact_spec(spec: str) -> str:
    """A Spec's repr as ``key[shape] dtype`` items (``float32`` as ``f32``)."""
    fields = []
    for m in _FIELD.finditer(spec):
        kind, bits = re.fullmatch(r"([a-z]+?)(\d*)", m["dtype"]).groups()  # type: ignore[union-attr]
        dtype = _SHORT.get(kind, kind) + bits
        shape = f"[{m['shape'].replace(' ', '')}]" if m["shape"] else ""
        fields.append(f"{m['key']}{shape} {dtype}")
    return ", ".join(fields) if fields else spec.strip("{}") or "(no fields)"


def bank_bytes(path: Path) -> int:
    """Bytes on disk of every file under ``path``."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _cell(text: str, limit: int = 120) -> Any:
    """A table cell for a string read from a bank: one line, at most ``limit`` characters,
    never read as markup (so a long or hostile manifest string costs linear time)."""
    text_cls = require("rich.text", "cli").Text
    short = text[: limit + 1]
    short = "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in short)
    if len(text) > limit or len(short) > limit:
        short = short[: limit - 1] + "…"
    return text_cls(short)


def human_bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB, GiB or TiB with three significant digits."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024
    return f"{value:.3g} TiB"


def _short_time(stamp: str) -> str:
    """``2026-11-25T16:27:55.9+00:00`` -> ``2026-11-25 16:27`` (UTC as written)."""
    return stamp[:16].replace("T", " ") if len(stamp) >= 16 else stamp


def summarize(bank: Path) -> BankSummary:
    """What :func:`~xpbank.list_banks` says about ``bank``, without torch where the quick
    check can tell (:func:`~xpbank.bank.summary.quick_summary`), else by the full check."""
    from xpbank.bank.summary import quick_summary

    summary = quick_summary(bank)
    if summary is None:
        from xpbank.bank.ops import bank_summary  # torch, NumPy

        summary = bank_summary(bank)
    return summary


def cmd_ls(directory: Path, long: bool = False, console: Any = None) -> None:
    """Print the banks in ``directory`` (see the module docstring)."""
    from xpbank.bank.summary import list_summaries

    rich_table = require("rich.table", "cli")
    if console is None:  # the terminal's width; 80 columns into a pipe or a file
        console = require("rich.console", "cli").Console(width=None if sys.stdout.isatty() else 80)
    banks = list_summaries(directory, summarize)
    good = [b for b in banks if b.error is None]
    bad = [b for b in banks if b.error is not None]
    console.print(f"{len(good)} bank(s) in {directory}" + (f", {len(bad)} corrupt" if bad else ""))
    if long:
        for b in good:
            console.print(_cell(b.path.name, 200), style="bold")
            for name in ("session_id", "created", "updated"):
                console.print(_cell(f"  {name}: {getattr(b, name)}", 200))
            console.print(f"  items: {b.size:,} of {b.capacity:,}; on disk: {bank_bytes(b.path):,} bytes")
            console.print(_cell(f"  fields: {b.spec}", 2_000))
    elif good:
        rows = [
            (b.path.name, f"{b.size:,}/{b.capacity:,}", compact_spec(b.spec), _short_time(b.updated),
             human_bytes(bank_bytes(b.path)))
            for b in good
        ]  # fmt: skip
        titles = ("bank", "items", "fields", "updated (UTC)", "on disk")
        widths = [max(len(t), *(len(r[i]) for r in rows)) for i, t in enumerate(titles)]
        widths[0] = min(widths[0], 24)
        # the fields column takes what the others leave of the console (three characters a gap)
        rest = console.width - sum(widths) + widths[2] - 3 * (len(titles) - 1)
        widths[2] = max(12, min(widths[2], rest))
        table = rich_table.Table(box=rich_table.box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
        for title, width in zip(titles, widths, strict=True):
            right = title in ("items", "on disk")
            table.add_column(title, justify="right" if right else "left", width=width, no_wrap=True)
        for name, items, fields, updated, size in rows:
            table.add_row(_cell(name, widths[0]), items, _cell(fields, widths[2]), updated, size)
        console.print(table)
    if bad:
        console.print("corrupt (`xpbank verify BANK` for details):", style="red")
        for b in bad:
            reason = str(b.error).replace(f"{b.path}{os.sep}", "")  # the name says where
            console.print(_cell(f"  {b.path.name}: {reason}", 400), overflow="ellipsis", no_wrap=True)
