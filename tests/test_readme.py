"""The README's quickstart runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_quickstart_runs_and_does_what_it_says() -> None:
    text = README.read_text()
    match = re.search(r"## Quickstart\n\n```python\n(.*?)```", text, re.S)
    assert match is not None, "README has no Quickstart code block"
    scope: dict[str, object] = {}
    exec(compile(match.group(1), str(README), "exec"), scope)
    rb, batch = scope["rb"], scope["batch"]
    assert len(rb) == 256
    assert batch.batch_size == torch.Size([32])
    stored = rb.sample_by_index(batch["index"] - rb.sample_by_index(0)["index"])
    assert torch.equal(stored["reward"], torch.full((32,), 0.5))


def test_readme_names_the_two_commands_and_ci_runs_the_test_one() -> None:
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    ci = (README.parent / ".ci" / "run").read_text()
    assert "make test" in ci
