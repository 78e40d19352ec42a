"""Warm steps and careful resume (core.warm): learned state kept across idle, dropped on a reroute."""

from __future__ import annotations

from dataclasses import replace

import pytest

from wanxport.core.cc import CcContext, FixedConfig
from wanxport.core.cc.bbr import RESTART_STARTUP_GAIN, RESUME_JUMP_GAIN
from wanxport.core.rtt import RttEstimator
from wanxport.core.warm import MAX_AGE_S, RESUME_SHARE, IdleGuard, PathMemory, remember
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun

MEMORY = PathMemory(rate_bps=100e6, min_rtt_s=0.100, srtt_s=0.110, saved_at=10.0)


def test_the_route_is_the_same_within_twenty_percent() -> None:
    assert MEMORY.same_route(0.100) and MEMORY.same_route(0.081) and MEMORY.same_route(0.131)
    assert not MEMORY.same_route(0.079), "more than 20 % shorter than the min RTT: another route"
    assert not MEMORY.same_route(0.133), "more than 20 % above the smoothed RTT: another route"


def test_a_sample_within_the_paths_own_variation_is_the_same_route() -> None:
    varied = replace(MEMORY, rttvar_s=0.02)  # smoothed 110 ms + 4 x 20 ms = 190 ms
    assert varied.same_route(0.17) and varied.same_route(0.19)
    assert not varied.same_route(0.2), "beyond the variation the path showed: another route"
    assert not varied.same_route(0.079), "the lower bound is the min RTT's, whatever the variation"
    assert replace(MEMORY, rttvar_s=0.001).same_route(0.131) and not MEMORY.same_route(0.17)


def test_saved_state_expires_after_an_hour_and_resumes_at_half_the_rate() -> None:
    assert MEMORY.usable(0.1, 10.0 + MAX_AGE_S) and not MEMORY.usable(0.1, 10.0 + MAX_AGE_S + 1)
    assert not MEMORY.usable(0.2, 11.0)
    assert MEMORY.resume_rate_bps() == 50e6
    assert RESUME_JUMP_GAIN == RESUME_SHARE, "BBR's careful resume follows the one policy"


def test_only_validated_state_is_remembered() -> None:
    cc = FixedConfig(rate_bps=40e6).build(CcContext(mss_bytes=1400))
    rtt = RttEstimator(initial_rtt_s=0.1)
    assert remember(cc, rtt, 1.0) is None, "no RTT sample yet"
    rtt.update(0.05, 0.0, 1.0)
    memory = remember(cc, rtt, 2.0)
    assert memory == PathMemory(40e6, 0.05, 0.05, 2.0, rttvar_s=0.025)


def test_idle_guard_checks_the_first_round_trip_after_a_restart() -> None:
    guard = IdleGuard()
    guard.memory = MEMORY
    assert guard.confirm(sent_at=12.0, rtt_sample_s=0.3), "no restart yet: nothing to validate"
    assert guard.restarting(12.0)
    assert guard.confirm(sent_at=11.9, rtt_sample_s=0.3), "sent before the restart: the old route"
    assert not guard.confirm(sent_at=12.0, rtt_sample_s=0.3), "the first fresh round trip is rerouted"
    assert guard.counters.reroutes == 1 and guard.memory is None
    assert guard.confirm(sent_at=12.5, rtt_sample_s=0.3), "validated once per restart"
    guard.memory = MEMORY
    assert guard.restarting(12.0) and guard.confirm(12.1, 0.105) and guard.counters.reroutes == 1
    guard.memory = MEMORY
    assert not guard.restarting(10.0 + MAX_AGE_S + 5), "idle for more than an hour: start over"
    assert guard.expired == 1 and guard.memory is None



def test_a_gap_shorter_than_a_round_trip_is_not_checked_as_a_restart() -> None:
    guard = IdleGuard()
    guard.memory = MEMORY  # went idle at 10.0 with a 110 ms smoothed RTT
    assert guard.restarting(10.05)
    assert guard.short_gaps == 1 and guard.memory is None
    assert guard.confirm(sent_at=10.05, rtt_sample_s=0.3), "a sample queued by load is not a reroute"
    assert guard.counters.reroutes == 0
    guard.memory = MEMORY
    assert guard.restarting(10.2), "idle longer than the round trip: the next one is checked"
    assert not guard.confirm(sent_at=10.2, rtt_sample_s=0.3) and guard.counters.reroutes == 1


