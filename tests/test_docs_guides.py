"""Every guide's Python runs as written: the code blocks of a page, in order, in one scope,
as a reader pasting them one after the other would run them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PYTHON = re.compile(r"^```python\n(.*?)^```", re.M | re.S)

# pages whose code needs what a test run does not have; each says why
NOT_RUN = {
    "guides/ray.md": "starts a Ray cluster (tests/test_ray*.py cover the same calls)",
}
# the extras a page's code imports: the page is skipped where one is missing
NEEDS = {
    "guides/collecting.md": ["gymnasium"],
    "guides/sb3.md": ["stable_baselines3", "gymnasium"],
    "guides/her.md": ["stable_baselines3", "gymnasium"],  # its last block trains SB3's DQN with HER
    "guides/minari.md": ["minari"],
    "guides/command-line.md": ["typer", "rich"],
    "getting-started.md": ["gymnasium"],
}

PAGES = sorted(
    str(p.relative_to(DOCS))
    for p in [DOCS / "getting-started.md", *DOCS.glob("guides/*.md")]
    if PYTHON.search(p.read_text())
)


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_guide_code_runs(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if page in NOT_RUN:
        pytest.skip(NOT_RUN[page])
    for module in NEEDS.get(page, []):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)  # pages write runs/, datasets/ ... relative to where they run
    scope: dict[str, object] = {"__name__": "__guide__"}
    for i, block in enumerate(PYTHON.findall((DOCS / page).read_text())):
        exec(compile(block, f"{DOCS / page} (block {i + 1})", "exec"), scope)


def test_every_guide_has_code_that_runs_or_says_why_not() -> None:
    guides = {str(p.relative_to(DOCS)) for p in DOCS.glob("guides/*.md")}
    without = sorted(g for g in guides - set(PAGES) if g not in ("guides/seed-apis.md",))
    assert without == [], "guides without a python block"
    assert set(NOT_RUN) <= guides
