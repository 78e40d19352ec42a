"""The simulator runner: report contract (docs/design.md section 5), determinism, outcomes."""

from __future__ import annotations

import json
import math
import random
import time
from typing import Any

import pytest

from wanxport.report import with_wall_time
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun, shard_payload, simulate

TWO_PATHS = """
name = "two-paths"
seed = 11
[transfer]
size = "512KiB"
shards = 4
direction = "{direction}"
[[paths]]
name = "short"
rtt_ms = 20.0
bandwidth_mbps = 40.0
loss = 0.01
[[paths]]
name = "long"
rtt_ms = 90.0
bandwidth_mbps = 20.0
jitter_ms = 4.0
reorder = true
  [paths.burst_loss]
  p = 0.02
  r = 0.4
  [[paths.events]]
  at_s = 0.05
  down = true
  [[paths.events]]
  at_s = 0.3
  down = false
"""

BLACKHOLE = """
name = "blackhole"
[transfer]
size = "64KiB"
shards = 2
[[paths]]
name = "dead"
rtt_ms = 10.0
bandwidth_mbps = 10.0
  [[paths.events]]
  at_s = 0.0
  down = true
"""

PATH_STATES = {"probing", "active", "degraded", "failed"}


def scenario(direction: str = "a->b") -> Any:
    return parse_scenario(TWO_PATHS.format(direction=direction))


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def check_report_contract(report: dict[str, Any], name: str, payload: int, paths: list[str]) -> None:
    assert report["schema"] == "wanxport.report/1"
    assert report["scenario"] == name
    assert report["mode"] == "sim"
    assert report["transport"] == "wanxport"
    assert type(report["payload_bytes"]) is int and report["payload_bytes"] == payload
    for key in ("completion_s", "ideal_s", "efficiency", "goodput_bps", "wall_s"):
        assert is_number(report[key]), f"{key} = {report[key]!r}"
        assert report[key] >= 0
    assert report["completion_s"] > 0 and report["ideal_s"] > 0
    assert report["efficiency"] == pytest.approx(report["ideal_s"] / report["completion_s"], rel=1e-4)
    assert type(report["intact"]) is bool
    assert isinstance(report["paths"], list) and [p["name"] for p in report["paths"]] == paths
    for path in report["paths"]:
        assert type(path["payload_bytes"]) is int and path["payload_bytes"] >= 0
        assert type(path["retransmitted_bytes"]) is int
        assert 0 <= path["retransmitted_bytes"] <= path["payload_bytes"]
        assert path["srtt_s"] is None or (is_number(path["srtt_s"]) and path["srtt_s"] > 0)
        assert path["state"] in PATH_STATES
    assert json.loads(json.dumps(report)) == report, "the report is plain JSON"


@pytest.mark.parametrize("direction,mode", [("a->b", "bytes"), ("both", "bytes"), ("a->b", "virtual")])
def test_report_has_every_contract_field(direction: str, mode: str) -> None:
    report = with_wall_time(lambda: simulate(scenario(direction), SimOptions(payload_mode=mode)))
    size = 512 * 1024
    check_report_contract(report, "two-paths", size * (2 if direction == "both" else 1), ["short", "long"])
    assert report["intact"] is True
    assert report["payload_mode"] == mode
    assert report["goodput_bps"] == pytest.approx(report["payload_bytes"] * 8 / report["completion_s"],
                                                  rel=1e-4)
    assert sum(p["payload_bytes"] for p in report["paths"]) >= size, "the sender moved every byte"


@pytest.mark.parametrize("mode", ["bytes", "virtual"])
def test_same_scenario_and_seed_give_identical_reports(mode: str) -> None:
    options = dict(payload_mode=mode, duplicate=0.02, corrupt=0.02 if mode == "bytes" else 0.0)
    first = simulate(scenario("both"), SimOptions(**options))  # type: ignore[arg-type]
    second = simulate(scenario("both"), SimOptions(**options))  # type: ignore[arg-type]
    assert json.dumps(first) == json.dumps(second), "virtual time: the whole report repeats"
    assert first["events_processed"] > 0


