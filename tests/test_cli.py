"""The ``xpbank`` command line, driven as a user would: typer's runner and a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import xpbank
from bank_cases import small_bank
from episode_data import filled_buffer, reference_episodes
from helpers import child_env
from xpbank.her import HerSampler
from xpbank.tools.cli import build_app
from xpbank.tools.listing import compact_spec, human_bytes

runner = CliRunner()
SRC = str(Path(xpbank.__file__).parents[1])


def cli(*args: object) -> tuple[int, str, str]:
    result = runner.invoke(build_app(), [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def banks(tmp_path: Path) -> Path:
    """Two banks of the same spec in tmp_path/banks, a non-bank directory and a file beside them."""
    root = tmp_path / "banks"
    xpbank.save(filled_buffer([[4, 7], [5]], 40, 60), root / "a")
    xpbank.save(filled_buffer([[3], [6, 2]], 25, 100, seed=1), root / "b")
    (root / "notes").mkdir()
    (root / "notes" / "x.txt").write_text("not a bank")
    (root / "file.txt").write_text("x")
    return root


def test_ls_lists_banks_only(banks):
    code, out, _ = cli("ls", banks)
    assert code == 0
    assert "2 bank(s)" in out and "60/60" in out and "50/100" in out
    assert "notes" not in out and "file.txt" not in out
    assert human_bytes(sum(f.stat().st_size for f in (banks / "a").rglob("*") if f.is_file())) in out
    assert max(len(line) for line in out.splitlines()) <= 80
    code, out, _ = cli("ls", "--long", banks)
    assert code == 0 and out.count("session_id: ") == 2
    assert f"{sum(f.stat().st_size for f in (banks / 'a').rglob('*') if f.is_file()):,} bytes" in out


def test_ls_puts_corrupt_banks_in_their_own_section(banks):
    (banks / "broken").mkdir()
    (banks / "broken" / "manifest.json").write_text("{not json")
    code, out, _ = cli("ls", banks)
    assert code == 0
    table, corrupt = out.split("corrupt (")
    header = " ".join(table.split())  # rich wraps the header at 80 columns where the path is long
    assert "broken" not in table and "2 bank(s)" in header and "1 corrupt" in header
    assert "broken: " in corrupt and "not valid JSON" in corrupt


def test_compact_spec_summarizes_each_field():
    from xpbank.spec import Field, Spec

    spec = Spec(
        {"obs": Field((84, 84), torch.uint8), ("next", "obs"): Field((3,)), "done": Field((), torch.bool)}
    )
    summary = repr(spec).removeprefix("Spec(").removesuffix(")")
    assert compact_spec(summary) == "obs[84,84] u8, next.obs[3] f32, done bool"


def test_inspect_prints_stats_and_episodes(banks):
    rb = xpbank.load(banks / "a")
    code, out, _ = cli("inspect", banks / "a", "--chunk", 7)
    assert code == 0, out
    assert "60 of 60 items" in " ".join(out.split())  # the first line wraps where the path is long
    reward = rb.sample_all()["reward"].double()
    assert f"{reward.mean().item():.4g}" in out and f"{reward.max().item():.4g}" in out
    want = reference_episodes(rb, 2)
    assert f"episodes: {len(want)} complete ({sum(w['terminated'] for w in want)} terminated" in out
    lengths = [len(w["positions"]) for w in want]
    assert f"length: mean {np.mean(lengths):.4g}" in out


def test_merge_equals_the_python_merge(banks, tmp_path):
    code, out, _ = cli("merge", banks / "a", banks / "b", "-o", tmp_path / "m")
    assert code == 0, out
    got = xpbank.load(tmp_path / "m").sample_all()
    want = xpbank.merge(banks / "a", banks / "b").sample_all()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want.keys(True, True))
    assert cli("verify", tmp_path / "m")[0] == 0


def test_merge_refuses_different_specs_and_writes_nothing(banks, tmp_path):
    rb = xpbank.ReplayBuffer(4)
    rb.extend({"x": torch.zeros(2)})
    xpbank.save(rb, tmp_path / "other")
    code, _, err = cli("merge", banks / "a", tmp_path / "other", "-o", tmp_path / "m")
    assert code == 1 and err.startswith("error: merge: the specs differ") and "Traceback" not in err
    assert not (tmp_path / "m").exists()


def test_npz_round_trip(banks, tmp_path):
    assert cli("export", banks / "a", tmp_path / "a.npz", "--to", "npz")[0] == 0
    arrays = np.load(tmp_path / "a.npz")
    data = xpbank.load(banks / "a").sample_all()
    assert np.array_equal(arrays["next/obs"], data["next", "obs"].numpy())
    code, out, _ = cli("import", tmp_path / "a.npz", "--from", "npz", "-o", tmp_path / "back")
    assert code == 0 and "60 of 60 items" in out
    back = xpbank.load(tmp_path / "back").sample_all()
    assert all(torch.equal(back[k], data[k]) for k in data.keys(True, True) if k != "index")


def test_minari_round_trip_through_the_cli(banks, tmp_path):
    pytest.importorskip("minari")
    code, out, _ = cli("export", banks / "a", tmp_path / "ds", "--to", "minari")
    assert code == 0, out
    code, out, _ = cli("import", tmp_path / "ds", "--from", "minari", "-o", tmp_path / "back")
    assert code == 0, out
    rb, back = xpbank.load(banks / "a"), xpbank.load(tmp_path / "back")
    want = reference_episodes(rb, 2)
    assert len(back) == sum(len(w["positions"]) for w in want)
    data = rb.sample_all()
    order = np.concatenate([w["positions"] for w in want])
    got = back.sample_all()
    for key in ("obs", "action", "reward", "terminated", "truncated", ("next", "obs"), ("info", "step")):
        assert torch.equal(got[key], data[key][order]), key


def test_plot_writes_a_png(banks, tmp_path):
    code, out, _ = cli("plot", banks / "a", "-o", tmp_path / "p.png")
    assert code == 0, out
    image = __import__("matplotlib.image").image.imread(tmp_path / "p.png")
    assert image.shape[0] > 300 and image.shape[1] > 500 and image[..., :3].std() > 0.05


def test_verify_passes_then_fails_on_a_flipped_byte(banks):
    code, out, _ = cli("verify", banks / "a")
    assert code == 0 and "checksum(s) match" in out
    path = banks / "a" / "data" / "reward.npy"
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(bytes(raw))
    code, _, err = cli("verify", banks / "a")
    assert code == 1
    assert err.count("\n") == 1 and "reward.npy: checksum mismatch" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("verify", "{root}/notes"), r"error: .*notes.*"),
        (("verify", "{root}/missing"), r"error: .*missing: no such bank"),
        (("inspect", "{root}/file.txt"), r"error: .*file.txt"),
        (("ls", "{root}/missing"), r"error: list_banks: .*missing is not a directory"),
        (
            ("export", "{root}/a", "{root}/x", "--to", "csv"),
            r"error: --to: expected one of \['minari', 'npz'\], got 'csv'",
        ),
        (("import", "{root}/a", "--from", "npz", "-o", "{root}/b"), r"error: output: .*b already exists"),
        (
            ("import", "{root}/notes", "--from", "minari", "-o", "{root}/c"),
            r"error: source: .*not a Minari dataset",
        ),
        (
            ("import", "{root}/file.txt", "--from", "npz", "-o", "{root}/c"),
            r"error: source: .*not an .npz archive",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_1(banks, args, message):
    before = sorted(p.relative_to(banks) for p in banks.rglob("*"))
    code, _, err = cli(*(a.format(root=banks) for a in args))
    assert code == 1
    assert err.count("\n") == 1 and "Traceback" not in err
    assert re.match(message, err), err
    assert sorted(p.relative_to(banks) for p in banks.rglob("*")) == before  # nothing written


def test_debug_shows_the_exception(banks):
    result = runner.invoke(build_app(), ["--debug", "verify", str(banks / "missing")])
    assert result.exit_code == 1 and isinstance(result.exception, xpbank.BankError)


def test_bench_quick_prints_three_timed_rows():
    code, out, _ = cli("bench", "--quick")
    assert code == 0
    rows = [line for line in out.splitlines() if "B=256" in line]
    assert len(rows) == 3
    for line in rows:
        rate = float(line.split("│")[-2].replace(",", ""))
        assert rate > 0


def test_help_on_every_command():
    for command in ("ls", "inspect", "merge", "export", "import", "plot", "verify", "bench", "demo"):
        code, out, _ = cli(command, "--help")
        assert code == 0 and "Usage" in out, command


def test_python_dash_m_in_a_subprocess(banks):
    """One real process (interpreter start and torch import cost ~10 s here): a corrupt bank."""
    env = child_env(SRC)
    (banks / "a" / "data" / "obs.npy").write_bytes(b"garbage")
    command = [sys.executable, "-m", "xpbank", "verify", str(banks / "a")]
    bad = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr.startswith("error: ") and bad.stderr.count("\n") == 1 and "obs.npy" in bad.stderr


def test_a_missing_cli_extra_names_its_pip_install(monkeypatch, capsys):
    """Without typer (every command) or rich (``ls`` too, which runs without typer), the
    command names the extra, installed from a clone or, once published, from the index."""
    from xpbank import errors
    from xpbank.tools import cli as cli_module
    from xpbank.tools import listing

    def missing(module: str, extra: str) -> None:
        errors.require("xpbank_not_installed", extra)

    hint = "pip install -e '.[cli]' in a clone of xpbank (once published: pip install 'xpbank[cli]')"
    for module, args in ((cli_module, ["verify", "."]), (listing, ["ls", "."])):
        monkeypatch.setattr(module, "require", missing)
        with pytest.raises(SystemExit) as exc:
            cli_module.main(args)
        assert exc.value.code == 2 and hint in capsys.readouterr().err, args


def test_verify_checks_the_stored_rows_of_a_bank_not_full(banks):
    """open_bank(verify=True) hashes the rows the checksum covers, not the whole capacity."""
    assert len(xpbank.load(banks / "b")) < xpbank.load(banks / "b").capacity
    assert xpbank.open_bank(banks / "b", verify=True) is not None
    path = banks / "b" / "data" / "action.npy"
    raw = bytearray(path.read_bytes())
    raw[200] ^= 0x01  # inside the stored rows (the header is 128 bytes, rows of 8)
    path.write_bytes(bytes(raw))
    with pytest.raises(xpbank.CorruptBankError, match=r"action.npy: checksum mismatch"):
        xpbank.open_bank(banks / "b", verify=True)


def test_every_writing_command_takes_relative_paths_and_makes_parents(banks, tmp_path, monkeypatch):
    pytest.importorskip("minari")
    pytest.importorskip("matplotlib")
    monkeypatch.chdir(tmp_path)
    a = os.path.relpath(banks / "a", tmp_path)
    for args in (
        ("export", a, "ds", "--to", "minari"),  # minari once wrote to ds/ds/main_data.hdf5
        ("export", a, "new/deeper/ds", "--to", "minari"),
        ("export", a, "new/x.npz", "--to", "npz"),
        ("import", "ds", "--from", "minari", "-o", "back/m"),
        ("import", "new/x.npz", "--from", "npz", "-o", "back/n"),
        ("merge", a, a, "-o", "more/merged"),
        ("plot", a, "-o", "figs/a.png"),
    ):
        code, out, err = cli(*args)
        assert code == 0, (args, out, err)
    assert len(xpbank.load("back/n")) == 60 and len(xpbank.load("more/merged")) == 120
    assert Path("figs/a.png").stat().st_size > 0 and Path("new/deeper/ds/main_data.hdf5").exists()
    exported = xpbank.export_minari(xpbank.load(a), "py/ds")  # the Python function too
    assert exported == Path("py/ds") and (tmp_path / "py/ds/main_data.hdf5").exists()


def test_a_hindsight_bank_reads_in_a_fresh_process(tmp_path):
    """A bank names its sampler; "her" is known to the bank layer whatever the process
    imported first (``xpbank verify`` and ``ls``' full check once called it unregistered)."""
    small_bank(tmp_path / "her", sampler=HerSampler())
    code = (
        "import sys\n"
        "from xpbank.bank.ops import bank_summary\n"
        f"print(bank_summary(__import__('pathlib').Path({str(tmp_path / 'her')!r})).error)\n"
        "from xpbank.tools.cli import main\n"
        f"main(['verify', {str(tmp_path / 'her')!r}])\n"
    )
    env = child_env(SRC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and out.stdout.startswith("None\nOK "), out.stdout + out.stderr


def test_help_imports_neither_torch_nor_the_buffers():
    code = (
        "import sys\n"
        "from xpbank.tools.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'tensordict', 'numpy', 'xpbank.replay') if m in sys.modules))"
    )
    env = child_env(SRC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert "Usage:" in out.stdout and out.stdout.strip().endswith("[]")
    assert "<bool>" not in out.stdout


def test_ls_does_not_import_torch(banks):
    """``python -m xpbank ls`` reads manifests and checks options without torch, tensordict
    or NumPy (:mod:`xpbank.bank.summary`), for the samplers and options xpbank writes and
    for a corrupt manifest; the same banks through ``list_banks`` (torch) agree."""
    bf16, flag = xpbank.Field((3,), torch.bfloat16), xpbank.Field((), torch.bool)
    spec = xpbank.Spec({"obs": bf16, ("next", "done"): flag})
    batch = {"obs": torch.zeros(4, 3, dtype=torch.bfloat16), ("next", "done"): torch.zeros(4) > 0}
    per = xpbank.PrioritizedSampler(alpha=0.7, beta_steps=100)
    for name, options in {
        "per": {"sampler": per, "nstep": xpbank.NStep(3, 0.9)},
        "seq": {"sampler": xpbank.SequenceSampler(2, burn_in=1, prioritized=True), "num_envs": 2},
        "plain": {"cast": False},
        "her": {"sampler": HerSampler(strategy="episode", info_keys=["index"])},
    }.items():
        rb = xpbank.ReplayBuffer(16, spec, **options)
        rb.extend(batch)
        xpbank.save(rb, banks / name)
    xpbank.save(xpbank.ReplayBuffer(8), banks / "empty")
    (banks / "broken").mkdir()
    (banks / "broken" / "manifest.json").write_text('{"format": "xpbank-bank", "format_version": 1}')
    code = (
        "import runpy, sys\n"
        f"sys.argv = ['xpbank', 'ls', '--long', {str(banks)!r}]\n"
        "try:\n    runpy.run_module('xpbank', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'tensordict', 'numpy') if m in sys.modules))"
    )
    env = child_env(SRC)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    words = " ".join(out.stdout.split())  # the header wraps at 80 columns where the path is long
    assert "7 bank(s) in" in words and "1 corrupt" in words, out.stdout
    assert out.stdout.strip().endswith("[]"), out.stdout
    listed = {b.path.name: b for b in xpbank.list_banks(banks)}
    assert listed["broken"].error is not None and "broken: manifest.json: 'capacity'" in out.stdout
    assert out.stdout.removesuffix("[]\n") == cli("ls", "--long", banks)[1]  # the same as through typer
    flat = re.sub(r"\s", "", out.stdout)  # --long wraps at 80 columns
    for name in ("per", "seq", "plain", "her", "empty", "a", "b"):
        assert re.sub(r"\s", "", f"{name}session_id:{listed[name].session_id}") in flat
        assert re.sub(r"\s", "", f"fields:{listed[name].spec}") in flat
