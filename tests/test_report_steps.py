"""Step figures of a run report (docs/design.md section 5): what a training job pays per step."""

from __future__ import annotations

import pytest

from wanxport.report import build_report, step_summary

# The first step is cold; steps 2..N hold one slow step (10.0), as a step that waited for a
# recovery round trip would: the mean carries it, the median does not.
STEPS = [5.0, 1.0, 3.0, 2.0, 10.0, 4.0]


def test_step_summary_over_steps_two_to_n() -> None:
    summary = step_summary(STEPS)
    assert summary == {
        "step_s": STEPS,
        "first_step_s": 5.0,
        "mean_step_s": 4.0,  # (1 + 3 + 2 + 10 + 4) / 5
        "p90_step_s": 7.6,  # sorted 1 2 3 4 10: position 0.9 x 4 = 3.6, 4 + 0.6 x (10 - 4)
        "worst_step_s": 10.0,
        "steady_step_s": 3.0,  # the median, kept for older reports
    }


def test_efficiency_divides_by_the_mean_step() -> None:
    report = build_report(scenario="s", mode="sim", transport="wanxport", payload_bytes=6,
                          completion_s=25.0, ideal_s=2.0, intact=True, wall_s=None, paths=[],
                          steps=len(STEPS), step_s=STEPS)
    assert report["efficiency"] == 0.5  # 2.0 / mean 4.0, not 2.0 / median 3.0
    assert report["efficiency_basis"] == "mean"
    assert report["mean_step_s"] == 4.0 and report["p90_step_s"] == 7.6


@pytest.mark.parametrize("finished", [[], [1.5]])
def test_fewer_than_two_steps_finished_give_no_step_figures(finished: list[float]) -> None:
    report = build_report(scenario="s", mode="emulated", transport="wanxport", payload_bytes=6,
                          completion_s=9.0, ideal_s=2.0, intact=False, wall_s=9.0, paths=[],
                          steps=3, step_s=finished)
    assert report["efficiency"] is None
    for key in ("mean_step_s", "p90_step_s", "worst_step_s", "steady_step_s"):
        assert report[key] is None
    assert report["first_step_s"] == (finished[0] if finished else None)


def test_a_single_step_run_has_no_step_fields() -> None:
    report = build_report(scenario="s", mode="loopback", transport="wanxport", payload_bytes=6,
                          completion_s=4.0, ideal_s=2.0, intact=True, wall_s=4.0, paths=[])
    assert report["efficiency"] == 0.5
    assert "efficiency_basis" not in report and "mean_step_s" not in report
