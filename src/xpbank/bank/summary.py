"""What :func:`~xpbank.list_banks` says about a bank, and the quick way ``xpbank ls`` says it.

:func:`list_summaries` walks a directory and asks a checker about each bank.
``list_banks`` gives it the full check (:func:`xpbank.bank.ops.bank_summary`: the
manifest parsed with NumPy and torch, the options rebuilt on a 16-slot buffer).
``xpbank ls`` first tries :func:`quick_summary`, which imports neither: the same
manifest checks (:func:`~xpbank.bank.manifest_check.check_manifest`, with a table of
the dtypes banks hold) and the same size limits (:func:`check_sized`), then the options
xpbank writes (uniform, prioritized, sequence, hindsight and table samplers, ``num_envs``,
``nstep``, ``cast``) checked against the constructors' rules. It answers only when it is sure:
an error raised by the shared checks (the same message the full check gives), or a
summary the full check would give; anything else (a dtype or sampler it does not know,
an option it cannot judge) is ``None`` and the full check decides.
``tests/test_bank_summary.py`` and the adversarial fuzz hold the two to the same answers.
"""

from __future__ import annotations

import builtins
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xpbank.bank.manifest_check import (
    FREE_SLOTS,
    MANIFEST,
    Undecided,
    check_manifest,
    describe,
    read_manifest,
)
from xpbank.errors import BankError, CorruptBankError

__all__ = ["BankSummary", "NOT_OPTIONS", "check_sized", "list_summaries", "quick_summary", "spec_text"]

# config() keys a bank never passes on: where the data lives is the bank's choice
NOT_OPTIONS = frozenset({"capacity", "sampler", "spec", "storage", "storing_device", "device", "seed"})
# options that size arrays of the buffer (per env, per n-step window): at most as large
# as the per-slot ones a bank may claim (its capacity, or FREE_SLOTS without bytes)
SIZED = (("num_envs",), ("nstep", "n"))


@dataclass(frozen=True)
class BankSummary:
    """What :func:`~xpbank.list_banks` says about one bank (read from its manifest only).

    ``error`` is set, and the other fields may be empty, for a corrupt manifest.
    """

    path: Path
    session_id: str = ""
    size: int = 0
    capacity: int = 0
    spec: str = ""
    created: str = ""
    updated: str = ""
    error: str | None = None


def list_summaries(
    directory: str | os.PathLike[str], check: Callable[[Path], BankSummary]
) -> list[BankSummary]:
    """``check(bank)`` for every bank directly inside ``directory``: newest (last
    updated) first, corrupt ones last; hidden entries and directories without a
    manifest are skipped.

    Raises:
        BankError: ``directory`` is not a directory.
    """
    root = Path(os.fspath(directory))
    if not root.is_dir():
        raise BankError(f"list_banks: {root} is not a directory")
    found: list[BankSummary] = []
    broken: list[BankSummary] = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir() or not (entry / MANIFEST).exists():
            continue
        summary = check(entry)
        (found if summary.error is None else broken).append(summary)
    found.sort(key=lambda b: b.updated, reverse=True)
    return found + broken


def spec_text(fields: list[tuple[Any, tuple[int, ...], str]] | None) -> str:
    """A spec as ``list_banks`` shows it (``repr(Spec)`` without ``Spec(...)``)."""
    if fields is None:
        return "{}"
    inner = ", ".join(f"{k if isinstance(k, str) else '.'.join(k)!r}: {describe(s, d)}" for k, s, d in fields)
    return f"{{{inner}}}"


def check_sized(config: dict[str, Any], capacity: int, root: Path) -> None:
    """``num_envs`` and the n-step ``n`` size arrays: refuse them above what the bank can
    hold before any is allocated (``num_envs: 10**18`` would ask for exabytes).

    Raises:
        CorruptBankError: naming ``manifest.json`` and the option.
    """
    limit = max(FREE_SLOTS, capacity)
    for path in SIZED:
        value = node(config, path)
        if type(value) is int and value > limit:
            raise CorruptBankError(
                f"{root / MANIFEST}: 'buffer.{'.'.join(path)}' {value:,} is larger than the bank "
                f"can hold ({limit:,}: its capacity, or {FREE_SLOTS:,})"
            )


def node(tree: Any, path: tuple[str, ...]) -> Any:
    """``tree[path[0]][path[1]]...``, ``None`` where a level is missing or not a dict."""
    for part in path:
        tree = tree.get(part) if isinstance(tree, dict) else None
    return tree


