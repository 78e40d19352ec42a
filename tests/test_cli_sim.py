"""The `wanxport sim` command: one report on stdout, one-line usage errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = """
name = "cli-small"
seed = 4
[transfer]
size = "256KiB"
shards = 2
[[paths]]
name = "near"
rtt_ms = 10
bandwidth_mbps = 50
[[paths]]
name = "far"
rtt_ms = 60
bandwidth_mbps = 20
loss = 0.01
"""


def wanxport(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "wanxport", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL)
    return path


def test_json_is_exactly_one_report(scenario: Path) -> None:
    result = wanxport("sim", str(scenario), "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # the whole of stdout is one JSON object
    assert report["schema"] == "wanxport.report/1"
    assert report["mode"] == "sim" and report["transport"] == "wanxport"
    assert report["payload_bytes"] == 256 * 1024 and report["intact"] is True
    assert 0 < report["efficiency"] <= 1.0
    assert report["ideal_s"] < report["completion_s"]
    assert [p["name"] for p in report["paths"]] == ["near", "far"]


def test_human_summary_names_every_path(scenario: Path) -> None:
    result = wanxport("sim", str(scenario), "--size", "128KiB", "--cc", "cubic")
    assert result.returncode == 0, result.stderr
    assert "cli-small" in result.stdout and "near" in result.stdout and "far" in result.stdout
    assert "intact yes" in result.stdout


@pytest.mark.parametrize("args,needle", [
    (["--size", "12QB"], "--size"),
    (["--seed", "-1"], "--seed"),
    (["--cc", "reno"], "--cc"),
    (["--cc", "fixed"], "--cc fixed: congestion control 'fixed' needs option rate_bps"),
    (["--deadline", "0"], "--deadline"),
    (["--quantum", "1MiB", "--payload", "bytes"], "--quantum"),
    (["--steps", "0"], "--steps"),
    (["--steps", "two"], "--steps"),
    (["--think-ms", "-5"], "--think-ms"),
])
def test_bad_arguments_exit_2_with_one_line(scenario: Path, args: list[str], needle: str) -> None:
    result = wanxport("sim", str(scenario), *args)
    assert result.returncode == 2
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("text,needle", [
    ('name = "x"\n[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 0\n', "paths[0].bandwidth_mbps"),
    ('name = "x"\ncolour = "red"\n[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 1\n', "colour"),
    ('name = "x"\n[[paths]\n', "line 2"),
    ('[[paths]]\nname = "p"\nrtt_ms = 1\nbandwidth_mbps = 1\n', "name"),
])
def test_bad_scenario_is_one_line_naming_the_field(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text)
    result = wanxport("sim", str(path))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and str(path) in lines[0]


def test_missing_file_is_a_usage_error(tmp_path: Path) -> None:
    result = wanxport("sim", str(tmp_path / "nope.toml"))
    assert result.returncode == 2 and "nope.toml" in result.stderr and "Traceback" not in result.stderr


def test_steps_flag_overrides_the_file_and_reports_steps(scenario: Path) -> None:
    result = wanxport("sim", str(scenario), "--size", "128KiB", "--steps", "3", "--think-ms", "20", "--json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["steps"] == 3 and len(report["step_s"]) == 3 and report["think_ms"] == 20.0
    assert report["payload_bytes"] == 3 * 128 * 1024
    assert report["efficiency"] == pytest.approx(report["ideal_s"] / report["mean_step_s"], rel=1e-4)
    human = wanxport("sim", str(scenario), "--size", "128KiB", "--steps", "3")
    assert human.returncode == 0 and "steps    3: first" in human.stdout


def test_steps_with_a_timeline_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "events.toml"
    path.write_text(SMALL + "[[paths.events]]\nat_s = 1.0\ndown = true\n")
    result = wanxport("sim", str(path), "--steps", "2")
    assert result.returncode == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "events timeline" in lines[0] and "Traceback" not in result.stderr
