"""A bank is untrusted input: reading one never hangs (FIFOs, devices), never allocates
more than its files justify, never follows a link out, and reports a malformed manifest
as one CorruptBankError naming the file (list_banks and ``xpbank ls`` go on)."""

from __future__ import annotations

import io
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import xpbank
from bank_cases import edit_manifest
from helpers import child_env, make_batch, transition_spec
from xpbank import BankError, CorruptBankError, ReplayBuffer
from xpbank.sampler.sumtree import level_sizes
from xpbank.spec.spec import Spec
from xpbank.tools.cli import build_app
from xpbank.tools.import_bank import merge_banks

SRC = str(Path(xpbank.__file__).parents[1])
TESTS = str(Path(__file__).parent)
MANIFEST_MAX_BYTES = 16 << 20  # the limit docs/bank-format.md documents

READERS: dict[str, Callable[[Path], Any]] = {
    "load": lambda p: xpbank.load(p),
    "open_bank": lambda p: xpbank.open_bank(p, "r"),
    "open_bank_rw": lambda p: xpbank.open_bank(p, "r+"),
    "merge": lambda p: xpbank.merge(p, p),
}


def _within(fn: Callable[[], Any], seconds: float = 30) -> BaseException | None:
    """Run ``fn`` in a daemon thread; its exception (``None``: returned). Fails if it hangs."""
    box: list[BaseException | None] = []

    def run() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the reader hangs"
    return box[0]


def _replace_with(path: Path, kind: str) -> None:
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)  # AF_UNIX paths are short
        try:
            sock.bind(path.name)
        finally:
            os.chdir(cwd)
            sock.close()


_KIND_WORD = {"fifo": "FIFO", "directory": "directory", "socket": "socket"}


