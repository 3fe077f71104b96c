"""The README's code runs as written, block after block, as a reader would paste it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)


def test_quickstart_runs_and_does_what_it_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gymnasium")  # the collection quickstart
    pytest.importorskip("stable_baselines3")  # the SB3 one
    monkeypatch.chdir(tmp_path)
    text = README.read_text()
    blocks = PYTHON.findall(text.split("## Quickstart", 1)[1])
    assert len(blocks) >= 6, "a quickstart per job"
    scope: dict[str, object] = {"__name__": "__readme__"}
    for block in blocks:
        exec(compile(block, str(README), "exec"), scope)
    batch, ro, collector = scope["batch"], scope["ro"], scope["collector"]
    assert batch.batch_size == torch.Size([32]) and "nstep_return" in batch
    assert "advantage" in next(iter(ro.minibatches(num_minibatches=1, epochs=1)))
    assert len(scope["back"]) == len(scope["rb"]) == 200
    assert len(scope["replay"]) > 0 and collector.episodes
    assert len(scope["shared"]) == 1_600


def test_the_first_quickstart_stores_what_it_wrote() -> None:
    first = PYTHON.findall(README.read_text().split("## Quickstart", 1)[1])[0]
    scope: dict[str, object] = {}
    exec(compile(first, str(README), "exec"), scope)
    rb, batch = scope["rb"], scope["batch"]
    assert len(rb) == 256 and batch.batch_size == torch.Size([32])
    stored = rb.sample_by_index(batch["index"] - rb.sample_by_index(0)["index"])
    assert torch.equal(stored["reward"], torch.full((32,), 0.5))


def test_readme_names_the_two_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in ci


def test_readme_is_a_front_door() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 300
    for internal in ("issue ", "this branch", "provisional", "the lead", "pip install xpbank\n"):
        assert internal not in text.lower(), internal
    links = re.findall(r"\]\(((?:docs|benchmarks)/[^)#]+)", text)
    assert links and [link for link in links if not (ROOT / link).exists()] == []
