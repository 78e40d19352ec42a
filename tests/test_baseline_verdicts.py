"""Baselines that are what they claim: deadlines, did-not-finish ratios, suspect runs, stripes."""

from __future__ import annotations

from typing import Any

import pytest

from emulation.baselines.delivery import MIN_JUDGED_RTTS, Delivery, delivery, is_clean, suspect
from emulation.baselines.stripes import capacity_split, route_capacity_bps
from emulation.compare import table
from emulation.ratios import completion_ratio, completion_text, finished, speedup
from emulation.run import (
    RunOptions,
    check_deadline,
    default_deadline_s,
    minimum_baseline_deadline_s,
    run_experiment,
)
from wanxport.report import PathReport, build_report
from wanxport.scenario import ideal_time_s, parse_scenario

SCENARIO = """
name = "mixed"
seed = 1
[transfer]
size = "1GiB"
[[paths]]
name = "clean"
rtt_ms = 20.0
bandwidth_mbps = 150.0
[[paths]]
name = "lossy"
rtt_ms = 50.0
bandwidth_mbps = 100.0
loss = 0.01
[[paths]]
name = "eventful"
rtt_ms = 30.0
bandwidth_mbps = 100.0
  [[paths.events]]
  at_s = 2.0
  set = { loss = 0.05 }
[[paths]]
name = "bursty"
rtt_ms = 30.0
bandwidth_mbps = 60.0
  [paths.burst_loss]
  p = 0.01
  r = 0.5
"""


def scenario() -> Any:
    return parse_scenario(SCENARIO)


# -- deadlines -----------------------------------------------------------------


def test_baseline_deadline_is_at_least_ten_ideals_per_step() -> None:
    s = scenario()
    ideal = ideal_time_s(s)
    assert minimum_baseline_deadline_s(ideal) == pytest.approx(10 * ideal)
    assert minimum_baseline_deadline_s(ideal, steps=3, think_ms=500) == pytest.approx(30 * ideal + 1.0)
    assert default_deadline_s(ideal) >= minimum_baseline_deadline_s(ideal)
    assert default_deadline_s(0.1) == 60.0  # the floor


@pytest.mark.parametrize("transport", ["tcp", "tcp-parallel", "mptcp", "aioquic"])
def test_a_deadline_under_ten_ideals_is_refused_for_a_baseline_in_one_line(transport: str) -> None:
    s = scenario().with_transfer(size_bytes=1 << 30)
    least = 10 * ideal_time_s(s)
    with pytest.raises(ValueError, match=r"needs at least [0-9.]+ s \(10 x the ideal") as info:
        check_deadline(transport, least * 0.9, s)
    assert "\n" not in str(info.value)
    check_deadline(transport, least * 1.01, s)
    check_deadline(transport, None, s)  # the default is always long enough
    check_deadline("wanxport", least * 0.1, s)  # ours may be cut short: it is what is measured


def test_run_refuses_the_short_deadline_before_building_anything() -> None:
    with pytest.raises(ValueError, match="--deadline 1"):
        run_experiment(scenario(), RunOptions(transport="tcp-parallel", deadline_s=1.0))


# -- ratios against runs that did not finish --------------------------------------


def test_ratio_against_an_unfinished_baseline_is_a_lower_bound_rounded_down() -> None:
    assert completion_ratio(60.0, False, 6.9, True).text() == "> 8.6 ×"  # 8.695... never "8.7"
    assert completion_ratio(60.0, True, 6.9, True).text() == "8.7 ×"
    assert completion_ratio(60.0, True, 6.9, False).text() == "< 8.7 ×"
    assert completion_ratio(60.0, True, 6.81, False).text() == "< 8.9 ×"  # 8.81 rounded up
    assert completion_ratio(60.0, False, 6.9, False).text() == "n/a (neither finished)"
    with pytest.raises(ValueError):
        completion_ratio(0.0, True, 1.0, True)