@pytest.mark.parametrize("kind", ["fifo", "directory", "socket"])
@pytest.mark.parametrize("rel", ["manifest.json", "data/reward.npy", "state/g0_0.npy"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_only_regular_files_are_read(bank: Path, kind: str, rel: str, reader: str) -> None:
    _replace_with(bank / rel, kind)
    exc = _within(lambda: READERS[reader](bank))
    match = rf"{rel}: is a {_KIND_WORD[kind]}, not a regular file"
    with pytest.raises(CorruptBankError, match=match):
        raise exc or AssertionError("no error")
    exc = _within(lambda: xpbank.list_banks(bank.parent))
    assert exc is None


def test_list_banks_and_cli_do_not_block_on_a_fifo(bank: Path) -> None:
    _replace_with(bank / "manifest.json", "fifo")
    got: list[Any] = []
    assert _within(lambda: got.append(xpbank.list_banks(bank.parent))) is None
    [summary] = got[0]
    assert summary.error is not None and "manifest.json: is a FIFO, not a regular file" in summary.error
    for command, code in ((["ls", bank.parent], 0), (["inspect", bank], 1), (["verify", bank], 1)):
        results: list[Any] = []

        def invoke(args: list[Any] = command, out: list[Any] = results) -> None:
            out.append(CliRunner().invoke(build_app(), [str(a) for a in args]))

        assert _within(invoke) is None
        assert results[0].exit_code == code
        if code == 0:
            assert "corrupt" in results[0].stdout
        else:
            assert "manifest.json: is a FIFO" in results[0].stderr


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("rel", ["manifest.json", "data/reward.npy"])
def test_a_directory_in_place_of_a_file_leaks_no_descriptor(bank: Path, rel: str) -> None:
    _replace_with(bank / rel, "directory")
    before = _open_fds()
    for _ in range(300):
        with pytest.raises(CorruptBankError, match=rf"bank/{rel}: is a directory, not a regular file"):
            xpbank.open_bank(bank)
    assert _open_fds() <= before + 5


def test_manifest_size_is_capped(bank: Path, tmp_path: Path) -> None:
    with open(bank / "manifest.json", "r+b") as f:
        f.truncate(MANIFEST_MAX_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(CorruptBankError, match=r"manifest.json: is 16,777,217 bytes; the limit"):
        xpbank.open_bank(bank)
    [summary] = xpbank.list_banks(bank.parent)
    assert summary.error is not None and "the limit is" in summary.error


@pytest.mark.parametrize("rel", ["manifest.json", "data/reward.npy", "state/g0_0.npy"])
def test_links_to_devices_are_refused(bank: Path, rel: str) -> None:
    (bank / rel).unlink()
    os.symlink("/dev/zero", bank / rel)
    got = _run_limited(  # in a subprocess with a memory limit: a reader of /dev/zero never ends
        f"try:\n    xpbank.load({str(bank)!r})\n"
        "except xpbank.CorruptBankError as exc:\n    print('refused:', exc)\n",
        timeout=60,
    )
    assert re.search(rf"refused: .*{rel}: (is a symbolic link|file is a link that leaves)", got.stdout), got


def _run_limited(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run ``code`` after importing xpbank, with 1.5 GiB more address space than that took."""
    prelude = (
        "import resource, sys, torch, xpbank\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + (3 << 29), resource.RLIM_INFINITY))\n"
    )
    env = child_env(SRC, TESTS, OMP_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout, env=env
    )


_ZERO_SPEC = Spec.from_dict({"fields": [{"key": ["x"], "shape": [0], "dtype": "float32"}]})


def _zero_byte_bank(tmp_path: Path, capacity: int) -> Path:
    rb = ReplayBuffer(
        8, Spec.from_dict({"fields": [{"key": ["x"], "shape": [0], "dtype": "float32"}]}), num_envs=1
    )
    rb.extend({"x": torch.zeros(4, 0)})
    path = xpbank.save(rb, tmp_path / "zero")

    data = path / "data" / "x.npy"
    np.save(data, np.zeros((capacity, 0), np.float32), allow_pickle=False)  # a header only

    def claim(m: dict[str, Any]) -> None:
        m.update(capacity=capacity, cursor=m["next_id"] % capacity)
        m["buffer"]["capacity"] = capacity
        m["data"][0].update(nbytes=data.stat().st_size)
        m["data"][0]["shape"][0] = capacity

    edit_manifest(path, claim)
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("capacity", "reader"), [(10**8, "open_bank(p, 'r')"), (10**15, "load(p)")])
def test_a_capacity_the_files_do_not_back_is_refused_before_allocating(
    tmp_path: Path, capacity: int, reader: str
) -> None:
    path = _zero_byte_bank(tmp_path, capacity)
    got = _run_limited(
        f"p = {str(path)!r}\n"
        f"try:\n    xpbank.{reader}\n"
        "except xpbank.CorruptBankError as exc:\n    print('refused:', exc)\n"
    )
    assert "refused:" in got.stdout, got.stderr[-2000:]
    assert "manifest.json: 'capacity' " in got.stdout and "is not backed by the bank's files" in got.stdout


def test_a_capacity_without_bytes_below_the_free_slots_still_opens(tmp_path: Path) -> None:
    rb = ReplayBuffer(100_000, _ZERO_SPEC, num_envs=1)
    rb.extend({"x": torch.zeros(4, 0)})
    path = xpbank.save(rb, tmp_path / "zero")
    assert len(xpbank.open_bank(path)) == 4 and len(xpbank.load(path)) == 4
    assert len(xpbank.open_bank(xpbank.save(ReplayBuffer(100_000), tmp_path / "empty"))) == 0


def test_an_unreferenced_state_file_is_not_read(bank: Path) -> None:
    state = bank / "state" / "g0_0.npy"
    size = state.stat().st_size

    def extra(m: dict[str, Any]) -> None:  # a listed state file nothing refers to
        m["state_files"].append({**m["state_files"][0], "path": "state/g0_99.npy", "checksum": None})

    edit_manifest(bank, extra)
    with open(state, "rb") as src, open(bank / "state" / "g0_99.npy", "wb") as dst:
        dst.write(src.read())
    from xpbank.bank import snapshot as snap_module

    reads: list[str] = []
    real = snap_module.read_checked
    snap_module.read_checked = lambda snap, entry, *a, **k: (
        reads.append(entry.path),
        real(snap, entry, *a, **k),
    )[1]
    try:
        xpbank.open_bank(bank)
    finally:
        snap_module.read_checked = real
    assert "state/g0_99.npy" not in reads and size > 0


def test_a_header_length_past_the_file_is_refused(bank: Path) -> None:
    path = bank / "data" / "reward.npy"
    raw = bytearray(path.read_bytes())
    raw[6:8], raw[8:10] = b"\x02\x00", b"\x00\x00"  # version 2.0: a 4-byte header length
    raw[8:12] = (1 << 31).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(CorruptBankError, match=r"reward.npy: not a valid .npy file .*does not fit"):
        xpbank.open_bank(bank)


def test_manifest_symlinked_out_is_refused(bank: Path, tmp_path: Path) -> None:
    os.replace(bank / "manifest.json", tmp_path / "elsewhere.json")
    os.symlink(tmp_path / "elsewhere.json", bank / "manifest.json")
    with pytest.raises(CorruptBankError, match=r"manifest.json: is a symbolic link"):
        xpbank.open_bank(bank)
    [summary] = xpbank.list_banks(bank.parent)
    assert summary.error is not None and "symbolic link" in summary.error


@pytest.mark.parametrize("top", ["data", "state"])
def test_a_bank_without_spec_never_writes_through_a_linked_directory(tmp_path: Path, top: str) -> None:
    path = xpbank.save(ReplayBuffer(8), tmp_path / "empty")
    outside = tmp_path / "outside"
    outside.mkdir()
    if (path / top).exists():
        os.replace(path / top, outside / top)
    os.symlink(outside, path / top)
    with pytest.raises(
        CorruptBankError, match=rf"empty/{top}(/g0_0.npy)?: (is a symbolic link|file is a link)"
    ):
        bank = xpbank.open_bank(path, "r+")
        bank.extend({"x": torch.zeros(2)})
        bank.checkpoint()
    assert not (outside / "x.npy").exists()


def test_a_link_inside_the_data_directory_of_a_bank_without_spec(tmp_path: Path) -> None:
    path = xpbank.save(ReplayBuffer(8), tmp_path / "empty")
    (tmp_path / "outside").mkdir()
    (path / "data").mkdir(exist_ok=True)
    os.symlink(tmp_path / "outside", path / "data" / "next")
    with pytest.raises(CorruptBankError, match=r"data/next: is a symbolic link; a bank opened 'r\+'"):
        xpbank.open_bank(path, "r+")


def _prioritized_bank(tmp_path: Path, bad: float) -> Path:
    rb = ReplayBuffer(8, transition_spec(), sampler=xpbank.PrioritizedSampler(), seed=0)
    rb.extend(make_batch(transition_spec(), 8))
    leaves = rb.sampler._sum[0]
    leaves[3] = bad  # impossible, but saved with a valid checksum
    return xpbank.save(rb, tmp_path / "prio")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_impossible_priorities_are_refused_on_read(tmp_path: Path, bad: float) -> None:
    path = _prioritized_bank(tmp_path, bad)
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=r"manifest.json: 'state' cannot be restored .*priorities"):
            reader(path)


_DEEP = '{"a": ' * 100_000 + "1" + "}" * 100_000

MALFORMED: dict[str, tuple[Callable[[dict[str, Any]], None] | str, str]] = {
    "huge int": ("huge", r"manifest.json: is not valid JSON .*digits"),
    "deep nesting": ("deep", r"manifest.json: is nested too deeply"),
    "bad dtype": (lambda m: m["data"][0].update(dtype="<q99"), r"'data/obs.npy'\): unknown dtype '<q99'"),
    "subarray dtype": (lambda m: m["data"][0].update(dtype="(2,)<f4"), r"is not a plain numeric dtype"),
    "qint8": (
        lambda m: m["spec"]["fields"][0].update(dtype="qint8"),
        r"'spec' is malformed: .*qint8 cannot be stored",
    ),
    "huge shape": (
        lambda m: m["state_files"][0].update(shape=[0, 10**30]),
        r"'state/g0_0.npy'\): 'shape' \[0, 10{30}\] is too large",
    ),
    "nbytes too small": (lambda m: m["data"][0].update(nbytes=10), r"'nbytes' 10 is less than the \[8, 3\]"),
    "alpha": (
        lambda m: m["buffer"].update(sampler={"name": "prioritized", "config": {"alpha": -1}}),
        r"'buffer' cannot be rebuilt: alpha",
    ),
    "num_envs": (lambda m: m["buffer"].update(num_envs=-3), r"'buffer' cannot be rebuilt: .*num_envs"),
    "nstep": (lambda m: m["buffer"].update(nstep={"n": 0}), r"'buffer' cannot be rebuilt: .*n"),
    # sizes of per-env and per-step arrays: refused before allocating exabytes
    "huge num_envs": (
        lambda m: m["buffer"].update(num_envs=10**18),
        r"'buffer.num_envs' 1,000,000,000,000,000,000 is larger than the bank can hold \(16,777,216",
    ),
    "huge nstep": (
        lambda m: m["buffer"].update(nstep={"n": 10**12, "gamma": 0.9}),
        r"'buffer.nstep.n' 1,000,000,000,000 is larger than the bank can hold",
    ),
    "spec null": (
        lambda m: m.update(spec=None, data=[]),
        r"'spec' is null \(no fields\) but the bank claims size 8",
    ),
}


def _malform(bank: Path, name: str) -> None:
    edit = MALFORMED[name][0]
    if edit == "huge":
        text = (bank / "manifest.json").read_text()
        (bank / "manifest.json").write_text(text.replace('"size": 8', '"size": ' + "9" * 5000, 1))
    elif edit == "deep":
        (bank / "manifest.json").write_text(_DEEP)
    else:
        assert callable(edit)
        edit_manifest(bank, edit)


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_manifests_are_corrupt_bank_errors(bank: Path, name: str) -> None:
    _malform(bank, name)
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=MALFORMED[name][1]):
            reader(bank)


def test_list_banks_and_ls_report_each_bad_bank_and_go_on(tmp_path: Path) -> None:
    spec = transition_spec()
    rb = ReplayBuffer(8, spec, seed=0)
    rb.extend(make_batch(spec, 11))
    xpbank.save(rb, tmp_path / "banks" / "good")
    parse_level = ["huge int", "deep nesting", "bad dtype", "qint8", "huge shape", "spec null"]
    parse_level += ["alpha", "num_envs", "nstep", "huge num_envs", "huge nstep"]  # options: no data read
    for name in parse_level:
        _malform(xpbank.save(rb, tmp_path / "banks" / name.replace(" ", "_")), name)
    summaries = xpbank.list_banks(tmp_path / "banks")
    assert summaries[0].path.name == "good" and summaries[0].error is None
    assert sorted(s.path.name for s in summaries[1:]) == sorted(n.replace(" ", "_") for n in parse_level)
    assert all(s.error and "manifest.json" in s.error for s in summaries[1:]), summaries
    result = CliRunner().invoke(build_app(), ["ls", str(tmp_path / "banks")])
    assert result.exit_code == 0, result.stderr
    assert "Traceback" not in result.stdout
    for name in parse_level:  # one line each
        assert (
            sum(line.lstrip("│ ").startswith(name.replace(" ", "_")) for line in result.stdout.splitlines())
            == 1
        )


def test_ls_output_is_bounded_by_the_number_of_banks(bank: Path) -> None:
    edit_manifest(bank, lambda m: m.update(session_id="[bold]x\n" * 5_000))
    result = CliRunner().invoke(build_app(), ["ls", "--long", str(bank.parent)])
    assert result.exit_code == 0
    assert len(result.stdout) < 5_000 and "[bold]x" in result.stdout


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("name", ["lr=1e-3**2", "run[1]", "a*b?"])
def test_bank_names_are_not_glob_patterns(tmp_path: Path, name: str) -> None:
    rb = ReplayBuffer(4)
    rb.extend({"x": torch.zeros(2)})
    dead = tmp_path / f".{name}.tmp-{_dead_pid()}-0000"
    dead.mkdir()
    alive = tmp_path / f".{name}.tmp-{os.getppid()}-0000"  # a live process: kept
    alive.mkdir()
    path = xpbank.save(rb, tmp_path / name)
    assert xpbank.load(path).sample_all()["x"].tolist() == [0.0, 0.0]
    assert not dead.exists() and alive.exists()


def test_a_killed_merge_leaves_nothing_behind_for_long(tmp_path: Path) -> None:
    rb = ReplayBuffer(4)
    rb.extend({"x": torch.zeros(2)})
    a = xpbank.save(rb, tmp_path / "a")
    dead = _dead_pid()
    leftover = tmp_path / f".out.import-{dead}-0000"
    leftover.mkdir()
    (leftover / "manifest.json").write_text("{}")
    # a merge killed while saving its empty bank leaves that save's own temporary (found
    # by test_bank_crash's merge kill test)
    (tmp_path / f"..out.import-{dead}-0000.tmp-{dead}-0000").mkdir()
    merge_banks(a, a, tmp_path / "out")
    assert not leftover.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "out"]


def test_state_file_bytes_bound_what_is_read(bank: Path) -> None:
    """A state file is read only after its size matched the manifest and its header."""
    raw = np.load(bank / "state" / "g0_0.npy", allow_pickle=False)
    assert raw.size > 0
    with open(bank / "state" / "g0_0.npy", "r+b") as f:
        f.truncate(1 << 40)  # sparse, a terabyte
    with pytest.raises(CorruptBankError, match=r"state/g0_0.npy: is 1099511627776 bytes, expected"):
        xpbank.load(bank)
    with pytest.raises(BankError):
        xpbank.open_bank(bank)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_symlink_loop_is_a_corrupt_bank_error(bank: Path, reader: str) -> None:
    """Found by tests/adversarial: ``state/`` replaced by a link to ``state/g0_0.npy`` resolves
    in a loop (Path.resolve raises RuntimeError for it before Python 3.13)."""
    shutil.rmtree(bank / "state")
    os.symlink(bank / "state" / "g0_0.npy", bank / "state")
    with pytest.raises(CorruptBankError, match=r"bank/state(/g0_0.npy)?: "):
        READERS[reader](bank)


def test_a_malformed_state_reference_names_the_manifest(bank: Path) -> None:
    """Found by tests/adversarial: the codec's errors name the entry; the reader adds the file."""
    edit_manifest(bank, lambda m: m["state"]["generator"].pop("kind"))
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=r"bank/manifest.json: state.generator: malformed array"):
            reader(bank)


@pytest.mark.parametrize("dtype", ["uint1", "qint8", "int16"])  # int16: NumPy has it, not these bytes
def test_a_state_array_of_a_dtype_numpy_cannot_hold_names_the_manifest(bank: Path, dtype: str) -> None:
    """Found by tests/adversarial (a digit of "uint8" changed): a torch dtype without a NumPy
    twin in a state reference is the bank's fault, not a SpecError without a path."""
    edit_manifest(bank, lambda m: m["state"]["generator"].update(dtype=dtype))
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=rf"bank/manifest.json: state.generator: .*torch {dtype}"):
            reader(bank)


def test_a_npy_header_with_an_unclosed_bracket_is_corrupt(tmp_path: Path) -> None:
    """Found by the adversarial fuzz: NumPy retries a header that does not parse through
    ``tokenize``, which raises ``TokenError`` for an unclosed bracket (a flipped ``)``)."""
    from xpbank.bank.format import read_npy_header

    buf = io.BytesIO()
    np.save(buf, np.zeros((3, 2), dtype=np.int64))
    raw = bytearray(buf.getvalue())
    raw[raw.index(b")")] = ord(" ")
    path = tmp_path / "action.npy"
    path.write_bytes(bytes(raw))
    with open(path, "rb") as f, pytest.raises(CorruptBankError, match=r"action.npy: not a valid .npy file"):
        read_npy_header(f, "action.npy")


# -- a prioritized sampler's trees against the manifest's ring ----------------------------
def _prioritized(capacity: int, items: int) -> ReplayBuffer:
    spec = transition_spec()
    rb = ReplayBuffer(capacity, spec, sampler=xpbank.PrioritizedSampler(), seed=1)
    if items:
        rb.extend(make_batch(spec, items))
        live = rb.sample_all()["index"]
        rb.update_priority(live, torch.linspace(0.5, 3.0, len(live)))
    return rb


@pytest.mark.parametrize("capacity", [1, 5, 16, 17, 40, 100, 257, 5000])
@pytest.mark.parametrize("fill", ["empty", "part", "wrapped"])
def test_honest_prioritized_banks_of_any_capacity_load(tmp_path: Path, capacity: int, fill: str) -> None:
    """The sampler state's capacity is the padded leaf count (48 for 40 slots, 0 before the
    first write), not the ring's capacity: every honest bank still loads and samples the same."""
    items = {"empty": 0, "part": max(1, capacity // 2), "wrapped": capacity + capacity // 3 + 1}[fill]
    rb = _prioritized(capacity, items)
    path = xpbank.save(rb, tmp_path / "prio")
    saved = rb.state_dict(data=False)["sampler"]["capacity"]
    assert saved == (0 if fill == "empty" else level_sizes(capacity)[0])
    for reader in (xpbank.load, xpbank.open_bank):
        back = reader(path)
        assert len(back) == len(rb)
        if len(rb):
            assert torch.equal(back.sample(7)["index"], _prioritized(capacity, items).sample(7)["index"])


@pytest.mark.parametrize(
    ("capacity", "claimed"),
    [(40, 40), (40, 64), (40, 16), (40, 49), (100, 100), (100, 128), (17, 17), (17, 16), (5, 1 << 16)],
)
def test_a_tree_capacity_that_does_not_fit_the_ring_is_corrupt(
    tmp_path: Path, capacity: int, claimed: int
) -> None:
    """Only the padded leaf count of the ring (48 for 40 slots) or 0 is a tree capacity an
    honest bank holds; the raw ring capacity (40) is not one of them."""
    path = xpbank.save(_prioritized(capacity, capacity), tmp_path / "prio")
    edit_manifest(path, lambda m: m["state"]["sampler"].update(capacity=claimed))
    leaves = level_sizes(capacity)[0]
    for reader in (xpbank.load, xpbank.open_bank, lambda p: xpbank.open_bank(p, "r+")):
        with pytest.raises(
            CorruptBankError,
            match=rf"prio/manifest.json: 'state.sampler': 'capacity' {claimed} does not fit the ring "
            rf"of {capacity} slots: its tree has {leaves} leaves .* in .*prio/state/g0_\d+.npy",
        ):
            reader(path)


def test_a_tree_saved_for_another_capacity_is_corrupt(tmp_path: Path) -> None:
    rb = _prioritized(5, 5)
    rb.sampler._allocate(1 << 16)  # an honest save of an impossible state: checksums are valid
    path = xpbank.save(rb, tmp_path / "prio")
    with pytest.raises(CorruptBankError, match=r"'capacity' 65536 does not fit the ring of 5 slots"):
        xpbank.load(path)


def test_more_priorities_than_slots_is_corrupt(tmp_path: Path) -> None:
    rb = _prioritized(40, 40)
    rb.sampler._filled = 48  # the 48-leaf tree's padding saved as priorities (valid checksums)
    path = xpbank.save(rb, tmp_path / "prio")
    with pytest.raises(CorruptBankError, match=r"prio/state/g0_\d+.npy: \[48\] priorities for a ring of 40"):
        xpbank.load(path)


def test_a_huge_tree_capacity_in_the_manifest_is_refused_before_allocating(tmp_path: Path) -> None:
    path = xpbank.save(_prioritized(40, 10), tmp_path / "prio")
    edit_manifest(path, lambda m: m["state"]["sampler"].update(capacity=1 << 40))
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=r"'capacity' 1099511627776 does not fit the ring of 40"):
            reader(path)


@pytest.mark.parametrize("value", [None, 3, "x", [], [1, 2]])
@pytest.mark.parametrize("node", ["storage", "ring", "sampler"])
def test_a_state_node_of_another_type_is_corrupt(tmp_path: Path, bank: Path, node: str, value: Any) -> None:
    """Found by tests/adversarial: ``state.storage: null`` escaped as AttributeError. (A
    uniform sampler keeps no state: the prioritized one's is replaced.)"""
    if node == "sampler":
        bank = xpbank.save(_prioritized(40, 10), tmp_path / "prio")
    edit_manifest(bank, lambda m: m["state"].update({node: value}))
    for reader in (xpbank.load, xpbank.open_bank):
        with pytest.raises(CorruptBankError, match=rf"{bank.name}/manifest.json: 'state"):
            reader(bank)


@pytest.mark.parametrize(
    ("kind", "mode", "device"),
    [("character device", stat.S_IFCHR, (1, 5)), ("block device", stat.S_IFBLK, (7, 0))],
)
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_device_node_in_place_of_a_file_is_refused(
    bank: Path, reader: str, kind: str, mode: int, device: tuple[int, int]
) -> None:
    """A device node itself (not a link to one): refused from its lstat, never opened."""
    path = bank / "data" / "reward.npy"
    path.unlink()
    try:
        os.mknod(path, mode | 0o600, os.makedev(*device))
    except (PermissionError, OSError):
        pytest.skip("cannot create a device node here")
    exc = _within(lambda: READERS[reader](bank))
    with pytest.raises(CorruptBankError, match=rf"data/reward.npy: is a {kind}, not a regular file"):
        raise exc or AssertionError("no error")


def test_verify_refuses_spec_null_with_items(bank: Path) -> None:
    """``spec: null`` while claiming items: ``xpbank verify`` fails too (it said OK)."""
    edit_manifest(bank, lambda m: m.update(spec=None, data=[]))
    result = CliRunner().invoke(build_app(), ["verify", str(bank)])
    assert result.exit_code == 1
    assert "manifest.json: 'spec' is null (no fields) but the bank claims size 8" in result.stderr


@pytest.mark.parametrize(("num_envs", "n"), [(1, 1), (4, 3), (16, 5), (40, 10), (100_000, 50_000)])
def test_honest_num_envs_and_nstep_past_the_probe_ring_still_list_and_load(
    tmp_path: Path, num_envs: int, n: int
) -> None:
    """list_banks checks options on a 16-slot ring: options past it (but within what the
    bank can hold) are not reported, and the bank loads with them."""
    rb = ReplayBuffer(8, transition_spec(), num_envs=num_envs, nstep={"n": n, "gamma": 0.9})
    path = xpbank.save(rb, tmp_path / "banks" / "b")
    [summary] = xpbank.list_banks(tmp_path / "banks")
    assert summary.error is None
    back = xpbank.load(path)
    assert back.config()["num_envs"] == num_envs and back.config()["nstep"]["n"] == n
