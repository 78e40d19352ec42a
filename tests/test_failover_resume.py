"""Careful resume of a readmitted path, and one congestion episode per reduction.

A path that fails and comes back over the same route resumes from half the
rate it sustained (then Startup capped at that rate) instead of searching
from the initial window; a path whose RTT changed starts over. All runs are
seeded and in virtual time.
"""

from __future__ import annotations

import pytest

from wanxport.core.cc import BbrConfig, CcContext, FixedConfig
from wanxport.core.cc.bbr import RESUME_JUMP_GAIN, BbrCongestionController
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.delivery_rate import RateSample
from wanxport.core.events import PathChanged
from wanxport.core.health import HealthEvent, PathState
from wanxport.core.paths import Path
from wanxport.core.rtt import RttEstimator
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun
from wanxport.sim.wire import VirtualDatagram

MSS = 1500
RATE_BPS = 100e6
# Read from an instance: a mypyc-compiled SessionConfig has no class-level defaults.
FAILED_PROBE_INTERVAL_S = SessionConfig(paths=(PathConfig("p"),)).failed_probe_interval_s
MIN_RTT_S = 0.05


def _drive(cc: BbrCongestionController, rtt: RttEstimator, now: float, rounds: int,
           rate_bps: float, rtt_s: float = MIN_RTT_S, delivered: int = 0) -> tuple[float, int, float]:
    """Ack batches at ``rate_bps`` (4 per round); return (now, delivered, highest pacing rate)."""
    peak = 0.0
    step = int(rate_bps / 8 * rtt_s / 4)
    history = [delivered] * 4
    for _ in range(rounds * 4):
        now += rtt_s / 4
        prior = history.pop(0)
        delivered += step
        history.append(delivered)
        rtt.update(rtt_s, 0.0, now)
        sample = RateSample(rate_bps, rtt_s, delivered - prior, prior, False, rtt_s)
        cc.on_ack(now, step, rtt, sample, int(rate_bps / 8 * rtt_s))
        peak = max(peak, cc.pacing_rate_bps)
    return now, delivered, peak


def _measured() -> tuple[BbrCongestionController, RttEstimator, float, int]:
    cc = BbrConfig(probe_rtt=True).build(CcContext(mss_bytes=MSS))
    rtt = RttEstimator()
    now, delivered, _ = _drive(cc, rtt, 0.0, 8, RATE_BPS)
    assert cc.state == "probe_bw"
    return cc, rtt, now, delivered


def test_resume_starts_at_half_the_saved_rate_with_a_full_window() -> None:
    cc, _, now, _ = _measured()
    cc.on_path_resume(now, RATE_BPS)
    assert cc.in_startup
    assert cc.pacing_rate_bps == pytest.approx(RESUME_JUMP_GAIN * RATE_BPS)
    assert cc.cwnd_bytes >= RATE_BPS / 8 * MIN_RTT_S  # room for the whole saved rate


def test_resume_never_paces_above_the_saved_rate_and_ends_in_probe_bw() -> None:
    cc, rtt, now, delivered = _measured()
    cc.on_path_resume(now, RATE_BPS)
    now, delivered, peak = _drive(cc, rtt, now, 3, RATE_BPS, delivered=delivered)
    assert peak == pytest.approx(RATE_BPS)  # reaches the saved rate, never more, while resuming
    _drive(cc, rtt, now, 4, RATE_BPS, delivered=delivered)
    assert cc.state == "probe_bw"


def test_resume_retreats_when_the_path_now_carries_less() -> None:
    cc, rtt, now, delivered = _measured()
    cc.on_path_resume(now, RATE_BPS)
    # The route is the same but now delivers half, with a standing queue, and drops.
    now, delivered, _ = _drive(cc, rtt, now, 2, RATE_BPS / 2, rtt_s=2 * MIN_RTT_S, delivered=delivered)
    cc.on_loss(now, MSS, int(RATE_BPS / 16 * MIN_RTT_S), now, rtt)
    assert cc.state == "drain"
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS / 2)


def test_losses_of_packets_handed_out_before_a_reduction_do_not_cap_again() -> None:
    cc, rtt, now, delivered = _measured()
    # A queue stands for two rounds; packets already paced up to 2 ms ahead.
    now, delivered, _ = _drive(cc, rtt, now, 2, RATE_BPS, rtt_s=2 * MIN_RTT_S, delivered=delivered)
    cc.on_packet_sent(now + 0.002, MSS, 1)
    cc.on_loss(now, MSS, 1, now - 0.05, rtt)
    capped = cc.metrics()["bw_cap_bps"]
    assert capped < RATE_BPS
    cc.on_loss(now + 0.1, MSS, 1, now + 0.001, rtt)  # sent after the reduction, but handed out before
    assert cc.metrics()["bw_cap_bps"] == capped


def _path_after_failure(resume_rtt_s: float) -> Path:
    path = Path(0, "p", 1400, FixedConfig(rate_bps=RATE_BPS).build(CcContext(mss_bytes=MSS)), 0.1)
    for i in range(10):
        path.rtt.update(MIN_RTT_S, 0.0, i * 0.1)
    path.health.save_for_resume(path.cc, path.rtt, 1.0)  # an active, measured path is suspected
    path.health.fire(HealthEvent.PROBE_MISSES)
    assert path.state is PathState.FAILED
    path.rtt.update(resume_rtt_s, 0.0, 5.0)  # the answer to a probe
    return path


