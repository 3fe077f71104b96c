"""The ``xpbank`` commands that look into banks: ls, inspect, merge, export, import, plot,
verify, bench. :func:`register` adds them to the typer app of :mod:`xpbank.tools.cli`.

Every command reads banks through :mod:`xpbank.bank` (``list_banks``, ``open_bank``,
``merge_into``, ``save``), opened read-only and memory-mapped, so nothing loads a bank
whole. torch, numpy and the bank layer are imported inside the commands that use them,
so ``xpbank --help`` starts without them. An error (``XpbankError``, ``OSError``,
``ValueError``) prints one line (``error: ...``) on stderr and exits with status 1;
``xpbank --debug CMD`` shows the traceback instead. Progress bars go to stderr, only when it is a terminal.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xpbank.errors import BankError, XpbankError, require
from xpbank.tools.listing import bank_bytes

if TYPE_CHECKING:
    import numpy as np

__all__ = ["register", "DEBUG", "bank_bytes", "verify_bank"]

DEBUG = {"on": False}  # set by ``xpbank --debug``
FORMATS = ("minari", "npz")


def verify_bank(path: str | Path) -> tuple[int, int, int]:
    """Read every file of the bank at ``path`` and check it against its manifest.

    Exactly what :func:`~xpbank.load` checks, without loading: headers, shapes, sizes,
    the data checksums over the rows the ring stores, the state files' checksums.

    Returns ``(files, checksummed, state_files)``: data files checked by shape and
    size, how many of them also by checksum (files modified in place by an ``"r+"``
    bank carry none), and the state files checked (always by checksum).

    Raises:
        CorruptBankError: a file is missing, truncated, or its checksum differs.
        BankError: ``path`` is not a bank.
    """
    from xpbank.bank import open_bank

    buffer = open_bank(path, "r", verify=True)
    return _checked(buffer)


def _checked(buffer: Any) -> tuple[int, int, int]:
    """``(data files, with a checksum, state files)`` of the manifest ``buffer`` was opened with."""
    from xpbank.bank.bank import ORIGINS

    manifest = ORIGINS[buffer].manifest
    data = manifest.data
    return len(data), sum(e.checksum is not None for e in data), len(manifest.state_files)


def _verified_line(buffer: Any, verify: bool) -> str:
    """What opening ``buffer`` checked, for inspect/merge/export."""
    if not verify:
        return "not verified (--no-verify): data checksums not read"
    files, checked, state = _checked(buffer)
    note = "" if checked == files else f" ({files - checked} modified in place: shape and size only)"
    return f"verified: {checked} of {files} data checksum(s) match{note}, {state} state file(s)"


def _console(stream: Any = None) -> Any:
    """A console on ``stream`` (stdout): the terminal's width; into a pipe or a file, a
    message stays one line however long its paths (a log is grepped), tables 160 wide."""
    console_cls = require("rich.console", "cli").Console
    file = stream or sys.stdout
    tty = file.isatty()
    return console_cls(file=file, width=None if tty else 160, soft_wrap=not tty)


class _Progress:
    """A tqdm bar on stderr, shown only when stderr is a terminal."""

    def __init__(self, total: int, desc: str, unit: str = "item"):
        tqdm = require("tqdm", "cli").tqdm
        self.bar = tqdm(total=total, desc=desc, unit=unit, disable=not sys.stderr.isatty(), leave=False)

    def __call__(self, n: int) -> None:
        self.bar.update(n)

    def __enter__(self) -> _Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.close()


def _guarded(fn: Callable[..., None]) -> Callable[..., None]:
    """Turn xpbank and OS errors into one line on stderr and exit status 1 (not with --debug)."""
    typer = require("typer", "cli")

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (XpbankError, OSError, ValueError) as exc:
            if DEBUG["on"]:
                raise
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from None

    return run


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _distribution(values: np.ndarray) -> str:
    import numpy as np

    if values.size == 0:
        return "-"
    q = np.percentile(values, [0, 50, 100])
    spread = f"(min {_fmt(q[0])}, median {_fmt(q[1])}, max {_fmt(q[2])})"
    return f"mean {_fmt(values.mean())} ± {_fmt(values.std())}  {spread}"


def cmd_inspect(bank: Path, chunk: int, verify: bool = True) -> None:
    """Spec, size, per-field mean/std/min/max (read in chunks) and the episodes found."""
    import numpy as np

    from xpbank.bank import open_bank
    from xpbank.spec.spec import key_str
    from xpbank.tools.stats import episode_stats, field_stats

    table_cls = require("rich.table", "cli").Table
    buffer = open_bank(bank, "r", verify=verify)
    console = _console()
    config = buffer.config()
    console.print(
        f"[bold]{bank}[/bold]: {len(buffer):,} of {buffer.capacity:,} items, sampler "
        f"{config['sampler']['name']}, {bank_bytes(bank):,} bytes on disk"
    )
    console.print(_verified_line(buffer, verify))
    with _Progress(len(buffer), "stats") as bar:
        stats = field_stats(buffer, chunk=chunk, progress=bar)
    table = table_cls(title="fields")
    for col in ("field", "shape", "dtype", "mean", "std", "min", "max"):
        table.add_column(col, justify="left" if col in ("field", "dtype") else "right")
    spec = buffer.spec
    for key, m in stats.items():
        field = spec[key]  # type: ignore[index]
        dtype = str(field.dtype).removeprefix("torch.")
        table.add_row(
            key_str(key), str(tuple(field.shape)), dtype, *(_fmt(v) for v in (m.mean, m.std, m.min, m.max))
        )
    console.print(table)
    has_reward = spec is not None and "reward" in spec
    eps = episode_stats(buffer, reward="reward" if has_reward else None, chunk=chunk)
    ended = len(eps.lengths)
    console.print(
        f"episodes: {ended} complete ({int(eps.terminated.sum())} terminated, "
        f"{ended - int(eps.terminated.sum())} truncated), "
        f"{eps.partial} partial (cut by the wrap or unfinished)"
    )
    console.print(f"  return: {_distribution(eps.returns)}")
    console.print(f"  length: {_distribution(eps.lengths.astype(np.float64))}")


def cmd_merge(a: Path, b: Path, out: Path, capacity: int | None, verify: bool = True) -> None:
    """Merge banks A and B (A's items, then B's) into a new bank OUT, checking them first."""
    from xpbank.bank import open_bank
    from xpbank.tools.import_bank import merge_banks

    path = merge_banks(a, b, out, capacity=capacity, verify=verify)
    buffer = open_bank(path, "r")
    checked = "checksums of both verified" if verify else "not verified (--no-verify)"
    _console().print(f"merged {a} + {b} -> {path}: {len(buffer):,} of {buffer.capacity:,} items; {checked}")


def _check_format(value: str, option: str) -> str:
    if value not in FORMATS:
        raise BankError(f"{option}: expected one of {list(FORMATS)}, got {value!r}")
    return value


def cmd_export(bank: Path, to: str, out: Path, verify: bool = True) -> None:
    """Export BANK to OUT as a Minari dataset directory or an .npz archive (streaming),
    checking its checksums first."""
    from xpbank.bank import open_bank

    _check_format(to, "--to")
    buffer = open_bank(bank, "r", verify=verify)
    with _Progress(len(buffer), f"export {to}") as bar:
        if to == "npz":
            from xpbank.tools.npz import export_npz

            path = export_npz(buffer, out, progress=bar)
        else:
            from xpbank.integrations.minari import export_minari

            path = export_minari(buffer, out, progress=bar)
    _console().print(
        f"exported {bank} ({len(buffer):,} items) to {to}: {path}; {_verified_line(buffer, verify)}"
    )


def cmd_import(src: Path, fmt: str, out: Path, capacity: int | None) -> None:
    """Import SRC (a Minari dataset directory or an .npz) into a new bank OUT (streaming)."""
    from xpbank.bank import open_bank

    _check_format(fmt, "--from")
    with _Progress(0, f"import {fmt}") as bar:
        if fmt == "npz":
            from xpbank.tools.npz import import_npz

            path = import_npz(src, out, capacity=capacity, progress=bar)
        else:
            from xpbank.integrations.minari import import_minari

            path = import_minari(src, out, capacity=capacity, progress=bar)
    buffer = open_bank(path, "r")
    _console().print(f"imported {src} into {path}: {len(buffer):,} of {buffer.capacity:,} items")


def cmd_plot(bank: Path, out: Path) -> None:
    """Plot episode returns and lengths, the reward histogram and priorities to a PNG."""
    from xpbank.bank import open_bank
    from xpbank.tools.plot import plot_bank

    path = plot_bank(open_bank(bank, "r"), out, title=f"{bank.name}")
    _console().print(f"wrote {path}")


def cmd_verify(bank: Path) -> None:
    """Check every file of BANK against its manifest (shapes, sizes, checksums); exit 1 if corrupt."""
    files, checked, state = verify_bank(bank)
    note = "" if checked == files else f" ({files - checked} modified in place: shape and size only)"
    _console().print(
        f"OK {bank}: {files} data file(s), {checked} checksum(s) match{note}; "
        f"{state} state file(s), {state} checksum(s) match"
    )


def cmd_bench(quick: bool) -> None:
    """The replay benchmark in short form (xpbank only, one thread)."""
    from xpbank.tools.quickbench import run_quickbench

    table_cls = require("rich.table", "cli").Table
    capacity = 10_000 if quick else 100_000
    rows = run_quickbench(capacity=capacity, blocks=3 if quick else 5, ops=20 if quick else 50)
    table = table_cls(
        title=f"xpbank replay, {capacity:,} items, 1 thread (full comparison: benchmarks/bench_replay.py)"
    )
    for col in ("operation", "µs per call", "items/s"):
        table.add_column(col, justify="left" if col == "operation" else "right")
    for r in rows:
        table.add_row(r.name, f"{r.us_per_call:.1f}", f"{r.items_per_s:,.0f}")
    _console().print(table)


def register(app: Any, typer: Any) -> None:
    """Add the bank commands to ``app`` (a ``typer.Typer``)."""

    bank_arg = typer.Argument(..., help="a bank directory")
    verify_opt = typer.Option(True, "--verify/--no-verify", help="check the bank's checksums first (default)")
    first_arg = typer.Argument(..., help="the first bank (its items come first)")
    second_arg = typer.Argument(..., help="the second bank")

    @app.command("ls")
    @_guarded
    def ls(
        directory: Path = typer.Argument(Path("."), help="where to look for banks"),  # noqa: B008
        long: bool = typer.Option(False, "-l", "--long", help="every manifest entry, not a table"),
    ) -> None:
        """List the banks in DIRECTORY: items, fields, last update, size; corrupt ones apart."""
        from xpbank.tools.listing import cmd_ls

        cmd_ls(directory, long)

    @app.command("inspect")
    @_guarded
    def inspect(
        bank: Path = bank_arg,
        chunk: int = typer.Option(65_536, "--chunk", min=1, help="items read per step"),
        verify: bool = verify_opt,
    ) -> None:
        """Spec, size, per-field mean/std/min/max (in chunks) and the episodes' returns and lengths."""
        cmd_inspect(bank, chunk, verify)

    @app.command("merge")
    @_guarded
    def merge(
        a: Path = first_arg,
        b: Path = second_arg,
        out: Path = typer.Option(..., "-o", "--out", help="the new bank"),  # noqa: B008
        capacity: int | None = typer.Option(None, "--capacity", min=1, help="default: both capacities"),
        verify: bool = verify_opt,
    ) -> None:
        """Merge banks A and B (A's items, then B's) into a new bank, checking both first."""
        cmd_merge(a, b, out, capacity, verify)

    @app.command("export")
    @_guarded
    def export(
        bank: Path = bank_arg,
        out: Path = typer.Argument(..., help="the new dataset directory (minari) or .npz file"),  # noqa: B008
        to: str = typer.Option(..., "--to", help="minari or npz"),
        verify: bool = verify_opt,
    ) -> None:
        """Export a bank as a Minari dataset or an .npz archive, streaming, checking it first."""
        cmd_export(bank, to, out, verify)

    @app.command("import")
    @_guarded
    def import_(
        src: Path = typer.Argument(..., help="a Minari dataset directory or an .npz file"),  # noqa: B008
        fmt: str = typer.Option(..., "--from", help="minari or npz"),
        out: Path = typer.Option(..., "-o", "--out", help="the new bank"),  # noqa: B008
        capacity: int | None = typer.Option(None, "--capacity", min=1, help="default: the number of items"),
    ) -> None:
        """Import a Minari dataset or an .npz archive into a new bank, streaming."""
        cmd_import(src, fmt, out, capacity)

    @app.command("plot")
    @_guarded
    def plot(
        bank: Path = bank_arg,
        out: Path = typer.Option(Path("plot.png"), "-o", "--out", help="the PNG to write"),  # noqa: B008
    ) -> None:
        """Episode returns and lengths over time, reward histogram, priorities when present."""
        cmd_plot(bank, out)

    @app.command("verify")
    @_guarded
    def verify(bank: Path = bank_arg) -> None:
        """Check a bank's files against its manifest and checksums; exit status 1 if corrupt."""
        cmd_verify(bank)

    @app.command("bench")
    @_guarded
    def bench(quick: bool = typer.Option(False, "--quick", help="10k items, fewer blocks: seconds")) -> None:
        """The replay benchmark in short form (xpbank only, one thread)."""
        cmd_bench(quick)
