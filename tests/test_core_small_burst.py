"""A small message goes out as one burst on the path that lands it first (core.scheduling.burst);
large transfers and retransmissions keep the controllers' pacing and the ordinary schedule."""

from __future__ import annotations

import pytest
from test_core_freshness import make_cc

from wanxport.core.paths import Path
from wanxport.core.scheduling.burst import BURST_MAX_BYTES, burst_path, burst_rate_bps, can_burst
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun

FOUR_ROUTES = """
name = "four-routes"
seed = 14
[transfer]
size = "64KiB"
shards = 1
direction = "a->b"
steps = 12
think_ms = 20.0
[[paths]]
name = "r1"
rtt_ms = 20.0
bandwidth_mbps = 120.0
[[paths]]
name = "r2"
rtt_ms = 55.0
bandwidth_mbps = 100.0
[[paths]]
name = "r3"
rtt_ms = 95.0
bandwidth_mbps = 80.0
[[paths]]
name = "r4"
rtt_ms = 150.0
bandwidth_mbps = 60.0
"""


def measured_path(path_id: int, rtt_s: float) -> Path:
    path = Path(path_id, f"p{path_id}", 1200, make_cc(), 0.1)
    path.rtt.update(rtt_s, 0.0, now=1.0)
    return path


def test_the_idle_path_with_the_shortest_propagation_takes_the_whole_message() -> None:
    near, far = measured_path(0, 0.02), measured_path(1, 0.055)
    assert burst_path([far, near], [far, near], 2.0, 64 << 10) is near
    assert burst_path([far], [far, near], 2.0, 64 << 10) is far  # only the ready ones are asked
    assert burst_path([near, far], [near, far], 2.0, 0) is None  # nothing waits
    assert burst_path([near, far], [near, far], 2.0, BURST_MAX_BYTES + 1) is None  # not small


def test_no_burst_beyond_the_window_or_behind_a_large_flight() -> None:
    near = measured_path(0, 0.02)
    room = near.cwnd_space
    assert can_burst(near, room) and not can_burst(near, room + 1)
    assert burst_path([near], [near], 2.0, room + 1) is None
    busy = measured_path(1, 0.01)
    busy.loss.bytes_in_flight = BURST_MAX_BYTES  # the tail of a large transfer, not a small message
    assert burst_path([near], [near, busy], 2.0, 1024) is None


def test_a_busy_path_that_lands_sooner_keeps_the_ordinary_schedule() -> None:
    near, far = measured_path(0, 0.02), measured_path(1, 0.055)
    near.loss.bytes_in_flight = near.mss  # busy with another message, not as a burst
    assert not can_burst(near, 1024)
    assert burst_path([near, far], [near, far], 2.0, 1024) is None


def test_a_burst_paces_a_window_within_an_eighth_of_the_min_rtt() -> None:
    path = measured_path(0, 0.02)
    rate = burst_rate_bps(path)
    assert rate == pytest.approx(path.cc.cwnd_bytes * 8 / (0.02 / 8))
    controller_rate = path.pacing_rate_bps
    path.burst_rate_bps = rate
    assert path.pacing_rate_bps == pytest.approx(max(rate, controller_rate))
    path.max_rate_bps = 1e6  # an operator's cap still holds
    assert path.pacing_rate_bps == 1e6


def run_steps(size: str, scheduler: str = "earliest-arrival") -> SimRun:
    text = FOUR_ROUTES.replace('size = "64KiB"', f'size = "{size}"')
    run = SimRun(parse_scenario(text), SimOptions(payload_mode="virtual", scheduler=scheduler))
    report = run.run()
    assert report["intact"] is True
    return run


def test_small_messages_travel_only_on_the_route_that_lands_them_first() -> None:
    """The controllers' estimates, learnt from 64 KiB flights, say r1 moves ~1.5 MB/s; paced at
    that, the tail's water-filling put a third of each message on r2. As a burst every message
    stays on r1 (round robin, which never bursts, spreads them over all four)."""
    paths = run_steps("64KiB").a.session.stats().paths
    assert [p.payload_bytes > 0 for p in paths] == [True, False, False, False]
    spread = run_steps("64KiB", "round-robin").a.session.stats().paths
    assert all(p.payload_bytes > 0 for p in spread)


def test_a_large_transfer_never_bursts() -> None:
    """2 MiB steps keep the ordinary schedule (every route carries its share) and end with no
    path at a burst pace; 64 KiB steps, the same scenario, end with r1 still pacing its bursts.
    (Observed on the paths, not by patching the transmitter: the compiled core cannot be patched.)"""
    large = run_steps("2MiB").a.session
    assert all(p.payload_bytes > 0 for p in large.stats().paths)
    assert [p.burst_rate_bps for p in large.paths] == [0.0] * 4
    small = run_steps("64KiB").a.session
    assert [p.burst_rate_bps > 0.0 for p in small.paths] == [True, False, False, False]


