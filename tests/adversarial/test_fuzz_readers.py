"""Adversarial fuzz of every bank reader (issue 18, section 4).

Hypothesis draws a few mutations (bytes flipped, truncated, extended or made sparse and
huge in any file; files replaced by a FIFO, a directory, a link inside or outside the bank
or to ``/dev/zero``, a link loop, nothing; manifest values set to huge, negative,
NaN-ish or other-typed values, removed, nested deeply, digits edited; and edits that
keep the meaning), applies them to a copy of a saved bank and runs every reader on it in
a worker process (``fuzz_worker.py``) under a wall-time limit and an address-space limit
(a fixed allowance plus 16 times the bytes the bank's files really hold). Each reader
must, for each case:

* return within the time limit (else: "hang", the worker is killed and restarted) and
  within the address space (else: ``MemoryError``, or a worker killed by it);
* either raise an xpbank error whose message names a path in the bank, or return a
  result that works (the loaded buffer samples); when the mutations kept the meaning, it
  must return, and what it returns equals what the intact bank gives; when only bytes
  of data or state files changed, a reader that checks checksums returns the intact
  bank's contents or fails (damage is never laundered into a result);
* ``list_banks`` and the quick check of ``xpbank ls`` (no torch) say the same of the
  bank, or the quick check leaves it to the full one;
* write nothing outside the bank: the bank's parent directory (with a sentinel
  directory of link targets) is the same, entry by entry, before and after; a command
  that writes a new bank or file leaves nothing else behind.

The default run is bounded (fixed seed, a fixed number of examples); ``slow`` runs more.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, seed, settings
from hypothesis import strategies as st
from mutations import (
    BYTE_KINDS,
    FILE_KINDS,
    N_VALUES,
    PRESERVING_KINDS,
    apply,
    real_bytes,
)

import xpbank
from bank_cases import small_bank
from helpers import child_env, make_batch, transition_spec

HERE = Path(__file__).parent
SRC = str(Path(xpbank.__file__).parents[1])
WALL_S = 30.0  # per reader call, on a busy 2-core machine (a small bank takes milliseconds)
ALLOWANCE = 768 << 20  # address space a reader may add, on top of 16 x the bank's real bytes

# Readers that check the data checksums (by default) before returning or copying data.
VERIFYING = {
    "load",
    "open_verify",
    "open_rw",
    "merge",
    "cli_verify",
    "cli_export",
    "cli_merge",
    "cli_inspect",
}
# Read-only readers first; "r+" rewrites the manifest when it succeeds, so it runs last.
READERS = [
    "list_banks",
    "cli_ls",
    "load",
    "load_unverified",
    "open_r",
    "open_verify",
    "merge",
    "cli_inspect",
    "cli_verify",
    "cli_export",
    "cli_merge",
    "open_rw",
]


# -- the worker ---------------------------------------------------------------------
class Worker:
    """One long-lived ``fuzz_worker.py`` fed one case a line; restarted after a crash or hang."""

    def __init__(self, log: Path):
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0

    def _start(self) -> subprocess.Popen[bytes]:
        env = child_env(SRC, str(HERE.parent), OMP_NUM_THREADS="1")
        with open(self.log, "ab") as err:  # stderr to a file: a full pipe would block the worker
            return subprocess.Popen(
                [sys.executable, str(HERE / "fuzz_worker.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                start_new_session=True,
            )

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.close()
            self.proc.stdout.close()
            self.proc = None

    def ask(self, case: dict[str, Any]) -> dict[str, Any]:
        """The worker's reply, or ``{"hang": ...}`` / ``{"crash": ...}``."""
        first = self.proc is None
        if first:
            self.proc = self._start()
        proc = self.proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps(case) + "\n").encode())
            proc.stdin.flush()
        except BrokenPipeError:
            pass
        # the first call also imports torch; later ones are one reader call
        ready, _, _ = select.select([proc.stdout], [], [], WALL_S + (120 if first else 0))
        if not ready:
            self.stop()
            self.restarts += 1
            return {"hang": f"no reply in {WALL_S} s"}
        line = proc.stdout.readline()
        if not line:
            code = proc.wait()
            self.stop()
            self.restarts += 1
            return {"crash": f"exit status {code}; stderr tail: {self.log.read_text()[-2000:]}"}
        return json.loads(line)


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Worker]:
    w = Worker(tmp_path_factory.mktemp("worker") / "stderr.log")
    try:
        yield w
    finally:
        w.stop()


# -- banks to break -----------------------------------------------------------------
def _prioritized_bank(path: Path) -> Path:
    spec = transition_spec()
    rb = xpbank.ReplayBuffer(40, spec, sampler=xpbank.PrioritizedSampler(), num_envs=2, seed=3)
    rb.extend(make_batch(spec, 10))  # a partial ring: a sparse tail past the stored rows
    rb.update_priority(rb.sample_all()["index"], torch.linspace(0.5, 2.0, 10))
    return xpbank.save(rb, path, metadata={"run": "fuzz"})