def _resume_rate(path: Path) -> float:
    return path.health.resume_rate_bps(path.rtt, 5.0)


def test_a_readmitted_path_reuses_its_rate_only_over_the_same_route() -> None:
    assert _resume_rate(_path_after_failure(MIN_RTT_S * 1.1)) == RATE_BPS
    assert _resume_rate(_path_after_failure(MIN_RTT_S * 3)) == 0.0  # rerouted: longer
    assert _resume_rate(_path_after_failure(MIN_RTT_S / 3)) == 0.0  # rerouted: shorter


FLAP = """
name = "flap"
seed = 11
[transfer]
size = "80MiB"
shards = 4
[[paths]]
name = "short"
rtt_ms = 20.0
bandwidth_mbps = 100.0
[[paths]]
name = "long"
rtt_ms = 80.0
bandwidth_mbps = 200.0
  [[paths.events]]
  at_s = 0.8
  down = true
  [[paths.events]]
  at_s = {back_s}
  down = false
  {route_change}
"""


def _readmission_run(route_change: str, back_s: float = 1.6) -> tuple[float, list[tuple[float, int]]]:
    """(time the long path was readmitted, [(arrival time, payload bytes)] on it at the receiver)."""
    scenario = parse_scenario(FLAP.format(route_change=route_change, back_s=back_s))
    # One datagram per core packet: with 16 the long path is still in Startup when it
    # fails at 0.8 s (save_for_resume keeps no rate from Startup), so there is no
    # careful resume to measure; these tests are about the resume, not the segmentation.
    run = SimRun(scenario, SimOptions(payload_mode="virtual", datagrams_per_packet=1))
    arrivals: list[tuple[float, int]] = []
    readmitted: list[float] = []
    deliver, service = run._deliver, run._service

    def record(endpoint: object, index: int, packet: object, now: float) -> None:
        if endpoint is run.b and index == 1 and isinstance(packet, VirtualDatagram) and packet.frames is None:
            arrivals.append((now, packet.length))  # a DATA datagram
        deliver(endpoint, index, packet, now)  # type: ignore[arg-type]

    def watch(endpoint: object) -> None:
        if endpoint is run.a:
            readmitted.extend(e.at for e in run.a.session._events
                              if isinstance(e, PathChanged) and e.old == "failed")
        service(endpoint)  # type: ignore[arg-type]

    run._deliver = record  # type: ignore[method-assign]
    run._service = watch  # type: ignore[method-assign]
    report = run.run()
    assert report["intact"] and len(readmitted) == 1
    return readmitted[0], arrivals


def _rate_in(arrivals: list[tuple[float, int]], start: float, end: float) -> float:
    return sum(length for at, length in arrivals if start <= at < end) * 8 / (end - start)


def test_readmitted_path_is_back_at_most_of_its_rate_in_its_third_round_trip() -> None:
    readmitted, arrivals = _readmission_run("")
    rtt = 0.08
    # Round trip 0 runs at half the saved rate, round trip 1 ramps to the full rate as
    # its acknowledgements confirm it; Startup from 64 packets would still be below 40 %.
    first = (readmitted + 0.5 * rtt, readmitted + 1.5 * rtt)
    third = (readmitted + 2.5 * rtt, readmitted + 3.5 * rtt)
    payload_bps = 200e6 * 1425 / 1500
    assert 0.4 * payload_bps <= _rate_in(arrivals, *first) <= 0.6 * payload_bps
    assert _rate_in(arrivals, *third) >= 0.9 * payload_bps


@pytest.mark.parametrize("back_s", [1.6, 1.63, 1.66, 1.69])
def test_failed_path_is_readmitted_within_a_probe_interval_and_a_round_trip(back_s: float) -> None:
    """Failed paths are probed every failed_probe_interval_s (50 ms), whatever the outage's phase."""
    readmitted, _ = _readmission_run("", back_s)
    assert back_s < readmitted <= back_s + FAILED_PROBE_INTERVAL_S + 0.08 + 0.005


def test_path_rerouted_to_a_round_trip_of_many_probe_intervals_is_still_readmitted() -> None:
    # 600 ms is 12 probe intervals: the answer comes to a probe sent long before the latest.
    readmitted, arrivals = _readmission_run("[[paths.events]]\n  at_s = 1.6\n  set = { rtt_ms = 600.0 }")
    assert 1.6 + 0.6 <= readmitted <= 1.6 + 0.6 + FAILED_PROBE_INTERVAL_S + 0.005
    assert arrivals and max(at for at, _ in arrivals) > readmitted


def test_rerouted_path_searches_from_scratch_instead() -> None:
    readmitted, arrivals = _readmission_run("[[paths.events]]\n  at_s = 1.6\n  set = { rtt_ms = 250.0 }")
    rtt = 0.25
    third = (readmitted + 2.5 * rtt, readmitted + 3.5 * rtt)
    # Startup from the initial window is still far from 200 Mb/s in its third round trip.
    assert _rate_in(arrivals, *third) < 0.5 * 200e6