def report(transport: str, completion_s: float, *, done: bool = True, **extra: Any) -> dict[str, Any]:
    return build_report(scenario="s1", mode="emulated", transport=transport, payload_bytes=1 << 30,
                        completion_s=completion_s, ideal_s=10.0, intact=done, wall_s=1.0,
                        paths=[PathReport("p1", 1 << 20, 0, 0.02, "active")], cc="cubic",
                        backend="engine", finished=done, timed_out=not done, **extra)


def test_finished_reads_the_new_field_and_the_old_timed_out() -> None:
    assert not finished({"timed_out": True}) and finished({"timed_out": False}) and finished({})
    assert not finished({"finished": False, "timed_out": False})
    assert speedup(report("tcp", 120.0, done=False), report("wanxport", 12.0)).text() == "> 10.0 ×"
    assert completion_text(report("tcp", 120.0, done=False)) == "> 120.00 s (did not finish)"
    assert completion_text(report("tcp", 12.345)) == "12.35 s"


def test_table_prints_an_unfinished_median_as_a_bound_and_its_ratio_as_one() -> None:
    reports = [report("wanxport", 12.0, repeat=0), report("wanxport", 13.0, repeat=1),
               report("wanxport", 14.0, repeat=2),
               report("tcp-parallel", 120.0, done=False, repeat=0),
               report("tcp-parallel", 120.0, done=False, repeat=1),
               report("tcp-parallel", 30.0, repeat=2),
               report("tcp", 26.0, repeat=0)]
    row = table(reports, ["wanxport", "tcp-parallel", "tcp"], {}).splitlines()[4].split(" | ")
    assert row[3] == "13.00 s · 661 Mb/s"
    assert row[4].startswith("> 120.00 s ·") and "(did not finish: 2/3)" in row[4]
    assert row[4].endswith("wanxport > 9.2 × faster")
    assert row[5] == "26.00 s · 330 Mb/s · wanxport 2.0 × faster |"  # both finished: a plain ratio


# -- suspect runs --------------------------------------------------------------------


def test_only_a_path_without_loss_or_events_is_clean() -> None:
    paths = {p.name: p for p in scenario().paths}
    assert is_clean(paths["clean"], "a->b") and is_clean(paths["clean"], "b->a")
    assert not is_clean(paths["lossy"], "a->b")
    assert not is_clean(paths["eventful"], "a->b")
    assert not is_clean(paths["bursty"], "a->b")


def test_a_clean_path_under_half_its_capacity_marks_the_run_suspect_with_the_reason() -> None:
    paths = {p.name: p for p in scenario().paths}
    # The committed hetero-8path case: 62 MB in 60 s on a clean 150 Mb/s path (8.3 Mb/s).
    slow = delivery(paths["clean"], "a->b", 62_139_688, 60.0)
    assert slow.rate_bps == pytest.approx(8.285e6, rel=1e-3) and slow.clean and slow.judged
    verdict = suspect([slow])
    assert verdict is not None and "clean" in verdict["reason"] and "8.3 Mb/s" in verdict["reason"]
    assert "150 Mb/s" in verdict["reason"] and verdict["reason"].startswith("clean (a->b")
    # Just over half its capacity: not suspect.
    assert suspect([delivery(paths["clean"], "a->b", int(0.51 * 150e6 / 8 * 10), 10.0)]) is None


def test_lossy_short_or_idle_paths_are_not_judged() -> None:
    paths = {p.name: p for p in scenario().paths}
    assert suspect([delivery(paths["lossy"], "a->b", 1000, 60.0)]) is None  # loss may explain it
    assert suspect([delivery(paths["eventful"], "a->b", 1000, 60.0)]) is None
    short = delivery(paths["clean"], "a->b", 1000, 0.02 * (MIN_JUDGED_RTTS - 1))  # slow start only
    assert not short.judged and suspect([short]) is None
    idle = Delivery("clean", "a->b", 0, 0.0, 150e6, 0.02, True)
    assert idle.rate_bps is None and suspect([idle]) is None


