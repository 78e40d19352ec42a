"""Congestion-control registry, config objects and the fixed-rate controller."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import pytest

from wanxport.core.cc import (
    DEFAULT_CONGESTION_CONTROL,
    BbrConfig,
    CcConfig,
    CcContext,
    CubicConfig,
    FixedConfig,
    available_congestion_controls,
    base,
    cc_config,
    register_congestion_control,
)
from wanxport.core.cc.bbr import BbrCongestionController
from wanxport.core.cc.cubic import CubicCongestionController
from wanxport.core.cc.fixed import FixedRateCongestionController
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.rtt import RttEstimator
from wanxport.core.session import Session

MSS = 1400
CONTEXT = CcContext(mss_bytes=MSS)


def test_builtins_are_registered_and_bbr_is_the_default() -> None:
    assert {"bbr", "cubic", "fixed"} <= set(available_congestion_controls())
    assert DEFAULT_CONGESTION_CONTROL == "bbr"
    assert cc_config("bbr") == BbrConfig() == SessionConfig(paths=(PathConfig("p"),)).congestion_control
    cc = cc_config("bbr").build(CcContext(mss_bytes=MSS, initial_window_packets=10))
    assert isinstance(cc, BbrCongestionController) and cc.name == "bbr"
    assert cc.cwnd_bytes == 10 * MSS
    assert isinstance(cc_config("cubic").build(CONTEXT), CubicCongestionController)
    assert cc_config("fixed", {"rate_bps": 1e6}) == FixedConfig(rate_bps=1e6)


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown congestion control 'reno'; valid: .*bbr.*cubic"):
        cc_config("reno")


def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown option 'gain' for congestion control 'bbr'; "
                                         r"valid: probe_rtt, seed, shared$"):
        cc_config("bbr", {"gain": 2.0})
    with pytest.raises(ValueError, match=r"option 'seed' for congestion control 'cubic'; valid: \(none\)"):
        cc_config("cubic", {"seed": 1})


@pytest.mark.parametrize(("name", "options", "field"), [
    ("bbr", {"probe_rtt": "no"}, "probe_rtt must be true or false"),
    ("bbr", {"seed": 1.5}, "seed must be an integer"),
    ("fixed", {}, "needs option rate_bps"),
    ("fixed", {"rate_bps": 0}, "rate_bps must be a number > 0"),
    ("fixed", {"rate_bps": "fast"}, "fixed option rate_bps must be a number, got 'fast'"),
    ("fixed", {"rate_bps": True}, "fixed option rate_bps must be a number, got True"),
    ("bbr", {"seed": True}, "bbr option seed must be an integer, got True"),
])
def test_bad_option_values_name_the_option(name: str, options: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        cc_config(name, options)


def test_configs_are_frozen_and_shared_by_every_path() -> None:
    config = BbrConfig(probe_rtt=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.probe_rtt = False  # type: ignore[misc]
    first, second = config.build(CONTEXT), config.build(CONTEXT)
    assert first is not second and first.cwnd_bytes == second.cwnd_bytes


@pytest.mark.parametrize(("config", "minimum"), [(BbrConfig(), 4), (CubicConfig(), 2)])
def test_a_window_below_the_controllers_minimum_is_refused(config: CcConfig, minimum: int) -> None:
    config.build(CcContext(mss_bytes=MSS, initial_window_packets=minimum))
    with pytest.raises(ValueError, match=f"at least {minimum} packets.*initial_window_packets={minimum - 1}"):
        config.build(CcContext(mss_bytes=MSS, initial_window_packets=minimum - 1))


@pytest.mark.parametrize(("kwargs", "field"), [({"mss_bytes": 0}, "mss_bytes"),
                                               ({"mss_bytes": MSS, "initial_window_packets": 0},
                                                "initial_window_packets"),
                                               ({"mss_bytes": MSS, "path_index": -1}, "path_index"),
                                               ({"mss_bytes": MSS, "initial_rtt_s": 0.0}, "initial_rtt_s")])
def test_a_bad_context_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        CcContext(**kwargs)  # type: ignore[arg-type]


def test_session_builds_each_paths_controller_from_its_context() -> None:
    """The session passes each path's packet size, window (in core packets), index and the
    initial RTT; BBR seeds each path's RNG with seed + index, so paths start out of phase."""
    paths = (PathConfig("a", 1500), PathConfig("b", 9000))
    config = SessionConfig(paths=paths, congestion_control=BbrConfig(seed=3), initial_rtt_s=0.05)
    contexts = [config.cc_context(i) for i in range(2)]
    assert [c.path_index for c in contexts] == [0, 1]
    assert [c.initial_rtt_s for c in contexts] == [0.05, 0.05]
    for path, context in zip(paths, contexts, strict=True):
        assert context.mss_bytes == config.data_payload(path) + config.packet_overhead()
        assert context.initial_window_packets == config.initial_window_core_packets(path)
    session = Session(config)
    for built, context in zip(session.paths, contexts, strict=True):
        assert built.cc.cwnd_bytes == context.initial_window_packets * context.mss_bytes
    assert [p.cc._rng.random() for p in session.paths] == [  # type: ignore[attr-defined]
        BbrConfig(seed=3 + i).build(CONTEXT)._rng.random() for i in range(2)]


