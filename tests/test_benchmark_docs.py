"""docs/benchmarks.md is rendered from benchmarks/results/*.json, never typed by hand."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import render_docs  # noqa: E402
from _common import result_document, tables_from_markdown  # noqa: E402


def test_the_committed_page_is_what_the_result_files_say() -> None:
    assert list(render_docs.RESULTS.glob("*.json")), "no result files"
    assert (ROOT / "docs" / "benchmarks.md").read_text() == render_docs.render(), (
        "docs/benchmarks.md is stale: run python benchmarks/render_docs.py"
    )


def test_the_readme_speed_table_is_what_the_result_files_say() -> None:
    text = (ROOT / "README.md").read_text()
    assert text == render_docs.render_readme(text, render_docs.load_results())
    table = text.split(render_docs.START)[1].split(render_docs.END)[0]
    assert table.count("\n|") >= 5, "the README's speed table lost rows: a result file changed shape"


def test_every_result_file_has_the_shared_shape() -> None:
    for path in render_docs.RESULTS.glob("*.json"):
        doc = json.loads(path.read_text())
        assert doc["benchmark"] == path.stem.split(".")[0], path  # name.before.json: an earlier run
        assert f"python benchmarks/{path.stem.split('.')[0]}.py" in doc["command"], path
        assert doc["tables"] and all(t["headers"] and t["rows"] for t in doc["tables"]), path
        for t in doc["tables"]:
            assert all(len(row) == len(t["headers"]) for row in t["rows"]), (path, t["title"])


def test_a_new_benchmark_file_renders_with_its_tables(tmp_path: Path) -> None:
    printed = (
        "# my bench\n\n## Sample B=8\n\n| lib | µs |\n|---|---|\n| xpbank | 1.5 |\n| raw | 1.0 |\n"
        "\nbest of 3\n"
    )
    doc = result_document("bench_new", "python benchmarks/bench_new.py --quick", printed, {"x": 1})
    (tmp_path / "bench_new.json").write_text(json.dumps(doc))
    page = render_docs.render(tmp_path)
    assert "## bench_new" in page and "| xpbank | 1.5 |" in page and "**Sample B=8**" in page
    assert "best of 3" in page and "`python benchmarks/bench_new.py --quick`" in page
    assert "A `--quick` run" in page and "load average" in page


def test_a_file_of_another_shape_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text(json.dumps({"environment": {}, "results": {}}))
    with pytest.raises(SystemExit, match=r"old.json: not a benchmark result file \(missing benchmark"):
        render_docs.render(tmp_path)


def test_tables_are_read_from_markdown_with_titles_and_notes() -> None:
    text = (
        "# title\n\nintro\n\n## First\n\n| a | b |\n|---|---|\n| 1 | 2 |\n| 3 | 4 |\n\nnote one\n"
        "## Second\n\nB=32\n\n| c |\n|---|\n| 5 |\n"
    )
    first, second = tables_from_markdown(text)
    assert first == {"title": "First", "headers": ["a", "b"], "rows": [["1", "2"], ["3", "4"]],
                     "notes": "note one"}  # fmt: skip
    assert second == {"title": "Second", "headers": ["c"], "rows": [["5"]], "notes": "B=32"}
