"""BBR state machine and loss policy, driven by synthetic ack rounds."""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.cc import BbrConfig, CcContext, CongestionController, cc_config
from wanxport.core.cc.bbr import (
    LOSS_CAP_BETA,
    PACING_GAIN_CYCLE,
    RESTART_STARTUP_GAIN,
    STARTUP_GAIN,
    BbrCongestionController,
)
from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator

MSS = 1500
RATE_BPS = 100e6
MIN_RTT_S = 0.050
BDP_BYTES = RATE_BPS / 8 * MIN_RTT_S
ACKS_PER_ROUND = 4


def bbr(*, probe_rtt: bool = True, **context: Any) -> BbrCongestionController:
    """BBR as these tests drive it: ProbeRTT on (sessions default to off: BbrConfig)."""
    return BbrConfig(probe_rtt=probe_rtt).build(CcContext(mss_bytes=MSS, **context))


def figure(cc: CongestionController, name: str) -> float:
    """One of the controller's metrics; inf for one it does not have (no cap, no sample)."""
    return cc.metrics().get(name, math.inf)


class Driver:
    """Feeds a controller one ack batch at a time, ACKS_PER_ROUND batches per round trip.

    Each batch acknowledges a quarter of what the path delivers per RTT; the
    packets it acknowledges were sent one RTT earlier, so a new round starts
    every ACKS_PER_ROUND batches. In flight is what the pacing rate puts in
    one RTT, capped by the window, as for a paced sender.
    """

    def __init__(self, cc: BbrCongestionController) -> None:
        self.cc = cc
        self.rtt = RttEstimator()
        self.now = 0.0
        self.delivered = 0
        self.history: deque[int] = deque([0] * ACKS_PER_ROUND)

    def inflight(self, rtt_s: float) -> int:
        return min(self.cc.cwnd_bytes, int(self.cc.pacing_rate_bps / 8 * rtt_s) + MSS)

    def ack(
        self,
        *,
        rate_bps: float = RATE_BPS,
        rtt_s: float = MIN_RTT_S,
        app_limited: bool = False,
        inflight: int | None = None,
    ) -> None:
        self.now += rtt_s / ACKS_PER_ROUND
        acked = int(rate_bps / 8 * rtt_s / ACKS_PER_ROUND)
        self.delivered += acked
        prior = self.history.popleft()
        self.history.append(self.delivered)
        self.rtt.update(rtt_s, 0.0, self.now)
        sample = RateSample(rate_bps, rtt_s, self.delivered - prior, prior, app_limited, rtt_s)
        in_flight = self.inflight(rtt_s) if inflight is None else inflight
        self.cc.on_ack(self.now, acked, self.rtt, sample, in_flight)

    def rounds(self, n: int, **kwargs: float | bool | int) -> None:
        for _ in range(n * ACKS_PER_ROUND):
            self.ack(**kwargs)  # type: ignore[arg-type]

    def lose(self, sent_ago_s: float = 0.0) -> None:
        self.cc.on_loss(self.now, MSS, self.inflight(MIN_RTT_S), self.now - sent_ago_s, self.rtt)


def in_probe_bw() -> Driver:
    driver = Driver(bbr())
    driver.rounds(6)
    assert driver.cc.state == "probe_bw"
    return driver


def test_initial_window_and_rate() -> None:
    cc = bbr()
    assert cc.in_startup and cc.state == "startup"
    assert cc.cwnd_bytes == 32 * MSS
    # BBRInitPacingRate: the initial window over one (guessed) RTT at the Startup gain
    assert cc.pacing_rate_bps == pytest.approx(STARTUP_GAIN * 32 * MSS * 8 / 0.333)
    cc = bbr(initial_window_packets=10, initial_rtt_s=0.1)
    assert cc.cwnd_bytes == 10 * MSS
    assert cc.pacing_rate_bps == pytest.approx(STARTUP_GAIN * 10 * MSS * 8 / 0.1)