TEMPLATES = {
    "wrapped": lambda p: small_bank(p),
    "prioritized": _prioritized_bank,
    "empty": lambda p: xpbank.save(xpbank.ReplayBuffer(8), p),
}


class Fuzz:
    """Templates of intact banks, what each reader gives on them, and fresh case dirs."""

    def __init__(self, root: Path, worker: Worker):
        self.root, self.worker, self.count = root, worker, 0
        self.templates = {name: make(root / "templates" / name / "bank") for name, make in TEMPLATES.items()}
        self.expected: dict[tuple[str, str], dict[str, Any]] = {}

    def case_dirs(self) -> tuple[Path, Path, Path]:
        """A fresh ``(parent, outside, out)``: the bank goes in ``parent``, beside ``outside``
        (link targets: a sentinel); ``out`` (elsewhere) takes what merge/export write."""
        self.count += 1
        case = self.root / f"case{self.count}"
        parent, out = case / "parent", case / "out"
        (parent / "outside").mkdir(parents=True)
        out.mkdir()
        return parent, parent / "outside", out

    def run(self, reader: str, bank: Path, out: Path) -> dict[str, Any]:
        limit = ALLOWANCE + 16 * real_bytes(bank)
        return self.worker.ask({"reader": reader, "bank": str(bank), "out": str(out), "limit": limit})

    def intact(self, template: str, reader: str) -> dict[str, Any]:
        """What ``reader`` gives on an intact copy of ``template`` (an error where the bank
        is not for it: ``export`` of an empty bank)."""
        if (template, reader) not in self.expected:
            parent, _, out = self.case_dirs()
            bank = parent / "bank"
            shutil.copytree(self.templates[template], bank)
            got = self.run(reader, bank, out)
            assert got.get("xpbank", True) and got.get("exception") is None and "Traceback" not in str(got)
            assert set(got) & {"ok", "error", "cli"}, f"{reader} on the intact {template} bank: {got}"
            self.expected[(template, reader)] = json.loads(json.dumps(got).replace(str(bank), "BANK"))
            shutil.rmtree(parent.parent)
        return self.expected[(template, reader)]


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory, worker: Worker) -> Fuzz:
    return Fuzz(tmp_path_factory.mktemp("fuzz"), worker)


# -- checks -------------------------------------------------------------------------
def _snapshot(directory: Path, skip: Path) -> dict[str, tuple[Any, ...]]:
    """Every entry under ``directory`` but ``skip``: type, size, mtime, link target (lstat only)."""
    seen = {}
    for where, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if Path(where, d) != skip]
        for name in dirs + files:
            path = os.path.join(where, name)
            info = os.lstat(path)
            link = os.readlink(path) if stat.S_ISLNK(info.st_mode) else None
            seen[os.path.relpath(path, directory)] = (
                stat.S_IFMT(info.st_mode),
                info.st_size,
                info.st_mtime_ns,
                link,
            )
    return seen


def _succeeded(reply: dict[str, Any]) -> bool:
    if "ok" in reply:
        return True
    return "cli" in reply and reply["cli"] == 0 and reply["exception"] is None


def _comparable(reader: str, reply: dict[str, Any]) -> Any:
    """The part of a reply that an intact bank fixes (paths in it: ``BANK``)."""
    if "error" in reply:
        return reply["error"], reply["message"]
    if "ok" in reply:
        ok = reply["ok"]
        if "banks" in ok:
            return {name: (b["error"], b["size"], b["capacity"]) for name, b in ok["banks"].items()}
        return ok
    if reader == "cli_ls":
        return "corrupt" not in reply["stdout"]
    return reply["cli"], reply["stderr"]


