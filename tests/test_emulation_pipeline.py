"""``python -m emulation pipeline``: argument checks (one line, exit 2), the report's verdicts,
and a short run over an emulated WAN (root, network namespaces)."""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import pytest

from emulation.cli import main
from emulation.pipeline import PipelineOptions, _report, check_options, latency_rows
from wanxport.scenario import parse_scenario

ONE_PATH = 'name = "p"\n[[paths]]\nname = "r"\nrtt_ms = 20.0\nbandwidth_mbps = 80.0\n'


@pytest.mark.parametrize(("options", "message"), [
    (PipelineOptions("mpi"), "--comm"),
    (PipelineOptions("gloo", microbatches=0), "--microbatches"),
    (PipelineOptions("wanxport", activation_bytes=1000), "--activation-size"),
    (PipelineOptions("wanxport", activation_bytes=0), "--activation-size"),
    (PipelineOptions("wanxport", steps=0), "--steps"),
    (PipelineOptions("wanxport", messages=1), "--messages"),
    (PipelineOptions("wanxport", timeout_s=float("nan")), "--timeout"),
])
def test_bad_options_are_one_line_errors(options: PipelineOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_options(options)


@pytest.mark.parametrize("argv", [
    ["--comm", "gloo", "--activation-size", "1000"],
    ["--comm", "wanxport", "--steps", "0"],
    ["--comm", "wanxport", "--microbatches", "65"],
])
def test_usage_errors_exit_2_with_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "allreduce-4route", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --"), err


def test_an_unknown_scenario_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", "no-such-scenario", "--comm", "gloo"]) == 2
    assert "no-such-scenario" in capsys.readouterr().err


def test_latency_is_the_receivers_return_minus_the_senders_call() -> None:
    scenario = parse_scenario(ONE_PATH)
    sent = {"stamps": {"1000000": [10.0, 20.0, 30.0]}}
    got = {"stamps": {"1000000": [10.2, 20.15, 30.3]}}
    (row,) = latency_rows(scenario, sent, got)
    assert row["median_s"] == pytest.approx(0.2) and row["min_s"] == pytest.approx(0.15)
    assert row["max_s"] == pytest.approx(0.3) and row["messages"] == 3
    assert row["bound_s"] == pytest.approx(0.01 + 0.1)  # 10 ms one way + 1 MB at 10 MB/s
    assert "payload_bytes_per_path" not in row  # gloo: the sender counts nothing per path
    sent["payload_bytes_per_path"] = {"1000000": [3000000]}
    (row,) = latency_rows(scenario, sent, got, ["r"])
    assert row["payload_bytes_per_path"] == {"r": 3000000}


def _stage(digests: list[dict[str, str]], losses: list[float]) -> dict[str, Any]:
    return {"steps": [[0.0, 1.0]] * len(digests), "digests": digests, "losses": losses, "error": None,
            "paths": [], "sweep": None}


@pytest.mark.parametrize(("b_received", "loss", "correct"), [
    ("act", 0.5, True),
    ("other", 0.5, False),  # b did not receive what a sent
    ("act", float("nan"), False),
])
def test_the_report_checks_every_message_and_the_loss(b_received: str, loss: float, correct: bool) -> None:
    options = PipelineOptions("gloo", steps=2)
    a = _stage([{"sent": "act", "received": "grad"}] * 2, [])
    b = _stage([{"sent": "grad", "received": "act"}, {"sent": "grad", "received": b_received}], [0.7, loss])
    emu = SimpleNamespace(paths=[], backend="engine")
    report = _report(parse_scenario(ONE_PATH), options, emu, [a, b], {"a": [], "b": []},  # type: ignore[arg-type]
                     0.5, "cubic", {}, 0.0)
    assert report["correct"] is correct and report["intact"] is correct
    assert report["workload"] == "pipeline" and report["step_s"] == [1.0, 1.0]
    assert report["mean_step_s"] == 1.0 and report["efficiency"] == 0.5


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces")
@pytest.mark.parametrize("comm", ["wanxport", "gloo"])
def test_a_short_pipeline_runs_over_the_emulated_wan(comm: str) -> None:
    """Two steps of two 64 KiB microbatches and a two-size sweep: every activation and
    gradient arrives intact, and gloo stays on its one route."""
    pytest.importorskip("torch", reason="the stages need the torch extra")
    from emulation.bundled import resolve_scenario
    from emulation.pipeline import run_pipeline

    options = PipelineOptions(comm, microbatches=2, activation_bytes=64 << 10, steps=2, latency_sweep=True,
                              messages=2, latency_sizes=(64 << 10, 256 << 10), timeout_s=60.0)
    report = run_pipeline(resolve_scenario("clean-2path"), options)
    assert report["errors"] == [] and report["correct"] is True, report["errors"]
    assert report["messages_matched"] is True and len(report["step_s"]) == 2
    assert [row["size_bytes"] for row in report["latency"]] == [64 << 10, 256 << 10]
    assert all(row["median_s"] >= row["bound_s"] for row in report["latency"])  # nothing beats the bound
    wire = [p["wire_bytes_a_to_b"] for p in report["paths"]]
    if comm == "gloo":
        assert report["settings"]["net.ipv4.tcp_slow_start_after_idle"] == {"a": "0", "b": "0"}
        assert sorted(wire)[0] < (64 << 10) < sorted(wire)[-1]  # one route carried it all
    else:  # wanxport's own counters: at least every activation's bytes went a -> b
        assert sum(p["payload_bytes_a_to_b"] for p in report["paths"]) >= 2 * 2 * (64 << 10)
        for row in report["latency"]:  # and each size's messages, path by path
            assert sum(row["payload_bytes_per_path"].values()) >= 2 * row["size_bytes"]