def test_startup_ends_after_three_rounds_without_growth_then_drains() -> None:
    driver = Driver(bbr())
    cc = driver.cc
    driver.rounds(1)
    assert cc.in_startup
    assert cc.pacing_rate_bps == pytest.approx(STARTUP_GAIN * RATE_BPS)
    driver.rounds(2)
    assert cc.in_startup  # two flat rounds are not yet a plateau
    driver.ack()  # the third flat round starts
    assert cc.state == "drain"
    assert cc.pacing_rate_bps == pytest.approx(RATE_BPS / STARTUP_GAIN)
    driver.ack()  # in flight at the drain rate fits one BDP: cruise
    assert cc.state == "probe_bw"
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS)
    assert figure(cc, "min_rtt_s") == MIN_RTT_S


def test_probe_bw_cycles_gains_and_window_is_two_bdp() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    gains = []
    for _ in range(12 * ACKS_PER_ROUND):
        driver.ack()
        gains.append(cc.metrics()["pacing_gain"])
        assert cc.pacing_rate_bps == pytest.approx(cc.metrics()["pacing_gain"] * RATE_BPS)
    assert set(gains) == set(PACING_GAIN_CYCLE)
    assert cc.cwnd_bytes == int(2 * BDP_BYTES) + 3 * MSS


def test_random_loss_without_a_queue_changes_nothing() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    before = (cc.pacing_rate_bps, cc.cwnd_bytes)
    for _ in range(20):
        driver.ack()
        driver.lose()
        assert figure(cc, "bw_cap_bps") == math.inf
    driver.ack()
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS)
    assert cc.cwnd_bytes == before[1]


def test_loss_with_a_standing_queue_caps_bandwidth_once_per_round() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    queued_rtt = 1.5 * MIN_RTT_S
    driver.rounds(2, rtt_s=queued_rtt)
    cwnd_before = cc.cwnd_bytes
    driver.lose()
    assert figure(cc, "bw_cap_bps") == pytest.approx(LOSS_CAP_BETA * RATE_BPS)
    assert cc.bandwidth_bps == pytest.approx(LOSS_CAP_BETA * RATE_BPS)
    assert cc.metrics()["pacing_gain"] == 0.75  # drains the queue right away
    assert cc.cwnd_bytes < cwnd_before
    # Losses of packets sent before the reduction belong to the same episode.
    driver.ack(rtt_s=queued_rtt)
    driver.lose(sent_ago_s=queued_rtt)
    assert figure(cc, "bw_cap_bps") == pytest.approx(LOSS_CAP_BETA * RATE_BPS)
    # A later loss while the queue still stands is a new episode.
    driver.rounds(1, rtt_s=queued_rtt)
    driver.lose()
    assert figure(cc, "bw_cap_bps") == pytest.approx(LOSS_CAP_BETA**2 * RATE_BPS)


def test_cap_is_released_after_rounds_without_congestion() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    driver.rounds(2, rtt_s=1.5 * MIN_RTT_S)
    driver.lose()
    assert figure(cc, "bw_cap_bps") < math.inf
    driver.rounds(2)
    assert LOSS_CAP_BETA * RATE_BPS < figure(cc, "bw_cap_bps") < RATE_BPS
    driver.rounds(3)
    assert figure(cc, "bw_cap_bps") == math.inf
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS)


@pytest.mark.parametrize(
    ("min_rtt_s", "queue_delay_s", "congested"),
    [
        (0.010, 0.004, False),  # 40 % of min RTT but below the 5 ms floor
        (0.010, 0.006, True),
        (0.100, 0.020, False),  # above 5 ms but below 25 % of min RTT
        (0.100, 0.030, True),
    ],
)
def test_queue_evidence_threshold(min_rtt_s: float, queue_delay_s: float, congested: bool) -> None:
    driver = Driver(bbr())
    driver.rounds(6, rtt_s=min_rtt_s)
    driver.rounds(2, rtt_s=min_rtt_s + queue_delay_s)
    driver.lose()
    assert (figure(driver.cc, "bw_cap_bps") < math.inf) is congested


def test_a_single_delayed_sample_is_not_a_standing_queue() -> None:
    driver = in_probe_bw()
    driver.rounds(1)
    driver.ack(rtt_s=3 * MIN_RTT_S)  # a jitter spike
    driver.lose()
    assert figure(driver.cc, "bw_cap_bps") == math.inf