def judge(
    reader: str, reply: dict[str, Any], bank: Path, plan: list[tuple[Any, ...]], fuzz: Fuzz, template: str
) -> None:
    """Fail unless ``reply`` is an allowed outcome of ``reader`` on the mutated ``bank``."""
    assert "hang" not in reply, f"{reader} hangs: {reply['hang']}"
    assert "crash" not in reply, f"{reader} crashed the worker: {reply['crash']}"
    assert reply.get("error") != "MemoryError", f"{reader} went past the address-space bound"
    for name, summary in reply.get("ok", {}).get("banks", {}).items():  # ls's quick check
        assert summary["quick_agrees"] is not False, f"xpbank ls and list_banks disagree on {name}: {summary}"
    named = str(bank)
    reply = json.loads(json.dumps(reply).replace(named, "BANK"))
    named, intact = "BANK", fuzz.intact(template, reader)
    if _comparable(reader, reply) == _comparable(reader, intact):
        return  # what the intact bank gives (a result, or the error of a bank not for it)
    if "error" in reply:
        assert reply["xpbank"], (
            f"{reader} raised {reply['error']}: {reply['message']}\n{reply.get('traceback')}"
        )
        assert named in reply["message"], f"{reader}'s error names no path in the bank: {reply['message']}"
    elif "cli" in reply:
        assert reply["exception"] is None, f"{reader}: {reply['exception']}\n{reply['traceback']}"
        assert "Traceback" not in reply["stdout"] + reply["stderr"], reply
        if reader == "cli_ls":
            assert reply["cli"] == 0 and bank.name in reply["stdout"], reply
        else:
            assert reply["cli"] in (0, 1), reply
        if reply["cli"] == 1:
            lines = reply["stderr"].strip().splitlines()
            assert lines and lines[0].startswith("error: ") and named in reply["stderr"], reply
    else:
        for summary in reply["ok"].get("banks", {}).values():
            assert summary["error"] is None or named in summary["error"], summary
    kinds = {m[0] for m in plan}
    if kinds <= set(PRESERVING_KINDS):  # the same bank: it must read, and read the same
        raise AssertionError(f"{reader} on a bank whose meaning was kept: {reply}, intact: {intact}")
    if kinds <= set(BYTE_KINDS) and "ok" in reply and "banks" not in reply["ok"]:
        touched = {m[-1] for m in plan}  # "data/..." or "state/..." (see _plan)
        if reader in VERIFYING or touched <= {"state"}:  # state files: always checked
            assert reply["ok"] == intact.get("ok"), f"{reader} returned damaged data"


# -- the fuzz -----------------------------------------------------------------------
_TARGET = st.integers(0, 1000)
_BYTES = st.one_of(  # the content of one file
    st.tuples(st.just("flip"), _TARGET, st.floats(0, 1, allow_nan=False), st.integers(1, 255)),
    st.tuples(st.just("truncate"), _TARGET, st.floats(0, 1, allow_nan=False)),
    st.tuples(st.just("extend"), _TARGET, st.integers(1, 64), st.integers(0, 255)),
    st.tuples(st.just("sparse"), _TARGET, st.sampled_from([20, 33, 40])),
)
_PRESERVING = st.tuples(st.sampled_from(PRESERVING_KINDS), _TARGET)


def _mutation() -> st.SearchStrategy[tuple[Any, ...]]:
    target = _TARGET
    return st.one_of(
        _BYTES,
        st.tuples(st.sampled_from(FILE_KINDS), target, target),
        st.tuples(st.just("json_set"), target, st.integers(0, N_VALUES), st.integers(4301, 6000)),
        st.tuples(st.just("json_remove"), target),
        st.tuples(st.just("json_deep"), target, st.sampled_from([50, 1000, 100_000])),
        st.tuples(st.just("digit"), target, st.integers(1, 9)),
        _PRESERVING,
    )


def _check(fuzz: Fuzz, template: str, plan: list[tuple[Any, ...]]) -> None:
    parent, outside, out = fuzz.case_dirs()
    bank = parent / "bank"
    shutil.copytree(fuzz.templates[template], bank)
    (outside / "sentinel").write_bytes(b"a file outside the bank")
    done = [apply(bank, outside, m) for m in plan]
    plan = [
        (*m, d.split()[1].split("/")[0]) for m, d in zip(plan, done, strict=True) if not d.startswith("skip")
    ]
    for reader in READERS:
        before = _snapshot(parent, skip=bank)
        reply = fuzz.run(reader, bank, out)
        assert _snapshot(parent, skip=bank) == before, f"{reader} wrote outside the bank ({done})"
        assert set(os.listdir(out)) <= {"merged", "export.npz"}, f"{reader} left {os.listdir(out)} ({done})"
        event(f"{reader}: {'returned' if _succeeded(reply) else 'refused'}")  # --hypothesis-show-statistics
        try:
            judge(reader, reply, bank, plan, fuzz, template)
        except AssertionError as exc:
            raise AssertionError(f"template {template!r}, mutations {done}: {exc}") from None
    shutil.rmtree(parent.parent)


def _fuzz(examples: int) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# any mix of mutations; or only edits that keep the meaning (every reader must return the
# intact result); or only bytes of files (a checking reader returns intact data or fails)
PLANS = st.tuples(
    st.sampled_from(sorted(TEMPLATES)),
    st.one_of(
        st.lists(_mutation(), min_size=1, max_size=3),
        st.lists(_PRESERVING, min_size=1, max_size=2),
        st.lists(_BYTES, min_size=1, max_size=2),
    ),
)


@seed(18)
@_fuzz(examples=36)
@given(case=PLANS)
def test_every_reader_survives_mutated_banks(fuzz: Fuzz, case: tuple[str, list[tuple[Any, ...]]]) -> None:
    _check(fuzz, *case)


@pytest.mark.slow
@seed(1818)
@_fuzz(examples=150)
@given(case=PLANS)
def test_every_reader_survives_mutated_banks_long(
    fuzz: Fuzz, case: tuple[str, list[tuple[Any, ...]]]
) -> None:
    _check(fuzz, *case)
