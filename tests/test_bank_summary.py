"""The quick, torch-free listing of ``xpbank ls`` against the full check of ``list_banks``.

:func:`xpbank.bank.summary.quick_summary` shares the manifest checks with
``Manifest.parse`` (one function, :func:`~xpbank.bank.manifest_check.check_manifest`)
but judges dtypes by a table and the sampler and buffer options by rules written after
the constructors'. Here both run over the same good and bad manifests (banks of every
sampler and option xpbank writes, each edited value by value) and must agree: the quick
check gives the full check's answer (summary or error message) or ``None`` (undecided).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import xpbank
from bank_cases import small_bank
from xpbank import PrioritizedSampler, SequenceSampler, Table
from xpbank.bank import manifest_check, summary
from xpbank.bank.ops import bank_summary
from xpbank.bank.summary import quick_summary
from xpbank.her import GoalKeys, HerSampler
from xpbank.storage import memmap
from xpbank.storage.dtypes import numpy_dtype

VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2, 16, 0.5, 1.5, -0.0, 1e-300, 2**64, 10**30, 10**400, float("nan"),
    float("inf"), "", "x", "cpu", "numpy", "strict", "float32", "<f4", [], {}, ["x"], [1, 2],
]  # fmt: skip


def _bf16_bank(path: Path) -> Path:
    spec = xpbank.Spec(
        {"obs": xpbank.Field((2,), torch.bfloat16), ("next", "flag"): xpbank.Field((), torch.bool)}
    )
    rb = xpbank.ReplayBuffer(6, spec, cast=False)
    rb.extend({"obs": torch.ones(4, 2, dtype=torch.bfloat16), ("next", "flag"): torch.ones(4) > 0})
    return xpbank.save(rb, path)


BANKS = {  # name -> (make, whether the quick check must decide it)
    "uniform": (lambda p: small_bank(p), True),
    "prioritized": (lambda p: small_bank(p, sampler=PrioritizedSampler(beta_steps=5), num_envs=1), True),
    "sequence": (lambda p: small_bank(p, capacity=12, sampler=SequenceSampler(2, burn_in=1)), True),
    "sequence_per": (lambda p: small_bank(p, sampler=SequenceSampler(3, prioritized=True)), True),
    "nstep": (lambda p: small_bank(p, nstep=xpbank.NStep(3, 0.9), num_envs=1), True),
    "bfloat16": (_bf16_bank, True),
    "empty": (lambda p: xpbank.save(xpbank.ReplayBuffer(8), p), True),
    "her": (lambda p: small_bank(p, sampler=HerSampler(strategy="final")), True),
    "table": (
        lambda p: small_bank(p, capacity=16, sampler=Table("max_heap", "lifo", max_times_sampled=2)), True
    ),
    "queue": (lambda p: small_bank(p, capacity=16, sampler=Table.queue(versioned=True)), True),
    "table_versions": (  # a version field: its dtype is the full check's to judge
        lambda p: small_bank(p, capacity=16, sampler=Table("fifo", version_key="action")), False
    ),
    "her_per": (
        lambda p: small_bank(
            p,
            sampler=HerSampler(
                PrioritizedSampler(), relabel_fraction=0.5, info_keys=["index", ("next", "obs")]
            ),
        ),
        True,
    ),
}


_REMOVE = object()  # an edit that removes the entry
BankSummaryPair = tuple[Any, Any]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    out = []
    for key, child in items:
        out += [(*prefix, key), *_paths(child, (*prefix, key))]
    return out


def _edited(manifest: dict[str, Any], where: tuple[Any, ...], value: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(manifest))
    parent = copy
    for key in where[:-1]:
        parent = parent[key]
    if value is _REMOVE:
        del parent[where[-1]]
    else:
        parent[where[-1]] = value
    return copy


def _agree(bank: Path, manifest: dict[str, Any]) -> BankSummaryPair:
    (bank / "manifest.json").write_text(json.dumps(manifest, allow_nan=True))
    full, quick = bank_summary(bank), quick_summary(bank)
    assert quick is None or quick == full, f"quick {quick}\nfull {full}\nmanifest {manifest}"
    return full, quick


@pytest.mark.parametrize("name", sorted(BANKS))
def test_quick_listing_agrees_with_list_banks(tmp_path: Path, name: str) -> None:
    """Every value of every option, and a seeded sample of edits elsewhere (spec, files,
    ring, state files): the quick answer is the full one, or undecided."""
    make, decides = BANKS[name]
    bank = make(tmp_path / name)
    manifest = json.loads((bank / "manifest.json").read_text())
    full, quick = _agree(bank, manifest)
    assert full.error is None and (quick is not None) == decides
    paths = _paths(manifest)
    options = [p for p in paths if p[0] == "buffer"]
    others = [p for p in paths if p[0] != "buffer"]
    others = random.Random(name).sample(others, k=min(60, len(others)))
    cases = [(p, v) for p in options for v in [*VALUES, _REMOVE]]
    cases += [(p, v) for p in others for v in random.Random(str(p)).sample([*VALUES, _REMOVE], k=6)]
    decided = {"good": 0, "error": 0}
    for where, value in cases:
        full, quick = _agree(bank, _edited(manifest, where, value))
        if quick is not None:
            decided["good" if quick.error is None else "error"] += 1
    if decides:  # the quick path answers most edits itself, both ways
        assert decided["good"] > 0 and decided["error"] > 0, decided


def test_quick_listing_agrees_on_option_edges(tmp_path: Path) -> None:
    """Each sampler and buffer option at and past the edges the constructors draw."""
    bank = small_bank(tmp_path / "b")
    manifest = json.loads((bank / "manifest.json").read_text())
    edges = [0, 1, -1, 0.0, 1.0, 1.0000001, -1e-12, 1e-12, 1e308, 10**400, -(10**400), True, "1", None]
    samplers = {
        "prioritized": xpbank.PrioritizedSampler().config(),
        "sequence": xpbank.SequenceSampler(2, mode="padded").config(),
    }
    for sampler, config in samplers.items():
        for option in config:
            for value in edges:
                edited = _edited(manifest, ("buffer", "sampler"), {"name": sampler, "config": {**config}})
                edited["buffer"]["sampler"]["config"][option] = value
                _agree(bank, edited)
    for option, good in (("num_envs", 2), ("cast", False), ("nstep", {"n": 2, "gamma": 0.5})):
        for value in [good, *edges, {"n": 2}, {"n": 0, "gamma": 0.5}, {"n": 2, "gamma": 1.5}]:
            _agree(bank, _edited(manifest, ("buffer", option), value))
    _agree(bank, _edited(manifest, ("buffer", "unknown_option"), 1))


def test_quick_listing_agrees_on_hindsight_options(tmp_path: Path) -> None:
    """HerSampler's options (its base sampler, goal keys, info keys) at and past their edges."""
    bank = small_bank(tmp_path / "b")
    manifest = json.loads((bank / "manifest.json").read_text())
    config = HerSampler().config()
    base = {"name": "prioritized", "config": PrioritizedSampler().config()}
    edits = {
        "base": [None, base, {"name": "her", "config": config}, {"name": "uniform"}, "uniform"],
        "strategy": ["future", "episode", "last", None],
        "n_sampled_goal": [None, 1, 0, -2, 1.5, True],
        "relabel_fraction": [None, 0, 1, 0.5, 1.5, -0.1, float("nan"), True],
        "keys": [
            None,
            {},
            {"desired": "goal"},
            {"desired": ["obs", "goal"]},
            {"goal": "x"},
            {"reward": []},
            [],
        ],
        "info_keys": [[], ["index"], [["next", "obs"]], [[]], [1], "obs", None],
        "compute_reward": [None],
    }
    for option, values in edits.items():
        for value in values:
            for goals in ({"n_sampled_goal": 4}, {"relabel_fraction": 0.5}, {}):
                sampler = {"name": "her", "config": {**config, **goals, option: value}}
                _agree(bank, _edited(manifest, ("buffer", "sampler"), sampler))


