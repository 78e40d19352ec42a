"""Training steps in the simulator: the step contract (docs/design.md sections 4-5) and warm steps."""

from __future__ import annotations

import pytest

from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, simulate
from wanxport.sim.steps import StepTracker

STEPPED = """
name = "stepped"
seed = 5
[transfer]
size = "{size}"
shards = 4
direction = "{direction}"
steps = {steps}
think_ms = {think_ms}
[[paths]]
name = "near"
rtt_ms = 20.0
bandwidth_mbps = 40.0
loss = 0.002
[[paths]]
name = "far"
rtt_ms = 150.0
bandwidth_mbps = 60.0
loss = 0.002
"""


def stepped(size: str = "512KiB", direction: str = "a->b", steps: int = 3, think_ms: float = 0.0) -> object:
    return parse_scenario(STEPPED.format(size=size, direction=direction, steps=steps, think_ms=think_ms))


@pytest.mark.parametrize("direction,mode", [("a->b", "bytes"), ("both", "bytes"), ("a->b", "virtual")])
def test_a_stepped_run_reports_every_step(direction: str, mode: str) -> None:
    report = simulate(stepped(direction=direction, steps=3, think_ms=40.0), SimOptions(payload_mode=mode))
    assert report["intact"] is True
    ways = 2 if direction == "both" else 1
    assert report["payload_bytes"] == 3 * ways * 512 * 1024
    assert report["steps"] == 3 and len(report["step_s"]) == 3
    assert report["first_step_s"] == report["step_s"][0]
    assert report["steady_step_s"] == pytest.approx(sorted(report["step_s"][1:])[0] / 2
                                                    + sorted(report["step_s"][1:])[1] / 2, rel=1e-5)
    assert report["worst_step_s"] == max(report["step_s"][1:])
    assert report["efficiency"] == pytest.approx(report["ideal_s"] / report["mean_step_s"], rel=1e-4)
    # The whole run holds every step and, between steps, the think time plus, one way,
    # the sender learning of the verification (at least half the shortest RTT); both
    # ways, the side that received last knows at once.
    gaps = report["completion_s"] - sum(report["step_s"])
    assert gaps >= 2 * (0.040 + (0.010 if ways == 1 else 0.0)) - 1e-6
    assert sum(p["payload_bytes"] for p in report["paths"]) >= 3 * 512 * 1024
    spread = report["shard_completion_s"]
    assert 0 < spread["p50"] <= spread["p99"] <= spread["max"] <= max(report["step_s"]) + 1e-9


def test_a_single_step_run_keeps_the_plain_report() -> None:
    report = simulate(stepped(steps=1), SimOptions(payload_mode="virtual"))
    assert "steps" not in report and "step_s" not in report
    assert report["efficiency"] == pytest.approx(report["ideal_s"] / report["completion_s"], rel=1e-4)
    assert report["shard_completion_s"]["max"] <= report["completion_s"] + 1e-9


@pytest.mark.parametrize("think_ms", [200.0, 3000.0])
def test_later_steps_start_warm(think_ms: float) -> None:
    """Step 2 starts at the learned rate: on a 150 ms path a cold start costs several round trips.
    Seconds of think time (20 round trips of the far path) must not make the session forget."""
    report = simulate(stepped(size="8MiB", steps=4, think_ms=think_ms), SimOptions(payload_mode="virtual"))
    assert report["intact"] is True
    assert report["steady_step_s"] < 0.8 * report["first_step_s"], report["step_s"]
    assert report["efficiency"] > 0.75, report["step_s"]


def test_step_tracker_waits_for_both_directions_before_the_next_step() -> None:
    tracker = StepTracker(steps=2, shards=2, directions=["a->b", "b->a"], think_s=0.1)
    for direction in ("a->b", "b->a"):
        tracker.submitted(direction, 0, 1.0)
    assert list(tracker.shard_ids(1)) == [2, 3] and tracker.step_of(3) == 1
    assert tracker.verified("a->b", 0, 2.0) is None
    assert tracker.verified("a->b", 1, 2.5) is None  # b has its data, but has not sent its own
    assert tracker.acknowledged("a->b", 0) is None
    assert tracker.acknowledged("a->b", 1) is None  # a: its data is through, not b's to it
    assert tracker.verified("b->a", 0, 2.6) is None
    assert tracker.verified("b->a", 1, 2.8) == 1  # a has received everything and was acknowledged
    assert tracker.acknowledged("b->a", 0) is None
    assert tracker.acknowledged("b->a", 1) == 1  # b too
    assert tracker.acknowledged("b->a", 1) is None  # ready once per step
    assert tracker.step_s() == [pytest.approx(1.8)]
    assert sorted(tracker.shard_completion_s) == pytest.approx([1.0, 1.5, 1.6, 1.8])
    assert not tracker.done()


def test_step_tracker_receiver_only_side_never_submits() -> None:
    tracker = StepTracker(steps=2, shards=1, directions=["a->b"], think_s=0.0)
    tracker.submitted("a->b", 0, 0.0)
    assert tracker.verified("a->b", 0, 1.0) is None  # b sends nothing
    assert tracker.acknowledged("a->b", 0) == 1
    tracker.submitted("a->b", 1, 1.5)
    assert tracker.verified("a->b", 1, 2.0) is None and tracker.acknowledged("a->b", 1) is None
    assert tracker.done() and tracker.step_s() == [1.0, 0.5]


def test_step_tracker_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        StepTracker(steps=0, shards=1, directions=["a->b"], think_s=0.0)
    with pytest.raises(ValueError):
        StepTracker(steps=1, shards=1, directions=["sideways"], think_s=0.0)
    with pytest.raises(ValueError):
        StepTracker(steps=1, shards=1, directions=["a->b"], think_s=-1.0)
