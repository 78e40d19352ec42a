"""CUBIC (RFC 9438) window dynamics on a synthetic, always cwnd-limited ack clock."""

from __future__ import annotations

import math

import pytest

from wanxport.core.cc import CcContext, CubicConfig
from wanxport.core.cc.cubic import ALPHA, BETA, C, CubicCongestionController
from wanxport.core.rtt import RttEstimator

MSS = 1000
RTT_S = 0.1
STEP_S = 0.01  # ten ack batches per round trip


def cubic(initial_window_packets: int = 32) -> CubicCongestionController:
    return CubicConfig().build(CcContext(mss_bytes=MSS, initial_window_packets=initial_window_packets))


class Clock:
    """Acknowledges a full window per RTT, in batches, keeping the window full."""

    def __init__(self, cc: CubicCongestionController) -> None:
        self.cc = cc
        self.rtt = RttEstimator()
        self.rtt.update(RTT_S, 0.0, 0.0)
        self.now = 0.0

    def run(self, duration_s: float) -> None:
        end = self.now + duration_s
        while self.now < end - 1e-9:
            self.now += STEP_S
            cwnd = self.cc.cwnd_bytes
            self.cc.on_packet_sent(self.now, MSS, cwnd - MSS)
            acked = int(cwnd * STEP_S / RTT_S)
            self.rtt.update(RTT_S, 0.0, self.now)
            self.cc.on_ack(self.now, acked, self.rtt, None, cwnd - acked)

    def lose(self, sent_ago_s: float = 0.0) -> None:
        self.cc.on_loss(self.now, MSS, self.cc.cwnd_bytes, self.now - sent_ago_s, self.rtt)


def grown_to(packets: int) -> Clock:
    clock = Clock(cubic(initial_window_packets=10))
    while clock.cc.cwnd_bytes < packets * MSS:
        clock.run(STEP_S)
    return clock


def test_slow_start_grows_by_the_acked_bytes_and_paces_at_twice_cwnd() -> None:
    clock = Clock(cubic())
    cc = clock.cc
    assert cc.cwnd_bytes == 32 * MSS and cc.in_startup
    clock.run(STEP_S)
    assert cc.cwnd_bytes == 32 * MSS + int(32 * MSS * STEP_S / RTT_S)
    assert cc.pacing_rate_bps == pytest.approx(2 * cc.cwnd_bytes * 8 / RTT_S, rel=1e-3)


def test_window_does_not_grow_when_the_sender_is_not_using_it() -> None:
    cc = cubic()
    rtt = RttEstimator()
    rtt.update(RTT_S, 0.0, 0.0)
    for i in range(1, 50):
        cc.on_packet_sent(i * STEP_S, MSS, 0)  # one packet in flight at a time
        cc.on_ack(i * STEP_S, MSS, rtt, None, 0)
    assert cc.cwnd_bytes == 32 * MSS


def test_loss_reduces_by_beta_once_per_round_trip() -> None:
    clock = grown_to(1000)
    cc = clock.cc
    w = cc.cwnd_bytes
    clock.lose()
    assert cc.cwnd_bytes == pytest.approx(BETA * w, abs=1)
    assert not cc.in_startup
    assert cc.w_max_bytes == w
    assert cc.pacing_rate_bps == pytest.approx(1.25 * cc.cwnd_bytes * 8 / RTT_S, rel=1e-3)
    clock.run(STEP_S)
    clock.lose(sent_ago_s=RTT_S)  # sent before the reduction: same episode
    assert cc.cwnd_bytes == pytest.approx(BETA * w, abs=1)


def test_window_follows_the_cubic_curve_after_a_loss() -> None:
    clock = grown_to(1000)
    cc = clock.cc
    w_max = cc.cwnd_bytes
    clock.lose()
    k = math.cbrt(w_max * (1 - BETA) / (C * MSS))
    # One RTT of recovery, then the epoch starts.
    clock.run(RTT_S + STEP_S)
    assert cc.k_s == pytest.approx(k, rel=1e-3)
    epoch = clock.now
    for t in (1.0, 3.0, 6.0, k, k + 2.0, k + 4.0):
        clock.run(epoch + t - clock.now)
        expected = C * (t - k) ** 3 * MSS + w_max
        assert cc.cwnd_bytes == pytest.approx(expected, rel=0.02), t
    # Concave approach, a plateau near w_max around K, then convex probing.
    assert cc.cwnd_bytes > w_max + 0.9 * C * 4.0**3 * MSS


def test_fast_convergence_lowers_w_max_when_losses_come_below_it() -> None:
    clock = grown_to(1000)
    cc = clock.cc
    clock.lose()
    clock.run(2.0)
    w = cc.cwnd_bytes
    assert w < cc.w_max_bytes
    clock.lose()
    assert cc.w_max_bytes == pytest.approx(w * (1 + BETA) / 2)
    assert cc.cwnd_bytes == pytest.approx(BETA * w, abs=1)


def test_small_windows_grow_in_the_reno_friendly_region() -> None:
    clock = grown_to(20)
    cc = clock.cc
    w_max = cc.cwnd_bytes
    clock.lose()
    clock.run(RTT_S + STEP_S)
    epoch = clock.now
    w0 = BETA * w_max
    clock.run(2.0)
    t = clock.now - epoch
    # Reno-friendly estimate: ALPHA segments per RTT up to the prior window, then 1.
    t_prior = (w_max - w0) / (ALPHA * MSS) * RTT_S
    reno = w_max + (t - t_prior) / RTT_S * MSS
    k = math.cbrt(w_max * (1 - BETA) / (C * MSS))
    cubic = C * (t - k) ** 3 * MSS + w_max
    assert reno > cubic + 5 * MSS
    assert cc.cwnd_bytes == pytest.approx(reno, rel=0.03)


def test_path_reset_returns_to_slow_start() -> None:
    clock = grown_to(100)
    clock.lose()
    clock.cc.on_path_reset(clock.now)
    assert clock.cc.in_startup and clock.cc.state == "slow_start"
    assert clock.cc.cwnd_bytes == 10 * MSS


def test_invalid_options_name_the_field() -> None:
    with pytest.raises(ValueError, match="initial_window_packets=1"):
        cubic(initial_window_packets=1)
    with pytest.raises(ValueError, match="mss_bytes"):
        CcContext(mss_bytes=-5)
