"""docs/results/ and the README's headline table are what the committed JSON says.

The pages and the table are generated (``benchmarks/publish_results.py``); this
fails when someone edits a number by hand, commits a report without publishing
it, or lets the results folder grow back into a notebook.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
MAX_FILES = 150


def _publisher():  # type: ignore[no-untyped-def]
    path = ROOT / "benchmarks" / "publish_results.py"
    spec = importlib.util.spec_from_file_location("publish_results", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["publish_results"] = module
    spec.loader.exec_module(module)
    return module


publish = _publisher()


def test_the_pages_and_the_readme_table_agree_with_the_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert publish.main(["--check"]) == 0, capsys.readouterr().err


def test_a_hand_edited_readme_figure_fails_the_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    readme = tmp_path / "README.md"
    text = (ROOT / "README.md").read_text()
    block = text[text.index(publish.BEGIN):text.index(publish.END)]
    figure = re.search(r"\*\*(\d+\.\d+) s\*\*", block)
    assert figure is not None, "the headline table shows a completion time"
    edited = f"**{float(figure.group(1)) + 1:.2f} s**"
    readme.write_text(text.replace(figure.group(0), edited, 1))
    monkeypatch.setattr(publish, "README", readme)
    assert publish.main(["--check"]) == 1
    assert "README.md differs from the JSON" in capsys.readouterr().err


def test_results_hold_at_most_150_files() -> None:
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, f"{len(files)} files under docs/results/"


def test_every_report_under_docs_results_is_cited_by_a_figure() -> None:
    index = publish.load_index()
    cited = {p for figure in index["figures"] for p in publish.source_files(figure["sources"])}
    reports = {p for p in RESULTS.rglob("*") if p.suffix in (".json", ".jsonl") and p.name != "index.json"}
    assert sorted(str(p.relative_to(RESULTS)) for p in reports - cited) == []


def test_every_figure_names_its_commit_host_and_date() -> None:
    index = publish.load_index()
    publish.check_index(index)
    for figure in index["figures"]:
        assert len(figure["commit"]) >= 7 and figure["date"].count("-") == 2, figure["id"]
        assert index["hosts"][figure["host"]]["cpu"], figure["id"]


def _run(transport: str, completion: float, goodput: float, finished: bool = True) -> dict[str, object]:
    return {"scenario": "s", "transport": transport, "mode": "emulated", "cc": "cubic", "ideal_s": 5.0,
            "completion_s": completion if finished else 60.0, "goodput_bps": goodput, "deadline_s": 60.0,
            "timed_out": not finished, "intact": finished}


def test_a_baseline_that_timed_out_is_did_not_finish_and_its_ratio_a_lower_bound() -> None:
    ours = [_run("wanxport", 12.0, 800e6), _run("wanxport", 12.0, 800e6)]
    theirs = [_run("mptcp", 0, 80e6, finished=False), _run("mptcp", 0, 100e6, finished=False),
              _run("mptcp", 40.0, 200e6)]
    assert publish.cell_text(theirs).startswith("did not finish in 60 s (2/3;")
    text = publish.versus(ours, "mptcp", theirs)
    assert "did not finish" in text and "**> 5.0 ×**" in text


def test_a_baseline_that_finished_gets_a_plain_ratio_and_its_misses_counted() -> None:
    ours = [_run("wanxport", 10.0, 800e6)]
    theirs = [_run("mptcp", 15.0, 400e6), _run("mptcp", 0, 50e6, finished=False), _run("mptcp", 14.0, 420e6)]
    assert publish.versus(ours, "mptcp", theirs) == (
        "mptcp 15.00 s (**1.50 ×** wanxport's time, 1 of 3 did not finish)")


def test_a_missing_report_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    index = json.loads((RESULTS / "index.json").read_text())
    index["figures"][0]["sources"] = ["data/nowhere/*.json"]
    (tmp_path / "index.json").write_text(json.dumps(index))
    monkeypatch.setattr(publish, "INDEX", tmp_path / "index.json")
    assert publish.main(["--check"]) == 2
    assert capsys.readouterr().err.strip() == (
        "publish_results: docs/results/data/nowhere/*.json: no such file")


def test_a_suspect_baseline_run_is_named_with_its_reason() -> None:
    theirs = [_run("mptcp", 15.0, 400e6), {**_run("mptcp", 16.0, 380e6),
                                            "suspect": {"reason": "h1 clean, 8 of 150 Mb/s"}}]
    assert publish.cell_text(theirs).endswith("(suspect: 1/2, h1 clean, 8 of 150 Mb/s)")


def test_steps_report_both_the_median_and_the_mean_basis() -> None:
    report = {"ideal_s": 1.0, "step_s": [3.0, 1.0, 1.0, 2.0], "steady_step_s": 1.0}
    assert publish.field(report, "efficiency_median") == 1.0
    assert publish.field(report, "efficiency_mean") == pytest.approx(0.75)
    assert publish.field({**report, "mean_step_s": 2.0}, "efficiency_mean") == 0.5  # the report's own


def test_a_report_that_says_it_did_not_finish_is_believed_and_bounds_round_down() -> None:
    late = {**_run("mptcp", 30.0, 100e6), "finished": False}
    assert publish.field(late, "did_not_finish") is True
    ours = [_run("wanxport", 13.31, 645e6)]
    assert "**> 4.5 ×**" in publish.versus(ours, "mptcp", [_run("mptcp", 0, 73e6, finished=False)])
    assert publish.lower_bound(4.56) == "4.5"