def test_congestion_in_startup_ends_the_search_without_a_cap() -> None:
    driver = Driver(bbr())
    driver.rounds(1)
    driver.rounds(2, rate_bps=2 * RATE_BPS, rtt_s=1.5 * MIN_RTT_S)
    assert driver.cc.in_startup
    driver.lose()
    assert driver.cc.state == "drain"
    assert figure(driver.cc, "bw_cap_bps") == math.inf


def test_app_limited_samples_cannot_lower_the_estimate() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    driver.rounds(15, rate_bps=RATE_BPS / 4, app_limited=True)
    assert cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS)
    driver.rounds(12, rate_bps=RATE_BPS / 4)
    assert cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS / 4)


@pytest.mark.parametrize("probe_rtt", [True, False])
def test_probe_rtt_only_after_ten_seconds_without_a_new_min(probe_rtt: bool) -> None:
    driver = Driver(bbr(probe_rtt=probe_rtt))
    cc = driver.cc
    driver.rounds(6)
    longer = 1.2 * MIN_RTT_S  # the route changed; not enough to look like a queue
    states = set()
    while driver.now < 9.9:
        driver.ack(rtt_s=longer)
        states.add(cc.state)
    assert "probe_rtt" not in states
    assert figure(cc, "min_rtt_s") == MIN_RTT_S
    cwnd_before = cc.cwnd_bytes
    while driver.now < 10.3:
        driver.ack(rtt_s=longer)
        states.add(cc.state)
    assert figure(cc, "min_rtt_s") == pytest.approx(longer)
    if not probe_rtt:
        assert "probe_rtt" not in states
        return
    assert cc.state == "probe_rtt"
    assert cc.cwnd_bytes == 4 * MSS
    assert cc.pacing_rate_bps > 0
    entered = driver.now
    while cc.state == "probe_rtt":
        driver.ack(rtt_s=longer, inflight=4 * MSS)
    assert 0.2 <= driver.now - entered <= 0.2 + 2 * longer
    assert cc.state == "probe_bw"
    assert cc.cwnd_bytes >= cwnd_before  # the window is restored, not regrown


def test_path_reset_restarts_the_search_but_keeps_min_rtt() -> None:
    driver = in_probe_bw()
    cc = driver.cc
    cc.on_path_reset(driver.now)
    assert cc.in_startup
    assert cc.cwnd_bytes == 32 * MSS
    assert figure(cc, "min_rtt_s") == MIN_RTT_S
    assert cc.pacing_rate_bps == pytest.approx(STARTUP_GAIN * 32 * MSS * 8 / MIN_RTT_S)
    assert cc.bandwidth_bps == cc.pacing_rate_bps
    driver.rounds(2)
    assert cc.in_startup and cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS)


def test_a_search_interrupted_by_idle_resumes_near_the_measured_rate() -> None:
    """A training step ended while Startup was still searching: its tail was app-limited, so
    the plateau test never ran. The next step must not restart at 2/ln 2 x what was measured
    (about two BDP of overshoot into the queue), but probe at most 1.25 x it."""
    driver = Driver(bbr())
    cc = driver.cc
    driver.rounds(2)
    assert cc.in_startup and cc.pacing_rate_bps == pytest.approx(STARTUP_GAIN * RATE_BPS)
    driver.rounds(2, app_limited=True)  # the step's tail
    assert cc.in_startup
    cc.on_packet_sent(driver.now + 0.5, MSS, 0)  # the next step, after the think time
    assert cc.pacing_rate_bps == pytest.approx(RESTART_STARTUP_GAIN * RATE_BPS)
    assert cc.cwnd_bytes <= RESTART_STARTUP_GAIN * BDP_BYTES + 3 * MSS + 1, "a quarter BDP can queue"
    driver.rounds(1)
    assert cc.pacing_rate_bps <= RESTART_STARTUP_GAIN * RATE_BPS * (1 + 1e-9)
    driver.rounds(3)  # flat rounds: the search ends as usual, and ProbeBW owns the rate again
    assert cc.state == "probe_bw" and cc.bandwidth_bps == pytest.approx(RATE_BPS)
    cc.on_packet_sent(driver.now + 0.5, MSS, 0)
    assert cc.pacing_rate_bps >= RATE_BPS * 0.75, "outside Startup an idle restart changes nothing"


