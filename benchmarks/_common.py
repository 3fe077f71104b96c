"""Shared timing and reporting helpers for the benchmarks (no timing asserts anywhere)."""

from __future__ import annotations

import functools
import gc
import io
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
_clock = [time.perf_counter]  # what the timers below read (set_clock)


def set_clock(name: str) -> None:
    """Time with ``"wall"`` (``perf_counter``, the default) or ``"thread"`` (this thread's
    CPU time, ``thread_time``: leaves out the time the thread waits while other processes
    run, the main effect of a loaded machine; cache and memory contention stay in)."""
    _clock[0] = CLOCKS[name]


def clock() -> float:
    """The chosen clock's reading, in seconds."""
    return _clock[0]()


def time_calls(fn: Callable[[Any], object], inputs: Sequence[Any], n: int) -> float:
    """Seconds for ``n`` calls of ``fn``, cycling through the pre-made ``inputs``."""
    k = len(inputs)
    start = clock()
    for i in range(n):
        fn(inputs[i % k])
    return clock() - start


def best_of(fn: Callable[[int], object], calls: int, chunks: int) -> float:
    """Seconds per call: the fastest of ``chunks`` blocks of ``calls`` calls (warmed up)."""
    for i in range(min(calls, 20)):
        fn(i)
    best = float("inf")
    for _ in range(chunks):
        start = clock()
        for i in range(calls):
            fn(i)
        best = min(best, (clock() - start) / calls)
    return best


def time_repeat(fn: Callable[[], object], n: int) -> float:
    """Seconds for ``n`` calls of the argument-less ``fn``."""
    start = clock()
    for _ in range(n):
        fn()
    return clock() - start


def interleaved_us(
    fns: dict[str, Callable[[int], object]],
    calls: int,
    rounds: int,
    warm: int = 0,
    clock: Callable[[], float] = time.thread_time,
) -> dict[str, list[float]]:
    """µs per call (``clock``: this thread's CPU time unless given) of every block of
    ``calls`` calls of each ``fn(i)``, in ``rounds`` interleaved rounds (every other
    round in reverse order); ``warm`` untimed calls of each first."""
    out: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        for i in range(warm):
            fn(i)
    names = list(fns)
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            fn = fns[name]
            c = clock()
            for i in range(calls):
                fn(i)
            out[name].append((clock() - c) / calls * 1e6)
    return out


def fastest_block(fn: Callable[[], object], calls: int, chunks: int) -> float:
    """Seconds per call of the argument-less ``fn``: the fastest of ``chunks`` blocks of
    ``calls`` calls, garbage collected before each block."""
    times = []
    for _ in range(chunks):
        settle()
        times.append(time_repeat(fn, calls) / calls)
    return min(times)


