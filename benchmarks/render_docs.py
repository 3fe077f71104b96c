"""Render ``docs/benchmarks.md`` from every result file in ``benchmarks/results/``.

    python benchmarks/render_docs.py            # rewrite docs/benchmarks.md, README's table
    python benchmarks/render_docs.py --check    # exit 1 if it is not what the files say

Each result file is what a benchmark writes with ``--json PATH`` (``_common.run_main``):
``{"benchmark", "command", "date", "environment", "tables": [{"title", "headers", "rows",
"notes"}]}``, extra keys ignored. The page shows, per file: what the benchmark measures
(the first paragraph of its script's docstring), the command, the date, the machine and
its load, every table, and what in its figures depends on the CPU. No number on the page
is typed by hand: rerun a benchmark with ``--json benchmarks/results/<name>.json``, then
this script.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
README = ROOT / "README.md"
START, END = "<!-- speed table: rendered by benchmarks/render_docs.py -->", "<!-- end of speed table -->"

# The README's table: (what, benchmark, table title prefix, column, xpbank's row, peers' rows)
README_FIGURES = [
    ("replay sample, B=256 (rate vs raw torch; higher is faster)", "bench_replay", "Workload (a)",
     "sample B=256 vs raw", "xpbank (dict)", ["cpprb", "sb3", "torchrl"]),
    ("replay extend, B=256 (rate vs raw torch)", "bench_replay", "Workload (a)",
     "extend vs raw", "xpbank (dict)", ["cpprb", "sb3", "torchrl"]),
    ("image frames, sample B=32 (rate vs raw torch)", "bench_replay", "Workload (b)",
     "sample B=32 vs raw", "xpbank (dict)", ["cpprb", "sb3", "torchrl"]),
    ("prioritized sample + update (time vs xpbank; lower is faster)", "bench_prioritized",
     "Prioritized replay", "time vs xpbank", "xpbank", ["cpprb", "torchrl"]),
    ("n-step sample (time vs the same library's uniform sample)", "bench_prioritized", "N-step",
     "n-step / uniform", "xpbank", ["sb3"]),
    ("queue table over shared memory, 4 writers, 1 reader (items/s vs the plain shm "
     "buffer)", "bench_tables", "(a) FIFO queue", "vs plain",
     "queue table: sample(256), each item once", []),
    ("rollout minibatches, 5 x 4 (time vs raw tensors; lower is faster)", "bench_rollout", "",
     "5 x 4 minibatches", "xpbank RolloutBuffer",
     ["rsl_rl RolloutStorage", "SB3 RolloutBuffer", "TorchRL (GAE + buffer)"]),
]  # fmt: skip

# Rows of the small loops users write: (what, benchmark, table title prefix, row label
# prefix, the baseline's column, xpbank's column, peers' columns). Each cell is a time;
# the README shows each as a ratio to the baseline's (median) time in the same row.
README_ROWS = [
    ("add one transition, NumPy (time vs SB3's add; lower is faster)", "bench_small_calls",
     "Small calls", "add: NumPy", "SB3", "xpbank", ["cpprb", "TorchRL"]),
    ("add one transition, torch tensors (time vs SB3's add)", "bench_small_calls",
     "Small calls", "add: torch", "SB3", "xpbank", ["cpprb", "TorchRL"]),
    ("extend one step of 8 envs, NumPy (time vs SB3's add)", "bench_small_calls",
     "Small calls", "extend [8]: NumPy", "SB3", "xpbank", ["cpprb", "TorchRL"]),
    ("sample 32 of 100k (time vs SB3's sample)", "bench_small_calls", "Small calls",
     "sample(32) of 100k", "SB3", "xpbank", ["cpprb", "TorchRL"]),
    ("SB3 DQN learn() on CartPole, whole loop (time vs SB3's own buffer)", "bench_in_loop",
     "Whole training loops", "SB3 DQN / CartPole", "original s", "xpbank s", []),
    ("rsl_rl PPO returns, 256 envs, the runner switch (time vs rsl_rl's own, bit for bit)",
     "bench_compat", "rsl_rl storage calls", "returns: xpbank.compat.rsl_rl.PPO (the runner switch), 256",
     "original (median)", "xpbank (median)", []),
    ("rsl_rl PPO iteration, MLP, 4096 envs, the runner switch (time vs rsl_rl's own)", "bench_compat",
     "rsl_rl PPO iteration", "PPO iteration, MLP, the switch (xpbank.compat.rsl_rl:PPO, parity), 4096",
     "original (median)", "xpbank (median)", []),
    ("HER sample 256 (time vs SB3's HerReplayBuffer)", "bench_her", "HER sample(256)",
     "xpbank HER (future", None, "per call: median (range)", []),
    ("GPU (H200): sample 256, data on the GPU (time vs SB3's buffer with device='cuda')",
     "bench_cuda", "sample(", "xpbank, GPU storage", None, "µs (median)", []),
    ("GPU (H200): sample 256, CPU storage delivering to the GPU (time vs SB3's, as above)",
     "bench_cuda", "sample(", "xpbank, pinned CPU storage", None, "µs (median)", []),
    ("mixed sample 256 from two buffers (time vs its two sub-samples)", "bench_mix",
     "Mixed sample", "uniform + uniform", "two sub-samples (128 + 128)", "Mixture.sample(256)", []),
    ("mixed sample 256, buffer + memory-mapped bank (time vs its two sub-samples)", "bench_mix",
     "Mixed sample", "uniform (memory) + bank", "two sub-samples (128 + 128)",
     "Mixture.sample(256)", []),
    ("heap table, sample + update of 256 at 1M (time vs the prioritized sampler)",
     "bench_tables", "(b) Heap selectors", "max-heap", None, "µs per sample + update", []),
]  # fmt: skip

# the order of the page; files of other benchmarks follow, by name
ORDER = [
    "bench_replay", "bench_prioritized", "bench_sequence", "bench_images", "bench_rollout",
    "bench_bank", "bench_shm", "bench_ray", "bench_tables", "bench_sb3", "bench_compat",
    "bench_compat_replay", "bench_cuda",
]  # fmt: skip

TITLES = {
    "bench_replay": "Replay: extend and sample against TorchRL, cpprb and SB3",
    "bench_prioritized": "Prioritized replay and n-step returns",
    "bench_sequence": "Sequence windows (recurrent agents)",
    "bench_images": "Image frames stored once (FrameStorage)",
    "bench_rollout": "On-policy rollouts",
    "bench_bank": "Banks on disk: save, load, open, checkpoint",
    "bench_shm": "Many writer processes on one machine (shared memory)",
    "bench_ray": "Many machines: Ray shards",
    "bench_tables": "Reverb-style tables: a queue over shared memory, heap selectors",
    "bench_sb3": "Stable-Baselines3 drop-in",
    "bench_compat": "Front-ends for rsl_rl and metta",
    "bench_compat_replay": "Front-ends for objectrl, ROSE and TorchRL's trainer",
    "bench_cuda": "On a GPU: storage, delivery and prioritized trees on CUDA",
}

# what in each benchmark's figures depends on the CPU (and the machine) it ran on
CPU_NOTES = {
    "bench_replay": "µs per call and items/s scale with the CPU's memory bandwidth and cache "
    "sizes; the ratios to the raw-tensor baseline, measured in the same process, move much "
    "less. Image rows (workload b) are copies of 56 KB per item: memory-bound everywhere.",
    "bench_prioritized": "The sum-tree descent is cache-miss bound: its µs follow the CPU's "
    "memory latency. With numba (the `fast` extra) the kernels are compiled for the CPU at "
    "hand; without it the NumPy paths run (same results, about half the speed). The ratio to "
    "cpprb, in the same run, is the figure to compare across machines.",
    "bench_sequence": "The gather of B x L rows dominates at large capacities: it follows the "
    "memory system (cache misses), so the 2M / 10k ratio depends on the CPU's cache size.",
    "bench_images": "Copies of uint8 frames: memory bandwidth decides the µs; bytes per "
    "transition do not depend on the CPU at all.",
    "bench_rollout": "Per-call µs scale with the CPU; the ratios to raw packed tensors and "
    "to the peers in the same process are what carry over.",
    "bench_bank": "Dominated by the disk and the page cache (cold reads drop the pages "
    "first): GB/s follow the storage device far more than the CPU; the checksum's share "
    "(xxh3 or CRC-32) follows the CPU.",
    "bench_shm": "Rows per second follow memory bandwidth and, above all, the number of "
    "free cores: each writer is a process; on 2 shared cores more writers take time from "
    "the learner.",
    "bench_ray": "Ray's per-call overhead (about a millisecond a round trip here) and the "
    "cores the actors share decide these figures; they say nothing about a cluster's "
    "network.",
    "bench_sb3": "learn() steps/s include the networks' forward and backward passes, so "
    "they follow the CPU (and torch's threads) as much as the buffer.",
    "bench_compat": "Per-call times follow the CPU; the ratios to the original libraries in "
    "the same process are what to compare.",
    "bench_compat_replay": "Per-call times follow the CPU; the speed-ups against the "
    "original libraries, measured in the same process, move less.",
    "bench_tables": "Part (a) runs 5 processes (4 writers, 1 reader): where fewer cores are free "
    "than that, they share CPUs and the ratio follows the scheduler as much as the code, so "
    "rounds vary widely on a loaded machine (see the load average). Part (b) compares the compiled "
    "tournament tree's dependent take-outs (a few 16-wide scans per item) with the sum-tree's "
    "independent descents.",
}
DEFAULT_CPU_NOTE = (
    "Absolute times follow the CPU, its memory and the load; ratios measured in the same process move less."
)

HEADER = """# Benchmarks

