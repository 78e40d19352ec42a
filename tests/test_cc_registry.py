"""Congestion-control registry and the fixed-rate controller."""

from __future__ import annotations

import math

import pytest

from wanxport.core.cc import (
    DEFAULT_CONGESTION_CONTROL,
    CongestionController,
    available_congestion_controls,
    create_congestion_control,
    register_congestion_control,
)
from wanxport.core.cc.bbr import BbrCongestionController
from wanxport.core.cc.cubic import CubicCongestionController
from wanxport.core.cc.fixed import FixedRateCongestionController
from wanxport.core.rtt import RttEstimator

MSS = 1400


def test_builtins_are_registered_and_bbr_is_the_default() -> None:
    assert {"bbr", "cubic", "fixed"} <= set(available_congestion_controls())
    assert DEFAULT_CONGESTION_CONTROL == "bbr"
    cc = create_congestion_control("bbr", mss_bytes=MSS, initial_cwnd_packets=10)
    assert isinstance(cc, BbrCongestionController) and cc.name == "bbr"
    assert cc.cwnd_bytes == 10 * MSS
    assert isinstance(create_congestion_control("cubic", mss_bytes=MSS), CubicCongestionController)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown congestion control 'reno'; valid: .*bbr.*cubic"):
        create_congestion_control("reno", mss_bytes=MSS)


def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown option 'gain'.*'bbr'.*initial_cwnd_packets"):
        create_congestion_control("bbr", mss_bytes=MSS, gain=2.0)


def test_registering_a_custom_controller() -> None:
    created: list[int] = []

    def factory(*, mss_bytes: int, rate_bps: float) -> CongestionController:
        created.append(mss_bytes)
        return FixedRateCongestionController(mss_bytes=mss_bytes, rate_bps=rate_bps * 2)

    register_congestion_control("test-double-fixed", factory)
    try:
        assert "test-double-fixed" in available_congestion_controls()
        cc = create_congestion_control("test-double-fixed", mss_bytes=MSS, rate_bps=1e6)
        assert cc.pacing_rate_bps == 2e6 and created == [MSS]
    finally:
        from wanxport.core.cc import _FACTORIES

        del _FACTORIES["test-double-fixed"]
    with pytest.raises(ValueError, match="name"):
        register_congestion_control("", factory)


def test_fixed_needs_a_positive_rate() -> None:
    with pytest.raises(ValueError, match="rate_bps"):
        create_congestion_control("fixed", mss_bytes=MSS)
    with pytest.raises(ValueError, match="rate_bps"):
        create_congestion_control("fixed", mss_bytes=MSS, rate_bps=0)


def test_fixed_paces_at_its_rate_ignores_loss_and_sizes_the_window_from_srtt() -> None:
    cc = create_congestion_control("fixed", mss_bytes=MSS, rate_bps=1e9)
    assert cc.pacing_rate_bps == 1e9 and not cc.in_startup
    assert cc.cwnd_bytes == int(2 * 1e9 / 8 * 0.333)  # initial RTT before a sample
    rtt = RttEstimator()
    rtt.update(0.080, 0.0, 1.0)
    cc.on_ack(1.0, MSS, rtt, None, 0)
    assert cc.cwnd_bytes == int(2 * 1e9 / 8 * 0.080)
    cc.on_loss(1.1, 100 * MSS, 0, 1.05, rtt)
    cc.on_path_reset(1.2)
    assert cc.pacing_rate_bps == 1e9
    assert cc.cwnd_bytes == int(2 * 1e9 / 8 * 0.080)
    # A LAN-like RTT is floored at 1 ms, and the window at 4 packets.
    tiny = RttEstimator()
    tiny.update(0.0001, 0.0, 1.0)
    cc.on_ack(1.3, MSS, tiny, None, 0)
    assert cc.cwnd_bytes == int(2 * 1e9 / 8 * 0.001)
    slow = create_congestion_control("fixed", mss_bytes=MSS, rate_bps=1e5)
    slow.on_ack(1.0, MSS, tiny, None, 0)
    assert slow.cwnd_bytes == 4 * MSS


def test_metrics_are_finite_and_name_each_controllers_model() -> None:
    """metrics() is the one view of a controller outside the core: common figures plus the
    model's, all finite (JSON and Prometheus take them as they are), unknown ones left out."""
    rtt = RttEstimator()
    rtt.update(0.050, 0.0, 1.0)
    bbr = create_congestion_control("bbr", mss_bytes=MSS)
    before = bbr.metrics()
    assert "min_rtt_s" not in before and "bw_cap_bps" not in before
    assert before["cwnd_bytes"] == bbr.cwnd_bytes and before["pacing_rate_bps"] == bbr.pacing_rate_bps
    bbr.on_ack(1.0, MSS, rtt, None, 0)
    assert bbr.metrics()["min_rtt_s"] == 0.050
    cubic = create_congestion_control("cubic", mss_bytes=MSS)
    assert "ssthresh_bytes" not in cubic.metrics()
    cubic.on_packet_sent(1.0, MSS, 0)
    cubic.on_loss(1.1, MSS, 0, 1.0, rtt)
    assert cubic.metrics()["ssthresh_bytes"] == pytest.approx(0.7 * 32 * MSS)
    fixed = create_congestion_control("fixed", mss_bytes=MSS, rate_bps=1e9)
    assert fixed.metrics()["rate_bps"] == 1e9
    for cc in (bbr, cubic, fixed):
        figures = cc.metrics()
        assert {"cwnd_bytes", "pacing_rate_bps", "bandwidth_bps"} <= set(figures)
        assert all(isinstance(v, float) and math.isfinite(v) for v in figures.values())
