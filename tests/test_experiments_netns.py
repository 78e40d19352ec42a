"""Side-by-side experiments for real: baselines over an emulated two-path WAN.

Needs root (``@pytest.mark.netns``). Runs are a few MiB; every test checks
that the namespaces are gone afterwards, whatever happened.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from emulation.api import Emulation
from emulation.compare import Column, compare
from emulation.run import RunOptions, run_experiment
from emulation.topology import existing_namespaces
from wanxport.report import SCHEMA
from wanxport.scenario import Scenario, parse_scenario

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
]
ROOT = Path(__file__).resolve().parent.parent
SIZE = 4 << 20

TWO_PATHS = """
name = "{name}"
seed = 11
[transfer]
size = "4MiB"
[[paths]]
name = "p1"
rtt_ms = 20.0
bandwidth_mbps = 100.0
[[paths]]
name = "p2"
rtt_ms = 40.0
bandwidth_mbps = 100.0
loss = 0.001
"""

DOWN = """
  [[paths.events]]
  at_s = 0.0
  down = true
"""
# Both paths blackholed from the first byte on (connections are set up before it).
BLACKHOLE = TWO_PATHS.replace("[[paths]]\nname = \"p2\"", DOWN + "[[paths]]\nname = \"p2\"") + DOWN


@pytest.fixture
def two_paths(request: pytest.FixtureRequest) -> Iterator[Scenario]:
    """A unique two-path scenario; afterwards nothing of it may be left."""
    scenario = parse_scenario(TWO_PATHS.format(name=f"t-exp-{request.node.name[5:25]}"))
    yield from _cleaned(scenario)


def _cleaned(scenario: Scenario) -> Iterator[Scenario]:
    emu = Emulation(scenario)
    try:
        yield scenario
    finally:
        emu.down()
        assert existing_namespaces(emu.plan.namespaces) == []


def check_report(report: dict, transport: str, active: set[str]) -> None:
    assert report["schema"] == SCHEMA
    assert report["mode"] == "emulated" and report["transport"] == transport
    assert report["payload_bytes"] == SIZE
    assert report["intact"] is True and report["timed_out"] is False
    assert report["completion_s"] > 0 and report["goodput_bps"] > 0
    assert report["settings"]["buffer_bytes"] >= 2 * 100e6 / 8 * 0.09  # 2 x BDP of p2 + queue
    states = {p["name"]: p["state"] for p in report["paths"]}
    assert {n for n, s in states.items() if s == "active"} == active
    digest = report["digests"][0]
    assert digest["sent"] == digest["received"]


def test_tcp_uses_the_best_path_and_arrives_intact(two_paths: Scenario) -> None:
    report = run_experiment(two_paths, RunOptions(transport="tcp", cc="cubic"))
    check_report(report, "tcp", {"p1"})
    assert report["cc"] == "cubic"
    assert report["paths"][0]["payload_bytes"] == SIZE
    assert report["paths"][0]["srtt_s"] >= 0.02


def test_tcp_parallel_splits_evenly_over_both_paths(two_paths: Scenario) -> None:
    report = run_experiment(two_paths, RunOptions(transport="tcp-parallel", cc="bbr"))
    check_report(report, "tcp-parallel", {"p1", "p2"})
    assert report["cc"] == "bbr" and report["settings"]["connections"] == 2
    assert [p["payload_bytes"] for p in report["paths"]] == [SIZE // 2, SIZE // 2]
    # Each path's delivered rate over the kernel's busy time of its connection, and the
    # run judged (a 4 MiB transfer is too short for the clean path to be judged suspect).
    for path in report["paths"]:
        (one,) = path["delivered"]
        assert one["delivered_bytes"] == SIZE // 2 and 0 < one["active_s"] <= report["completion_s"] + 0.1
        assert path["delivered_rate_bps"] == one["rate_bps"] > 0
    assert [p["delivered"][0]["clean"] for p in report["paths"]] == [True, False]
    assert "suspect" in report and report["suspect"] is None
    assert report["settings"]["net.ipv4.tcp_slow_start_after_idle"] == {"a": "0", "b": "0"}
    (samples,) = report["tcp_samples"]
    assert [c["path"] for c in samples["connections"]] == ["p1", "p2"]
    assert all(c["samples"] and c["samples"][0][0] == 0.0 for c in samples["connections"])


@pytest.mark.skipif(not os.path.exists("/proc/sys/net/mptcp/enabled"),
                    reason="this kernel has no MPTCP")
def test_mptcp_opens_a_subflow_per_path(two_paths: Scenario) -> None:
    report = run_experiment(two_paths, RunOptions(transport="mptcp"))
    check_report(report, "mptcp", {"p1", "p2"})
    assert report["settings"]["mptcp"]["subflow_endpoints"] == ["p2"]
    assert sum(p["payload_bytes"] for p in report["paths"]) >= SIZE


def test_aioquic_one_connection_on_the_best_path(two_paths: Scenario) -> None:
    scenario = two_paths.with_transfer(size_bytes=SIZE)
    check_report(run_experiment(scenario, RunOptions(transport="aioquic")), "aioquic", {"p1"})


def test_deadline_stops_a_stalled_run_and_reports_what_arrived() -> None:
    scenario = parse_scenario(BLACKHOLE.format(name="t-exp-deadline"))
    assert all(p.events for p in scenario.paths)
    for _ in _cleaned(scenario):
        report = run_experiment(scenario, RunOptions(transport="tcp-parallel", deadline_s=1.0))
        assert report["intact"] is False and report["timed_out"] is True and report["finished"] is False
        assert report["suspect"] is None  # both paths have events: neither is clean
        assert report["completion_s"] >= 1.0 and report["deadline_s"] == 1.0
        delivered = report["goodput_bps"] * report["completion_s"] / 8
        assert delivered < SIZE


def test_wanxport_uses_every_path_and_reports_a_timeline(two_paths: Scenario) -> None:
    report = run_experiment(two_paths, RunOptions(transport="wanxport"))
    check_report(report, "wanxport", {p["name"] for p in report["paths"] if p["state"] == "active"})
    first = report["settings"]["ports"][0]
    assert report["settings"]["ports"] == [first, first + 1]  # two consecutive ports, two paths
    assert report["cc"] == "bbr"
    assert all(p["payload_bytes"] > 0 for p in report["paths"])
    assert {e["path"] for e in report["timeline"]} == {"p1", "p2"}
    assert sum(e["bytes"] for e in report["timeline"]) == sum(
        p["payload_bytes"] for p in report["paths"])
    # The shipped API: mutual TLS over the QUIC control channel with the run's certificates
    # (the receiver verified the sender's), the gateway preset unchanged, and one clock from
    # the send call (its digests inside) to the last byte verified, the verdict after it.
    assert report["control"] == "quic" and report["peers"] == ["a"]
    assert report["preset"] == "gateway" and report["preset_overrides"] == {}
    assert 0 < report["digest_s"] < report["completion_s"] <= report["verdict_s"]
    # Each gateway's CPU by thread role: the loop ran the session, the sender's release
    # thread sent the datagrams, both ends hashed the shards; the engine's CPU beside them.
    for end in ("sender", "receiver"):
        roles = report["cpu"][end]
        assert set(roles) == {"loop", "release", "receive", "digest", "other"}
        assert all(v >= 0 for v in roles.values())
        assert roles["loop"] > 0 and roles["digest"] > 0
        assert report["cpu_s_per_gb"][end] == pytest.approx(sum(roles.values()) / SIZE * 1e9, rel=1e-3)
    assert report["cpu"]["sender"]["release"] > 0
    assert report["backend"] != "engine" or report["cpu_other"]["engine"] >= 0


def test_run_cli_prints_one_report(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(TWO_PATHS.format(name="t-exp-cli"))
    for _ in _cleaned(parse_scenario(path.read_text())):
        proc = subprocess.run([sys.executable, "-m", "emulation", "run", str(path), "--transport",
                               "tcp", "--size", "1MiB", "--json"], capture_output=True, text=True,
                              cwd=ROOT, timeout=120)
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["payload_bytes"] == 1 << 20 and report["intact"] is True


def test_compare_writes_reports_figures_and_table(two_paths: Scenario, tmp_path: Path) -> None:
    scenario = two_paths.with_transfer(size_bytes=1 << 20)
    reports = compare([scenario], [Column("tcp"), Column("tcp-parallel", "bbr")], 2, tmp_path)
    emulated = [r for r in reports if r["mode"] == "emulated"]
    assert [(r["transport"], r["repeat"]) for r in emulated] == [
        ("tcp", 0), ("tcp", 1), ("tcp-parallel", 0), ("tcp-parallel", 1)]
    assert sum(1 for r in reports if r["mode"] == "sim") == 1
    assert len(list((tmp_path / "reports").glob("*.json"))) == 5
    for name in ("goodput.png", "completion.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    table = (tmp_path / "results.md").read_text()
    assert f"| {scenario.name} | 1 MiB |" in table
    assert "| wanxport (sim) | tcp | tcp-parallel:bbr |" in table


@pytest.mark.parametrize("transport", ["wanxport", "tcp-parallel"])
def test_steps_repeat_the_transfer_on_one_session(two_paths: Scenario, transport: str) -> None:
    steps = 3
    report = run_experiment(two_paths.with_transfer(size_bytes=1 << 20), RunOptions(
        transport=transport, steps=steps, think_ms=50.0))
    assert report["intact"] is True and report["timed_out"] is False
    assert report["payload_bytes"] == steps << 20
    assert report["steps"] == steps and len(report["step_s"]) == steps
    assert report["efficiency"] == pytest.approx(report["ideal_s"] / report["mean_step_s"], rel=1e-4)
    # One clock: the run holds its steps and the think time between them.
    assert report["completion_s"] >= sum(report["step_s"]) + (steps - 1) * 0.050 - 1e-3
    assert sum(p["payload_bytes"] for p in report["paths"]) >= steps << 20
    if transport == "wanxport":
        spread = report["shard_completion_s"]
        assert 0 < spread["p50"] <= spread["p99"] <= spread["max"] <= max(report["step_s"]) + 1e-6