Every figure on this page comes from a result file in `benchmarks/results/`, written by
the benchmark named in its section (`--json PATH`), and this page is rendered from those
files by `python benchmarks/render_docs.py` (a test checks that the committed page is
what the files say). To refresh a section, rerun its command on your machine with
`--json benchmarks/results/<name>.json`, then the renderer.

How to read them:

- Every benchmark compares, in one process and with interleaved rounds, xpbank against a
  raw-tensor baseline and against the peer libraries it replaces, so the **ratios** are
  the figures that carry from one machine to another; the µs and GB/s are this machine's.
- `--quick` runs use small sizes and few rounds so that they finish in seconds; their
  ratios are noisier than full runs' and their sizes are in each table's title or notes.
- The machine line says what the numbers were taken on: CPU model, cores, versions and
  the load average (other work on the machine) at the start and end of the run. A load
  above the number of cores means the run shared its CPU with other jobs.
"""


def _doc_of(stem: str) -> str:
    """The first paragraph of ``benchmarks/<stem>.py``'s docstring, joined into one line."""
    script = ROOT / "benchmarks" / f"{stem}.py"
    if not script.exists():
        return ""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    first = doc.strip().split("\n\n")[0]
    return " ".join(line.strip() for line in first.splitlines())


def _machine(env: dict[str, Any], doc: dict[str, Any]) -> str:
    parts = [
        str(env.get("cpu", "CPU unknown")),
        f"{env.get('cpu_count', '?')} cores",
        f"Python {env.get('python', '?')}",
        f"torch {env.get('torch', '?')}",
        f"NumPy {env.get('numpy', '?')}",
        f"{env.get('torch_threads', '?')} torch thread(s)",
    ]
    load = f"load average {env.get('load_average_at_start', '?')} at start"
    if "load_average_at_end" in doc:
        load += f", {doc['load_average_at_end']} at end"
    return ", ".join(parts) + f"; {load}"


