"""The shape of the package: no import cycles, files of a readable size, the public API
pinned, old module paths that users could import still importing (with a warning).

The import graph is read from the source (``ast``), not by importing: every ``import``
of an ``xpbank`` module anywhere in a file is an edge, at module level, under
``TYPE_CHECKING`` or inside a function. A cycle through any of them fails, except the
lazy calls listed in ``LAZY`` (each a method that hands its work to a layer that imports
the method's class).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import xpbank

SRC = Path(xpbank.__file__).parent
MAX_LINES = 400

#: (importer, imported): a thin lazy call back into a layer that imports the importer
LAZY = {
    # ReplayBuffer.checkpoint / merge_ hand the buffer to the bank layer, which builds
    # ReplayBuffers (xpbank.bank.checkpoint(rb) and xpbank.merge_into(rb, ...) are the
    # functions; the methods are kept as the one-line calls users know)
    ("xpbank.replay.buffer", "xpbank.bank"),
}

PUBLIC = [
    "BankError", "BankSummary", "BatchTypeError", "BufferChangedError", "BufferTimeoutError",
    "CapacityError", "ChannelError", "Collector", "CorruptBankError", "DeviceError", "EmptyBufferError",
    "EnvContractError", "EpisodeIndex", "EpisodeKeys", "Field", "FrameStorage",
    "HerSampler", "MemmapStorage", "MissingExtraError", "Mixture", "NStep", "NotReadyError",
    "PrioritizedSampler",
    "PriorityError", "RateLimitTimeout", "RateLimiter", "ReadOnlyError", "RecurrentBatch",
    "ReplayBuffer", "ReplaySink", "RolloutBuffer", "RolloutKeys", "RolloutSink", "Sampler",
    "SequenceSampler", "ShardUnavailableError", "Spec", "SpecError", "StaleIndexError",
    "Storage", "Table", "TensorStorage", "UniformSampler", "XpbankError", "XpbankIndexError",
    "bank_metadata", "discounted_returns", "export_minari", "export_npz", "gae",
    "import_minari", "import_npz", "iter_episodes", "list_banks", "load", "merge",
    "new_session_id", "normalize_advantages", "nstep_reduce", "nstep_return", "nstep_sum",
    "nstep_targets", "open_bank", "save", "split_trajectories", "unpad", "vtrace",
]  # fmt: skip


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports_of(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every xpbank module ``name`` imports, anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # "from pkg import sub" imports the submodule pkg.sub where there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # "import xpbank.a.b" also runs xpbank.a
                target = target.rpartition(".")[0]
            if target.startswith("xpbank") and target != name:
                out.add(target)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    for importer, imported in LAZY:
        assert imported in graph[importer], f"LAZY lists {importer} -> {imported}, which is gone: drop it"
        graph[importer].discard(imported)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (every import counts, lazy or TYPE_CHECKING): " + "; ".join(
        " <-> ".join(c) for c in found
    )


def test_the_cycle_finder_finds_one() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_every_lazy_import_still_exists() -> None:
    known = modules()
    for importer, imported in LAZY:
        assert imported in imports_of(importer, known[importer], known)


def test_no_file_over_the_size_guide() -> None:
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert not long, f"files over {MAX_LINES} lines (split them along a real seam): {long}"


def test_public_names_are_pinned() -> None:
    assert sorted(xpbank.__all__) == PUBLIC
    for name in PUBLIC:
        assert getattr(xpbank, name) is not None


def test_dir_shows_the_public_api_only() -> None:
    shown = [n for n in dir(xpbank) if not n.startswith("__")]
    assert shown == PUBLIC


def test_a_fresh_import_shows_no_internals() -> None:
    code = "import xpbank; print(' '.join(n for n in dir(xpbank) if not n.startswith('__')))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == PUBLIC


@pytest.mark.parametrize(
    "old",
    ["xpbank.cast", "xpbank.cli", "xpbank.episodes", "xpbank.nstep_returns", "xpbank.sinks", "xpbank.spaces"],
)
def test_old_module_paths_import_with_a_warning(old: str) -> None:
    from xpbank._moved import MOVED

    code = (
        "import importlib, warnings\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        f"    m = importlib.import_module({old!r})\n"
        "print(m.__name__, [str(x.message) for x in w if x.category is DeprecationWarning])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.startswith(MOVED[old] + " ")
    assert f"{old} has moved to {MOVED[old]}" in out.stdout


def test_internal_old_paths_are_gone() -> None:
    for old in [
        "xpbank.nstep_kernel",
        "xpbank.nstep_table",
        "xpbank.episode_fields",
        "xpbank._prefetch",
        "xpbank.batch",
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ModuleNotFoundError):
                __import__(old)