def phase_timer(acc: dict[str, int], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to add its thread CPU time (ns) to ``acc[label]`` (a profile's phase)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] = acc.get(label, 0) + time.thread_time_ns() - start

    return run


def time_phases(patches: Sequence[tuple[Any, str, str]], acc: dict[str, int]) -> None:
    """Wrap each ``(owner, attribute, label)`` of ``patches`` with :func:`phase_timer`: the
    library's own functions (module attributes, methods, instances), no copy of their code."""
    for owner, name, label in patches:
        setattr(owner, name, phase_timer(acc, label, getattr(owner, name)))


def phase_medians(
    block: Callable[[], object], per: int, acc: dict[str, int], repeats: int
) -> dict[str, float]:
    """µs per call of each timed phase: the median over ``repeats`` runs of ``block`` (which
    makes ``per`` calls); a phase a run did not take counts 0 there."""
    runs = []
    for _ in range(repeats):
        acc.clear()
        block()
        runs.append({k: v / per / 1e3 for k, v in acc.items()})
    return {k: statistics.median(r.get(k, 0.0) for r in runs) for k in set().union(*runs)}


def print_phases(table: Sequence[tuple[str, int]], found: dict[str, float], width: int = 60) -> None:
    """Each ``(label, depth)`` of ``table`` with its time, indented by depth; a phase the
    calls did not take (absent or 0) is left out."""
    for label, depth in table:
        if found.get(label):
            print(f"{'  ' * depth}{label:<{width - 2 * depth}} {found[label]:8.1f}")


def freeze_heap() -> None:
    """Move every object alive now (imported modules ...) out of the collector's sight.

    With torch, TorchRL and SB3 imported a full ``gc.collect()`` takes ~0.1 s; after
    this it only walks what the benchmark itself made.
    """
    gc.collect()
    gc.freeze()


def settle() -> None:
    """Collect garbage so a timed phase does not pay for the previous one's."""
    gc.collect()


def median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def fmt_rate(per_s: float) -> str:
    """Items per second as ``12.3 M/s`` / ``850 k/s``."""
    if per_s >= 1e6:
        return f"{per_s / 1e6:.2f} M/s"
    if per_s >= 1e3:
        return f"{per_s / 1e3:.1f} k/s"
    return f"{per_s:.0f} /s"


def fmt_us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} µs" if seconds < 1e-2 else f"{seconds * 1e3:,.1f} ms"


def fmt_ratio(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def rss_gb() -> float:
    """Resident set size of this process in GB (Linux; 0.0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def load_average() -> float:
    """The 1-minute load average (0.0 where unknown): how busy the machine is with others."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return 0.0


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment(versions: dict[str, str]) -> dict[str, Any]:
    """What the numbers were taken on."""
    return {
        "cpu": cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "torch_threads": torch.get_num_threads(),
        **versions,
        "load_average_at_start": load_average(),
    }


def log(msg: str) -> None:
    """Progress goes to stderr so stdout holds only the report."""
    print(msg, file=sys.stderr, flush=True)


def report(lines: Sequence[str], results: dict[str, Any], json_path: str | None) -> int:
    """Print the markdown report (stdout) and write ``results`` as JSON when asked
    (:func:`run_main` then gives the file the shape every result file has)."""
    print("\n".join(lines))
    if json_path:
        import json

        with open(json_path, "w") as f:
            json.dump(results, f, indent=1, default=str)
    return 0


# -- result files: one shape for every benchmark (benchmarks/render_docs.py reads them) ----
_TABLE_ROW = re.compile(r"^\s*\|.*\|\s*$")
_RULE = re.compile(r"^\s*\|(\s*:?-+:?\s*\|)+\s*$")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_table_start(lines: Sequence[str], i: int) -> bool:
    return bool(_TABLE_ROW.match(lines[i]) and i + 1 < len(lines) and _RULE.match(lines[i + 1]))


def _noise(line: str) -> bool:
    """Lines of a report that are not about a table: log lines (ANSI colours), the
    environment (which a result file keeps as data)."""
    text = line.strip().lower()
    return "\x1b[" in line or text.startswith(("environment", "{'cpu'", "cpu ")) or " · " in text


def _paragraphs(lines: Sequence[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for line in lines:
        if line.strip():
            out[-1].append(line)
        elif out[-1]:
            out.append([])
    return [p for p in out if p]


def _split_segment(lines: Sequence[str], titled: bool = True) -> tuple[list[str], str, list[str]]:
    """The lines between two tables as (notes of the one above, title and intro of the one
    below): a ``#`` heading starts the next table's part; without one, a last paragraph of
    one short line right above the table is its title."""
    lines = [ln for ln in lines if not _noise(ln)]
    heads = [i for i, ln in enumerate(lines) if ln.startswith("#")]
    if heads:
        i = heads[-1]
        return list(lines[: heads[0]]), lines[i].lstrip("#").strip(), list(lines[i + 1 :])
    paras = _paragraphs(lines)
    last = paras[-1] if paras else []
    if titled and len(last) == 1 and len(last[0]) <= 120 and not last[0].startswith("-"):
        title = paras[-1][0].strip()
        cut = max(i for i, ln in enumerate(lines) if ln.strip() == title)
        return list(lines[:cut]), title, []
    return list(lines), "", []


def tables_from_markdown(text: str) -> list[dict[str, Any]]:
    r"""Every markdown table in ``text`` as ``{"title", "headers", "rows", "notes"}``.

    Between two tables, a ``#`` heading starts the lower table's title and the lines
    after it its notes; the lines before it are the upper table's notes. Without a
    heading, a last paragraph of one short line is the lower table's title. Log lines and
    the environment line are left out (a result file keeps the environment as data).

    Example:
        >>> text = "## Sample\n\nB=8\n\n| lib | us |\n|---|---|\n| a | 1 |\n\nbest of 5"
        >>> tables_from_markdown(text)
        [{'title': 'Sample', 'headers': ['lib', 'us'], 'rows': [['a', '1']], 'notes': 'B=8\n\nbest of 5'}]
    """
    lines = text.splitlines()
    spans: list[tuple[int, int]] = []  # [start, end) of each table
    i = 0
    while i < len(lines):
        if _is_table_start(lines, i):
            j = i + 2
            while j < len(lines) and _TABLE_ROW.match(lines[j]):
                j += 1
            spans.append((i, j))
            i = j
        else:
            i += 1
    tables: list[dict[str, Any]] = []
    before = 0
    for k, (start, end) in enumerate(spans):
        above, title, intro = _split_segment(lines[before:start])
        if k == 0:  # no table above to take those lines as notes
            intro = [*above, *intro]
        after_end = spans[k + 1][0] if k + 1 < len(spans) else len(lines)
        notes, _, _ = _split_segment(lines[end:after_end], titled=k + 1 < len(spans))
        rows = [_cells(ln) for ln in lines[start + 2 : end]]
        text_notes = ("\n".join(intro).strip() + "\n\n" + "\n".join(notes).strip()).strip()
        tables.append({"title": title, "headers": _cells(lines[start]), "rows": rows, "notes": text_notes})
        before = end
    return tables


def command_line(argv: Sequence[str]) -> str:
    """``python benchmarks/x.py --quick ...`` as typed from the repository root."""
    import shlex

    script = os.path.relpath(os.path.abspath(argv[0]), ROOT) if argv else "?"
    return shlex.join(["python", script, *argv[1:]])


def result_document(
    benchmark: str, command: str, stdout: str, results: dict[str, Any] | None
) -> dict[str, Any]:
    """The JSON every benchmark writes: what ran, when, where, and its tables."""
    import datetime

    results = dict(results or {})
    env = results.pop("environment", None) or environment({})
    return {
        "benchmark": benchmark,
        "command": command,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": env,
        "tables": tables_from_markdown(stdout),
        "load_average_at_end": load_average(),
        **({"results": results} if results else {}),
    }


class _Tee(io.TextIOBase):
    """Writes to ``stream`` and keeps a copy."""

    def __init__(self, stream: Any):
        self.stream, self.parts = stream, []  # type: ignore[var-annotated]

    def write(self, text: str) -> int:
        self.parts.append(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


def run_main(main: Callable[[], int | None], argv: Sequence[str] | None = None) -> int:
    """Run a benchmark's ``main()``; with ``--json PATH`` the file at PATH ends in the
    shape of :func:`result_document`: the tables read from what ``main`` printed, and
    whatever ``main`` itself wrote to PATH (if anything) under ``"results"``."""
    import contextlib
    import json

    argv = list(sys.argv if argv is None else argv)
    path = argv[argv.index("--json") + 1] if "--json" in argv[:-1] else None
    if path and os.path.exists(path):
        os.remove(path)  # what is there afterwards is this run's
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        code = main()
    if path:
        written = None
        if os.path.exists(path):
            with open(path) as f:
                written = json.load(f)
        stem = os.path.splitext(os.path.basename(argv[0]))[0]
        doc = result_document(stem, command_line(argv), "".join(tee.parts), written)
        with open(path, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        log(f"wrote {path}")
    return int(code or 0)


def ab_args(doc: str | None, argv: Sequence[str] | None, rounds: int, quick_rounds: int) -> Any:
    """The options of an interleaved A/B against a base commit (``ab_*.py``): ``--base``,
    ``--quick``, ``--calls``, ``--rounds``, ``--threads`` (applied here), ``--json``."""
    import argparse

    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    p.add_argument("--base", default="main", help="the commit to compare with (default main)")
    p.add_argument("--quick", action="store_true", help="100k items, fewer rounds (seconds)")
    p.add_argument("--calls", type=int, default=100, help="calls per timed block")
    default = f"default {rounds}; quick {quick_rounds}"
    p.add_argument("--rounds", type=int, default=None, help=f"timed blocks per function ({default})")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.rounds is None:
        args.rounds = quick_rounds if args.quick else rounds
    if args.threads:
        torch.set_num_threads(args.threads)
    return args