def _versions(env: dict[str, Any]) -> str:
    known = {"cpu", "python", "platform", "cpu_count", "torch", "numpy", "torch_threads"}
    extra = {k: v for k, v in env.items() if k not in known and not k.startswith("load_average")}
    return ", ".join(f"{k} {v}" for k, v in extra.items())


def _cell(text: Any) -> str:
    return str(text).replace("\n", " ").replace("|", "\\|")


def _table(table: dict[str, Any]) -> list[str]:
    headers = [_cell(h) for h in table.get("headers", [])]
    lines = []
    if table.get("title"):
        lines += [f"**{table['title']}**", ""]
    lines += ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in table.get("rows", []):
        cells = [_cell(c) for c in row] + [""] * (len(headers) - len(row))
        lines.append("| " + " | ".join(cells[: len(headers)]) + " |")
    if table.get("notes"):
        lines += ["", str(table["notes"]).strip()]
    return [*lines, ""]


def section(doc: dict[str, Any]) -> str:
    """One result file as a section of the page."""
    stem = str(doc["benchmark"])
    env = doc.get("environment", {})
    lines = [f"## {TITLES.get(stem, stem)}", ""]
    about = _doc_of(stem)
    if about:
        lines += [about, ""]
    lines += [
        f"- Command: `{doc['command']}`",
        f"- Date: {doc['date']}",
        f"- Machine: {_machine(env, doc)}",
    ]
    versions = _versions(env)
    if versions:
        lines.append(f"- Versions and settings: {versions}")
    if "--quick" in str(doc["command"]).split():
        lines.append("- A `--quick` run: small sizes, few rounds (see the titles and notes).")
    lines.append(f"- What depends on the CPU: {doc.get('cpu_note') or CPU_NOTES.get(stem, DEFAULT_CPU_NOTE)}")
    lines.append("")
    if not doc.get("tables"):
        lines += ["This run printed no table.", ""]
    for table in doc.get("tables", []):
        lines += _table(table)
    return "\n".join(lines)


def load_results(directory: Path = RESULTS) -> list[dict[str, Any]]:
    """Every result file in ``directory``, in the page's order; a file missing a required
    key is an error naming it."""
    docs = []
    for path in sorted(directory.glob("*.json")):
        doc = json.loads(path.read_text())
        missing = [k for k in ("benchmark", "command", "date", "environment", "tables") if k not in doc]
        if missing:
            raise SystemExit(f"{path}: not a benchmark result file (missing {', '.join(missing)})")
        docs.append(doc)
    rank = {stem: i for i, stem in enumerate(ORDER)}
    return sorted(docs, key=lambda d: (rank.get(d["benchmark"], len(ORDER)), d["benchmark"]))