def test_a_search_with_more_to_find_keeps_growing_after_idle() -> None:
    driver = Driver(bbr())
    cc = driver.cc
    driver.rounds(2, rate_bps=RATE_BPS / 4)
    cc.on_packet_sent(driver.now + 0.5, MSS, 0)
    for growth in (1.25, 1.25 ** 2, 1.25 ** 3):  # each round delivers what the last allowed
        driver.rounds(1, rate_bps=RATE_BPS / 4 * growth)
        assert cc.in_startup
    assert cc.metrics()["max_bw_bps"] == pytest.approx(RATE_BPS / 4 * 1.25 ** 3)


def test_a_step_that_ends_with_a_queue_standing_leaves_startup_at_the_measured_rate() -> None:
    """A training step ended while Startup still ran, but its last round already queued at the
    bottleneck: the estimate is the path's rate. The next step starts in ProbeBW at it, not at
    2/ln 2 x it with a 2.9 BDP window (hetero-8path's h7 lost ~500 packets to that)."""
    driver = Driver(bbr())
    cc = driver.cc
    driver.rounds(1)
    driver.rounds(1, rtt_s=1.5 * MIN_RTT_S)  # the bottleneck is full: a queue stands
    assert cc.in_startup
    cc.on_app_idle(driver.now)
    assert cc.state == "probe_bw"
    assert cc.bandwidth_bps == pytest.approx(RATE_BPS)
    assert figure(cc, "min_rtt_s") == MIN_RTT_S
    assert cc.pacing_rate_bps <= max(PACING_GAIN_CYCLE) * RATE_BPS * (1 + 1e-9)
    assert cc.cwnd_bytes <= 2 * BDP_BYTES + 3 * MSS + 1


def test_a_step_that_ends_mid_search_resumes_it_near_the_measured_rate() -> None:
    """Without a queue there may be more to find (a short step ends long before the plateau):
    the search goes on at most 1.25 x the measured rate and BDP (so at most a quarter BDP can
    queue: hetero-8path's h8 overflowed its buffer with Startup's 2.9 BDP window), and the first
    round that queues ends it (the overshoot is a quarter, so it need not wait three rounds)."""
    driver = Driver(bbr())
    cc = driver.cc
    driver.rounds(1)
    cc.on_app_idle(driver.now)
    assert cc.in_startup and cc.pacing_rate_bps == pytest.approx(RESTART_STARTUP_GAIN * RATE_BPS)
    assert cc.cwnd_bytes <= RESTART_STARTUP_GAIN * BDP_BYTES + 3 * MSS + 1
    driver.rounds(1, rtt_s=1.1 * MIN_RTT_S)  # within the standing-queue margin
    assert cc.in_startup
    driver.rounds(1, rtt_s=1.5 * MIN_RTT_S)
    driver.ack()
    assert not cc.in_startup and cc.bandwidth_bps == pytest.approx(RATE_BPS)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["ack", "app", "loss", "sent", "reset", "idle"]),
            st.floats(1e3, 1e10),
            st.floats(0.001, 0.5),
        ),
        max_size=80,
    )
)
def test_outputs_stay_sane_under_any_event_sequence(
    events: list[tuple[str, float, float]],
) -> None:
    driver = Driver(bbr())
    cc = driver.cc
    for kind, rate, rtt_s in events:
        if kind in ("ack", "app"):
            driver.ack(rate_bps=rate, rtt_s=rtt_s, app_limited=kind == "app")
        elif kind == "loss":
            driver.lose()
        elif kind == "sent":
            cc.on_packet_sent(driver.now, MSS, 0)
        elif kind == "idle":
            cc.on_app_idle(driver.now)
        else:
            cc.on_path_reset(driver.now)
        assert 0 < cc.pacing_rate_bps < math.inf
        assert 0 < cc.bandwidth_bps < math.inf
        assert cc.cwnd_bytes >= 4 * MSS


def test_invalid_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="initial_window_packets=2"):
        bbr(initial_window_packets=2)
    with pytest.raises(ValueError, match="probe_rtt"):
        cc_config("bbr", {"probe_rtt": "no"})
    with pytest.raises(ValueError, match="mss_bytes"):
        CcContext(mss_bytes=0)