def test_rule_tables_name_what_the_constructors_take() -> None:
    """The quick rules list the constructors' own option names and choices."""
    assert set(summary._GOAL_ROLES) == {f.name for f in dataclasses.fields(GoalKeys)}
    assert set(summary._SAMPLERS["prioritized"]) == set(PrioritizedSampler().config())
    assert set(summary._SAMPLERS["sequence"]) == set(SequenceSampler(1).config())
    assert set(summary._SAMPLERS["table"]) == set(Table().config())
    from xpbank.table.options import REMOVERS, SELECTORS

    assert (summary._TABLE_SELECTORS, summary._TABLE_REMOVERS) == (SELECTORS, REMOVERS)
    assert set(summary._NSTEP) == set(xpbank.NStep(1, 0.5).config())
    assert summary.NOT_OPTIONS | set(summary._OPTIONS) | {"episode_keys"} == set(
        inspect.signature(xpbank.ReplayBuffer).parameters
    ) | {"capacity"}


def test_dtype_tables_are_numpys_and_torchs() -> None:
    """The quick check's dtype tables say what NumPy and torch say."""
    for text, npy in summary._NPY.items():
        dtype = np.dtype(text)
        assert (dtype.str, str(dtype), dtype.itemsize) == (npy.str, npy.name, npy.itemsize)
        assert not (dtype.hasobject or dtype.fields or dtype.subdtype)
    for name, text in summary._STORED.items():
        assert numpy_dtype(getattr(torch, name)).str == text, name
        xpbank.Field((), getattr(torch, name))  # storable


def test_key_paths_are_the_storages() -> None:
    """Manifest key checks use the storage's file-name rule (one torch-free function,
    xpbank._paths.safe_file_parts, that both call)."""
    assert manifest_check.safe_file_parts is memmap.safe_file_parts
    for key in ("obs", ("next", "obs"), ("a", "b.c", "d-e_1")):
        assert manifest_check.data_relpath(key) == memmap.field_path(Path("data"), key).as_posix()