def test_session_config_takes_a_config_object_not_a_name() -> None:
    # (A mypyc-compiled SessionConfig refuses the str in its constructor, with a TypeError.)
    with pytest.raises((ValueError, TypeError), match=r"congestion_control must be a controller config.*"
                                                      r"cc_config|CcConfig object expected"):
        SessionConfig(paths=(PathConfig("p"),), congestion_control="cubic")  # type: ignore[arg-type]


@dataclass(frozen=True)
class DoubleRateConfig(CcConfig):
    """A user's controller: fixed rate at twice the option."""

    rate_bps: float

    def build(self, context: CcContext) -> FixedRateCongestionController:
        return FixedConfig(rate_bps=2 * self.rate_bps).build(context)


@pytest.mark.skipif(base.__file__ is not None and not base.__file__.endswith(".py"),
                    reason="a mypyc-compiled core's classes cannot be subclassed by interpreted code")
def test_registering_a_custom_controller() -> None:
    register_congestion_control("test-double-fixed", DoubleRateConfig)
    try:
        assert "test-double-fixed" in available_congestion_controls()
        config = cc_config("test-double-fixed", {"rate_bps": 1e6})
        assert config == DoubleRateConfig(1e6)
        session = Session(SessionConfig(paths=(PathConfig("p"),), congestion_control=config))
        assert session.paths[0].cc.pacing_rate_bps == 2e6
        with pytest.raises(ValueError, match=r"unknown option 'rate'.*valid: rate_bps"):
            cc_config("test-double-fixed", {"rate": 1e6})
    finally:
        from wanxport.core.cc import _CONFIGS

        del _CONFIGS["test-double-fixed"]
    with pytest.raises(ValueError, match="name"):
        register_congestion_control("", DoubleRateConfig)
    with pytest.raises(ValueError, match="CcConfig subclass"):
        register_congestion_control("x", FixedRateCongestionController)  # type: ignore[arg-type]


def test_fixed_paces_at_its_rate_ignores_loss_and_sizes_the_window_from_srtt() -> None:
    cc = FixedConfig(rate_bps=1e9).build(CONTEXT)
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
    slow = FixedConfig(rate_bps=1e5).build(CONTEXT)
    slow.on_ack(1.0, MSS, tiny, None, 0)
    assert slow.cwnd_bytes == 4 * MSS


def test_metrics_are_finite_and_name_each_controllers_model() -> None:
    """metrics() is the one view of a controller outside the core: common figures plus the
    model's, all finite (JSON and Prometheus take them as they are), unknown ones left out."""
    rtt = RttEstimator()
    rtt.update(0.050, 0.0, 1.0)
    bbr = BbrConfig().build(CONTEXT)
    before = bbr.metrics()
    assert "min_rtt_s" not in before and "bw_cap_bps" not in before
    assert before["cwnd_bytes"] == bbr.cwnd_bytes and before["pacing_rate_bps"] == bbr.pacing_rate_bps
    bbr.on_ack(1.0, MSS, rtt, None, 0)
    assert bbr.metrics()["min_rtt_s"] == 0.050
    cubic = CubicConfig().build(CONTEXT)
    assert "ssthresh_bytes" not in cubic.metrics()
    cubic.on_packet_sent(1.0, MSS, 0)
    cubic.on_loss(1.1, MSS, 0, 1.0, rtt)
    assert cubic.metrics()["ssthresh_bytes"] == pytest.approx(0.7 * 32 * MSS)
    fixed = FixedConfig(rate_bps=1e9).build(CONTEXT)
    assert fixed.metrics()["rate_bps"] == 1e9
    for cc in (bbr, cubic, fixed):
        figures = cc.metrics()
        assert {"cwnd_bytes", "pacing_rate_bps", "bandwidth_bps"} <= set(figures)
        assert all(isinstance(v, float) and math.isfinite(v) for v in figures.values())