def render(directory: Path = RESULTS) -> str:
    """The whole page."""
    docs = load_results(directory)
    contents = [f"- [{TITLES.get(d['benchmark'], d['benchmark'])}](#{_anchor(d)})" for d in docs]
    body = [section(d) for d in docs]
    return "\n".join([HEADER, *contents, "", *body]).rstrip() + "\n"


def _anchor(doc: dict[str, Any]) -> str:
    """The anchor Python-Markdown's toc gives the section's heading."""
    import re

    title = TITLES.get(doc["benchmark"], doc["benchmark"]).lower()
    title = re.sub(r"[^\w\s-]", "", title)
    return re.sub(r"[-\s]+", "-", title).strip("-")


def _ratio(cell: str) -> str:
    """``'1,029.8 µs (3.20x)'`` -> ``'3.20x'``; a cell that is a ratio stays as it is."""
    inner = cell[cell.rfind("(") + 1 : cell.rfind(")")] if cell.endswith("x)") else cell
    return inner.strip()


def readme_table(docs: list[dict[str, Any]]) -> str:
    """The README's compact table: ratios only, each from a result file's table."""
    by_stem = {d["benchmark"]: d for d in docs}
    lines = ["| what (one run; see the benchmarks page) | xpbank | peers in the same run |", "|---|---|---|"]
    for what, stem, title, column, ours, peers in README_FIGURES:
        doc = by_stem.get(stem)
        tables = [t for t in (doc or {}).get("tables", []) if t["title"].startswith(title)]
        if not tables or column not in tables[0]["headers"]:
            continue
        col = tables[0]["headers"].index(column)
        rows = {row[0]: row[col] for row in tables[0]["rows"]}
        if ours not in rows:
            continue
        others = ", ".join(f"{name} {_ratio(rows[name])}" for name in peers if name in rows)
        lines.append(f"| {what} | {_ratio(rows[ours])} | {others or '-'} |")
    return "\n".join(lines + readme_rows(docs))


def _median(cell: str) -> float | None:
    """``'10.9 µs (3.3-59.6)'`` or ``'118.66'`` -> the leading number; ``'—'`` -> None."""
    head = cell.strip().split(" ")[0].replace(",", "")
    try:
        return float(head)
    except ValueError:
        return None


def readme_rows(docs: list[dict[str, Any]]) -> list[str]:
    """The README's rows for small calls and whole loops (:data:`README_ROWS`)."""
    lines = []
    for what, stem, title, label, base, ours, peers in README_ROWS:
        # a benchmark may have several result files (a partial rerun of some rows, a
        # "before" file): the newest table that has the row
        docs_of = sorted(
            (d for d in docs if d["benchmark"] == stem), key=lambda d: str(d["date"]), reverse=True
        )
        tables = [t for d in docs_of for t in d["tables"] if t["title"].startswith(title)]
        found = [(t, r) for t in tables for r in t["rows"] if r[0].startswith(label)]
        if not found:
            continue
        table, row = found[0]
        headers, rows = table["headers"], table["rows"]
        if ours not in headers:
            continue
        if base is None:  # a ratio against another row: SB3's HER, the prioritized sampler
            ref = next((r for r in rows if r[0].startswith(("SB3", "prioritized"))), None)
            reference = _median(ref[headers.index(ours)]) if ref else None
        else:
            reference = _median(row[headers.index(base)]) if base in headers else None
        mine = _median(row[headers.index(ours)])
        if not reference or mine is None:
            continue
        others = []
        for name in peers:
            value = _median(row[headers.index(name)]) if name in headers else None
            if value is not None:
                others.append(f"{name} {value / reference:.2f}x")
        lines.append(f"| {what} | {mine / reference:.2f}x | {', '.join(others) or '-'} |")
    return lines


def render_readme(text: str, docs: list[dict[str, Any]]) -> str:
    """``text`` (the README) with its speed table replaced by :func:`readme_table`."""
    head, found, rest = text.partition(START)
    _, found_end, tail = rest.partition(END)
    if not (found and found_end):
        raise SystemExit(f"README.md: the markers {START!r} ... {END!r} are missing")
    return f"{head}{START}\n{readme_table(docs)}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is stale")
    args = p.parse_args(argv)
    page = render()
    readme = render_readme(README.read_text(), load_results())
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != page or README.read_text() != readme:
            print("docs/benchmarks.md or README.md is stale: run python benchmarks/render_docs.py")
            return 1
        return 0
    PAGE.write_text(page)
    README.write_text(readme)
    print(f"wrote {PAGE.relative_to(ROOT)} from {len(load_results())} result file(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