def quick_summary(entry: Path) -> BankSummary | None:
    """The bank's summary (or its error) without torch or NumPy, or ``None`` where only
    the full check can tell (see the module docstring)."""
    if sys.byteorder != "little":  # the dtype table below is little-endian
        return None
    try:
        m = check_manifest(read_manifest(entry), entry, _TABLE)
        check_sized(m["buffer"], m["capacity"], entry)
    except Undecided:
        return None
    except BankError as exc:
        return BankSummary(entry, error=str(exc))
    if not _options_surely_valid(m["buffer"]):
        return None
    return BankSummary(
        entry, m["session_id"], m["size"], m["capacity"], spec_text(m["spec"]), m["created"], m["updated"]
    )


# -- dtypes by table -----------------------------------------------------------------
@dataclass(frozen=True)
class _Npy:
    """What the checks read of a NumPy dtype (``str(np.dtype('<f4'))`` is ``float32``)."""

    str: builtins.str  # "<f4"
    name: builtins.str  # "float32"
    itemsize: int
    hasobject = False
    fields = None
    subdtype = None

    def __str__(self) -> builtins.str:
        return self.name


_NPY = {
    d.str: d
    for d in (
        _Npy("|b1", "bool", 1), _Npy("|u1", "uint8", 1), _Npy("|i1", "int8", 1),
        _Npy("<i2", "int16", 2), _Npy("<i4", "int32", 4), _Npy("<i8", "int64", 8),
        _Npy("<u2", "uint16", 2), _Npy("<u4", "uint32", 4), _Npy("<u8", "uint64", 8),
        _Npy("<f2", "float16", 2), _Npy("<f4", "float32", 4), _Npy("<f8", "float64", 8),
        _Npy("<c8", "complex64", 8), _Npy("<c16", "complex128", 16),
    )
}  # fmt: skip
# torch dtype name -> how a bank stores it (storage.dtypes.numpy_dtype; bfloat16 as int16)
_STORED = {
    "bool": "|b1", "uint8": "|u1", "int8": "|i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "float16": "<f2", "bfloat16": "<i2", "float32": "<f4", "float64": "<f8",
    "complex64": "<c8", "complex128": "<c16",
}  # fmt: skip


class _TableDtypes:
    """:class:`~xpbank.bank.manifest_check.Dtypes` from the tables above; ``Undecided``
    for anything else."""

    def npy(self, text: str) -> _Npy:
        if text not in _NPY:
            raise Undecided(text)
        return _NPY[text]

    def spec(self, raw: dict[str, Any], where: str) -> tuple[Any, list[tuple[Any, tuple[int, ...], str]]]:
        entries = raw.get("fields")
        if not isinstance(entries, list):
            raise Undecided("spec")
        fields: dict[Any, tuple[tuple[int, ...], str]] = {}
        for e in entries:
            key = e.get("key") if isinstance(e, dict) else None
            shape = e.get("shape", []) if isinstance(e, dict) else None
            if not (
                isinstance(key, list)
                and key
                and all(isinstance(p, str) for p in key)
                and isinstance(shape, list)
                and all(type(d) is int and d >= 0 for d in shape)
                and isinstance(e.get("dtype"), str)
                and e["dtype"] in _STORED
            ):
                raise Undecided("spec")
            fields[key[0] if len(key) == 1 else tuple(key)] = (tuple(shape), e["dtype"])
        listed = [(k, shape, name) for k, (shape, name) in fields.items()]
        return listed, listed

    def stored(self, torch_name: str) -> _Npy:
        return _NPY[_STORED[torch_name]]


_TABLE = _TableDtypes()


# -- options by the constructors' rules ---------------------------------------------------
def _int(value: Any, low: int) -> bool:
    return type(value) is int and value >= low


def _real(value: Any, low: float, high: float = math.inf, strict: bool = False) -> bool:
    """A number the constructors' ``float(value)`` takes, finite and in range."""
    if type(value) not in (int, float) or abs(value) > _FLOAT_MAX:  # float(10**400) overflows
        return False
    ok = math.isfinite(value) and low <= value <= high
    return ok and not (strict and value == low)


_FLOAT_MAX = sys.float_info.max


# xpbank.table.options' SELECTORS and REMOVERS (importing it imports torch; a test pins them)
_TABLE_SELECTORS = ("uniform", "prioritized", "fifo", "lifo", "min_heap", "max_heap")
_TABLE_REMOVERS = ("fifo", "lifo", "min_heap", "max_heap", "uniform")