def test_delivery_rate_counts_only_the_time_the_path_had_data() -> None:
    paths = {p.name: p for p in scenario().paths}
    d = delivery(paths["clean"], "a->b", 134_217_728, 7.5)  # finished its slice at 7.5 s of a 25 s run
    assert d.to_dict() == {"direction": "a->b", "delivered_bytes": 134_217_728, "active_s": 7.5,
                           "rate_bps": 143_165_577, "capacity_bps": 150_000_000, "clean": True}
    assert suspect([d]) is None


# -- stripes --------------------------------------------------------------------------


def test_capacity_split_tiles_the_array_in_proportion() -> None:
    stripes = capacity_split(1000, [120.0, 100.0, 80.0, 60.0])
    assert [n for _, n in stripes] == [333, 278, 222, 167]
    assert [o for o, _ in stripes] == [0, 333, 611, 833]
    assert sum(n for _, n in stripes) == 1000


@pytest.mark.parametrize("count", [0, 1, 3, 4, 7, 1001, 16 << 20])
@pytest.mark.parametrize("caps", [[1.0], [3.0, 1.0], [120e6, 99.9e6, 79.9e6, 59.9e6], [1e9, 1.0, 1.0]])
def test_capacity_split_sums_to_the_length_and_leaves_no_route_empty(count: int, caps: list[float]) -> None:
    stripes = capacity_split(count, caps)
    assert sum(n for _, n in stripes) == count
    assert all(stripes[k + 1][0] == stripes[k][0] + stripes[k][1] for k in range(len(caps) - 1))
    if count >= len(caps):
        assert all(n > 0 for _, n in stripes)
    total = sum(caps)
    exact = [count * c / total for c in caps]
    lifted = sum(1 for x in exact if x < 1) if count >= len(caps) else 0  # given one element each
    for (_, n), x in zip(stripes, exact, strict=True):
        assert abs(n - x) <= 1 + lifted


def test_a_route_without_capacity_gets_no_stripe_and_bad_capacities_are_refused() -> None:
    assert capacity_split(10, [1.0, 0.0, 1.0]) == [(0, 5), (5, 0), (5, 5)]
    with pytest.raises(ValueError, match="no route has capacity"):
        capacity_split(10, [0.0, 0.0])
    with pytest.raises(ValueError, match="finite and >= 0"):
        capacity_split(10, [1.0, -1.0])
    with pytest.raises(ValueError, match="finite and >= 0"):
        capacity_split(10, [float("nan")])


def test_route_capacity_is_bandwidth_less_loss_in_the_weaker_direction() -> None:
    s = scenario()
    assert route_capacity_bps(s, 0) == 150e6
    assert route_capacity_bps(s, 1) == pytest.approx(99e6)


def test_compare_refuses_a_short_baseline_deadline_before_running_anything(tmp_path: Any) -> None:
    from emulation.compare import Column, compare

    with pytest.raises(ValueError, match="a tcp-parallel baseline on mixed needs at least"):
        compare([scenario()], [Column("wanxport"), Column("tcp-parallel", "bbr")], 1, tmp_path / "out",
                deadline_s=30.0, with_sim=False)
    assert not (tmp_path / "out").exists()


def test_an_mptcp_subflow_is_judged_over_its_own_busy_time() -> None:
    from emulation.api import PathInfo
    from emulation.baselines.transports import Direction, path_stats

    paths = [PathInfo("clean", "10.0.1.1", "10.0.1.2", "v1"), PathInfo("lossy", "10.0.2.1", "10.0.2.2", "v2")]
    sent = {"slices": [{"active_s": 100.0}],
            "subflows": [{"local": "10.0.1.1", "bytes_acked": 900_000_000, "busy_time_us": 60_000_000},
                         {"local": "10.0.2.1", "bytes_acked": 5_000_000}]}
    clean, lossy = path_stats("mptcp", paths, 0, Direction("a", "b", 5000), sent, {})
    assert (clean.payload_bytes, clean.active_s) == (900_000_000, 60.0)  # 120 Mb/s while it had data
    assert lossy.active_s == 100.0  # no busy time reported: the connection's time