ROUTE = """
name = "route"
seed = 9
[transfer]
size = "4MiB"
shards = 2
steps = 3
think_ms = 300
[[paths]]
name = "moves"
rtt_ms = 60.0
bandwidth_mbps = 50.0
loss = 0.005
[[paths]]
name = "stays"
rtt_ms = 40.0
bandwidth_mbps = 50.0
jitter_ms = 1.0
loss = 0.005
"""


def _reroute(run: SimRun) -> None:
    """Path 0 moves to a route with twice the RTT (both directions)."""
    for link in (run.network.forward[0], run.network.reverse[0]):
        link.set_params(replace(link.params, rtt_ms=2 * link.params.rtt_ms))


@pytest.mark.parametrize("rerouted", [False, True])
def test_warm_state_is_dropped_when_a_path_is_rerouted(rerouted: bool) -> None:
    scenario = parse_scenario(ROUTE)
    options = SimOptions(payload_mode="virtual")
    # Virtual time is deterministic: step 1 is verified at the same moment in a twin run, and
    # 150 ms later the session is inside its 300 ms think time (a compiled SimRun cannot be
    # subclassed, so the reroute is a scheduled event rather than a hook).
    first_step_s = SimRun(scenario, options).run()["step_s"][0]
    run = SimRun(scenario, options)
    if rerouted:
        run.loop.call_at(first_step_s + 0.150, _reroute, run)
    report = run.run()
    assert report["intact"] is True and len(report["step_s"]) == 3
    moves, stays = run.a.session.paths
    assert stays.counters.reroutes == 0, "an unchanged path keeps what it learned over the think time"
    assert moves.counters.reroutes == (1 if rerouted else 0)
    assert [p.reroutes for p in run.a.session.stats().paths] == [moves.counters.reroutes, 0]
    if rerouted:
        # The controller and the RTT estimates follow the new route, not the old minimum.
        assert moves.rtt.min_s == pytest.approx(0.120, rel=0.1)
        assert moves.cc.metrics()["min_rtt_s"] == pytest.approx(0.120, rel=0.1)
    else:
        assert moves.rtt.min_s == pytest.approx(0.060, rel=0.1)


SHORT_STEPS = """
name = "short-steps"
seed = 4
[transfer]
size = "4MiB"
shards = 4
steps = 2
think_ms = 300
[[paths]]
name = "near"
rtt_ms = 20.0
bandwidth_mbps = 100.0
[[paths]]
name = "far"
rtt_ms = 130.0
bandwidth_mbps = 60.0
"""


def test_a_step_that_ends_mid_startup_does_not_carry_startups_gain_into_the_think_time() -> None:
    """4 MiB steps end long before the 130 ms path's Startup finds its plateau. The session's
    last acknowledged shard (nothing left to send) settles the search (``core.warm``): during
    the think time the far path is paced at no more than 1.25 x what it measured (Startup's
    2/ln 2 x threw about two BDP at the queue when the next step began)."""
    scenario = parse_scenario(SHORT_STEPS)
    options = SimOptions(payload_mode="virtual")
    first_step_s = SimRun(scenario, options).run()["step_s"][0]
    run = SimRun(scenario, options)
    seen: dict[str, tuple[str, float, float]] = {}

    def look() -> None:
        for path in run.a.session.paths:
            seen[path.name] = (path.cc.state, path.cc.bandwidth_bps, path.cc.pacing_rate_bps)

    run.loop.call_at(first_step_s + 0.150, look)  # inside the think time (see the reroute test)
    report = run.run()
    assert report["intact"] is True and len(report["step_s"]) == 2
    state, bandwidth, pacing = seen["far"]
    assert state == "startup", "the step is too short to reach the plateau: the search goes on"
    assert pacing <= RESTART_STARTUP_GAIN * bandwidth * (1 + 1e-9)