_SAMPLERS: dict[str, dict[str, Callable[[Any], bool]]] = {  # name -> {option: valid?}
    "uniform": {},
    "prioritized": {  # PrioritizedSampler.__init__
        "alpha": lambda v: _real(v, 0.0),
        "beta": lambda v: _real(v, 0.0),
        "eps": lambda v: _real(v, 0.0),
        "max_priority": lambda v: _real(v, 0.0, strict=True),
        "beta_steps": lambda v: v is None or _int(v, 1),
        "normalize_weights": lambda v: type(v) is bool,
        "tree_device": lambda v: v in (None, "numpy", "cpu"),
    },
    "sequence": {  # SequenceSampler.__init__
        "length": lambda v: _int(v, 1),
        "burn_in": lambda v: _int(v, 0),
        "stride": lambda v: _int(v, 1),
        "mode": lambda v: v in ("strict", "padded"),
        "prioritized": lambda v: type(v) is bool,
        "alpha": lambda v: _real(v, -math.inf),
        "beta": lambda v: _real(v, -math.inf),
        "eta": lambda v: _real(v, 0.0, 1.0),
        "eps": lambda v: _real(v, -math.inf),
    },
    "table": {  # Table.__init__ (rate limiters other than None / "queue": the full check)
        "selector": lambda v: v in _TABLE_SELECTORS,
        "remover": lambda v: v in _TABLE_REMOVERS,
        "max_times_sampled": lambda v: v is None or _int(v, 1),
        "rate_limiter": lambda v: v is None or v == "queue",
        "priority_exponent": lambda v: _real(v, 0.0),
        "default_priority": lambda v: _real(v, 0.0),
        "version_key": lambda v: v is None,  # a field's dtype and shape: the full check
        "versioned": lambda v: type(v) is bool,
        "timeout": lambda v: _real(v, 0.0),
    },
}
_REQUIRED = {"sequence": {"length"}}
_GOAL_ROLES = ("desired", "next_achieved", "next_desired", "reward", "terminated", "truncated", "done")


def _key(value: Any) -> bool:
    """A spec key as a config holds it: a str or a non-empty list of str."""
    return isinstance(value, str) or (
        isinstance(value, list) and bool(value) and all(isinstance(p, str) for p in value)
    )


def _her(config: dict[str, Any]) -> bool:
    """HerSampler.__init__ (its base: a registered sampler other than "her")."""
    rules: dict[str, Callable[[Any], bool]] = {
        "base": lambda v: v is None or (_sampler_ok(v) and v.get("name") != "her"),
        "strategy": lambda v: v in ("future", "final", "episode"),
        "n_sampled_goal": lambda v: v is None or _int(v, 1),
        "relabel_fraction": lambda v: v is None or _real(v, 0.0, 1.0),
        "keys": lambda v: (
            v is None
            or (
                isinstance(v, dict) and all(k in _GOAL_ROLES and (x is None or _key(x)) for k, x in v.items())
            )
        ),
        "info_keys": lambda v: isinstance(v, list) and all(_key(k) for k in v),
    }
    both = config.get("n_sampled_goal") is not None and config.get("relabel_fraction") is not None
    return not both and _valid(config, rules)


_NSTEP: dict[str, Callable[[Any], bool]] = {  # NStep.__post_init__
    "n": lambda v: _int(v, 1),
    "gamma": lambda v: _real(v, 0.0, 1.0),
    "reward_key": lambda v: v is None,
    "next_keys": lambda v: v is None,
}
_OPTIONS: dict[str, Callable[[Any], bool]] = {  # ReplayBuffer.__init__
    "num_envs": lambda v: v is None or _int(v, 1),
    "cast": lambda v: type(v) is bool,
    "nstep": lambda v: v is None or (isinstance(v, dict) and {"n", "gamma"} <= set(v) and _valid(v, _NSTEP)),
}


def _valid(options: dict[str, Any], rules: dict[str, Callable[[Any], bool]]) -> bool:
    return all(k in rules and rules[k](v) for k, v in options.items())


def _options_surely_valid(config: dict[str, Any]) -> bool:
    """Whether ``ReplayBuffer(16, sampler=make_sampler(...), **options)`` surely accepts
    ``config`` (what :func:`~xpbank.bank.rebuild.check_options` builds); ``False`` also
    where it cannot tell."""
    rest = {k: v for k, v in config.items() if k not in NOT_OPTIONS}
    sampler = config.get("sampler")
    table = isinstance(sampler, dict) and sampler.get("name") == "table"
    if table and (rest.get("nstep") is not None or rest.get("num_envs") is not None):
        return False  # Table.bind_buffer refuses these: its message, by the full check
    return _sampler_ok(sampler) and _valid(rest, _OPTIONS)


def _sampler_ok(sampler: Any) -> bool:
    """Whether ``make_sampler(sampler)`` surely succeeds."""
    if not isinstance(sampler, dict) or not isinstance(sampler.get("config"), dict):
        return False
    name, options = sampler.get("name"), sampler["config"]
    if name == "her":
        return _her(options)
    if not isinstance(name, str) or name not in _SAMPLERS or not _REQUIRED.get(name, set()) <= set(options):
        return False
    return _valid(options, _SAMPLERS[name])