def test_the_simulator_reads_no_wall_clock_and_its_caller_times_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_clock() -> float:
        raise AssertionError("the simulator read the wall clock")

    with monkeypatch.context() as patch:
        for name in ("perf_counter", "monotonic", "time"):
            patch.setattr(time, name, no_clock)
        report = simulate(scenario(), SimOptions(payload_mode="bytes"))
    assert report["intact"] is True and report["wall_s"] is None
    timed = with_wall_time(lambda: simulate(scenario(), SimOptions(payload_mode="bytes")))
    assert is_number(timed["wall_s"]) and timed["wall_s"] > 0
    assert list(timed) == list(report), "wall_s keeps its place in the report"


def test_seed_changes_the_run() -> None:
    reports = [json.dumps(simulate(scenario(), SimOptions(payload_mode="virtual", seed=s))) for s in (1, 2)]
    assert reports[0] != reports[1]


def test_unfinished_transfer_reports_not_intact_at_the_deadline() -> None:
    report = simulate(parse_scenario(BLACKHOLE), SimOptions(payload_mode="bytes", deadline_s=3.0))
    assert report["ideal_s"] is None and report["efficiency"] is None, "no finite ideal time"
    assert report["intact"] is False
    assert report["goodput_bps"] == 0
    assert 2.0 < report["completion_s"] <= 3.0  # the last event before the deadline
    assert report["paths"][0]["state"] in ("degraded", "failed")


def test_corrupted_datagrams_are_rejected_not_delivered() -> None:
    run = SimRun(scenario(), SimOptions(payload_mode="bytes", corrupt=0.05))
    report = run.run()
    assert report["intact"] is True
    corrupted = sum(link.corrupted for link in run.network.forward + run.network.reverse)
    assert corrupted > 0
    assert report["datagrams_rejected"] <= corrupted
    # A flipped bit fails authentication, or is caught even earlier when it lands in the
    # header's marker, flags or path id; every rejection is counted under some reason.
    counters = [run.a.receiver.counters, run.b.receiver.counters]
    assert sum(v for c in counters for k, v in c.items() if k.startswith("rejected_")) \
        == report["datagrams_rejected"]
    assert sum(c["rejected_auth"] for c in counters) > 0
    # Those still in flight when the last shard landed are rejected once the links drain.
    run.loop.run_until(run.loop.now + 1.0)
    assert run.a.rejected + run.b.rejected >= corrupted


def test_invalid_payload_mode() -> None:
    with pytest.raises(ValueError, match="payload mode"):
        SimRun(scenario(), SimOptions(payload_mode="sparse"))


def test_session_options_can_set_the_receive_budget() -> None:
    budget = 256 * 1024
    run = SimRun(scenario(), SimOptions(payload_mode="bytes", session={
        "receive_budget_bytes": budget, "peer_credit_bytes": budget}))
    assert run.b.session.incoming.budget.budget == budget
    assert run.run()["intact"]


def test_quantum_too_large_for_a_data_frame_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="quantum|chunk_bytes"):
        simulate(scenario(), SimOptions(payload_mode="bytes", quantum=70_000, deadline_s=5.0))


def test_a_shards_payload_is_the_same_bytes_whatever_the_chunk() -> None:
    """Made in chunks, since one randbytes call of 256 MiB or more overflowed a C int; the
    bytes stay what one call gives, so digests and results do not depend on the chunk."""
    whole = random.Random("7:a->b:3").randbytes(10_000)
    assert shard_payload(7, "a->b", 3, 10_000) == whole
    assert shard_payload(7, "a->b", 3, 10_000, chunk=1024) == whole
    assert shard_payload(7, "a->b", 3, 10_002, chunk=4) == random.Random("7:a->b:3").randbytes(10_002)
    assert shard_payload(7, "b->a", 3, 16, chunk=4) != shard_payload(7, "a->b", 3, 16, chunk=4)
    assert shard_payload(7, "a->b", 3, 0) == b""
