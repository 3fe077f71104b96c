"""The built documentation site: cross-references render as links, the reference shows the
public API only, the build helpers are not published, and code blocks fit the page."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLE = re.compile(r":(class|meth|func|attr|mod|data|exc|obj):")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return out


def test_no_raw_sphinx_roles_in_the_built_html(site: Path) -> None:
    raw = {
        str(page.relative_to(site)): sorted(set(ROLE.findall(page.read_text())))
        for page in site.rglob("*.html")
        if ROLE.search(page.read_text())
    }
    assert raw == {}


def test_roles_became_links(site: Path) -> None:
    replay = (site / "reference" / "replay" / "index.html").read_text()
    assert 'href="../core/#xpbank.PrioritizedSampler"' in replay or ('href="#xpbank.EpisodeIndex"' in replay)
    assert "<autoref" not in replay and "&lt;autoref" not in replay


def test_reference_has_no_private_members(site: Path) -> None:
    ids = re.findall(r'id="(xpbank\.[\w.]+)"', "".join(p.read_text() for p in site.rglob("*.html")))
    private = [i for i in ids if re.search(r"\._[^_]|\.__(?!len__$|or__$)", i)]
    assert ids and private == []


def test_build_helpers_are_not_published(site: Path) -> None:
    assert not list(site.rglob("*.py"))


def test_docs_code_lines_fit_the_page() -> None:
    long = [
        f"{page.relative_to(ROOT)}: {line}"
        for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
        for block in FENCE.findall(page.read_text())
        for line in block.splitlines()
        if len(line) > 88
    ]
    assert long == []
