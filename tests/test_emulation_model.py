"""Pure parts of the emulation: names, addresses, parameter mappings (engine and netem), timeline."""

from __future__ import annotations

import math

import pytest

from emulation import netem
from emulation.engine import Timeline
from emulation.naming import plan, scenario_prefix
from emulation.params import engine_params, link_from_dict, link_to_dict, netem_limit, path_timeline
from wanxport.scenario import BurstLoss, LinkParams, PathEvent, PathSpec, Scenario


def spec(name: str = "p1", events: tuple[PathEvent, ...] = (), **kw: object) -> PathSpec:
    fwd = LinkParams(**{"rtt_ms": 40.0, "bandwidth_mbps": 100.0, **kw})  # type: ignore[arg-type]
    return PathSpec(name=name, forward=fwd, reverse=fwd, events=events)


def test_names_are_derived_distinct_and_short() -> None:
    sc = Scenario(name="US east / west", paths=(spec("p1"), spec("p2")))
    layout = plan(sc)
    assert layout.prefix == scenario_prefix("US east / west")
    assert layout.prefix.startswith("wx-us-east-west-")
    assert scenario_prefix("US east west") != layout.prefix  # same slug, other hash
    assert [p.a_addr for p in layout.paths] == ["10.200.1.1", "10.200.2.1"]
    assert [p.b_addr for p in layout.paths] == ["10.200.1.2", "10.200.2.2"]
    assert all(len(p.gw_ifname) <= 15 for p in layout.paths)


def test_engine_params_convert_units() -> None:
    lp = LinkParams(rtt_ms=62.0, bandwidth_mbps=100.0, loss=0.01, jitter_ms=2.0, queue_ms=50.0)
    out = engine_params(lp)
    assert out["delay_s"] == pytest.approx(0.031)
    assert out["jitter_s"] == pytest.approx(0.002)
    assert out["rate_bps"] == 100e6
    assert out["queue_bytes"] == pytest.approx(625_000)
    ge = engine_params(LinkParams(rtt_ms=1, bandwidth_mbps=1, burst_loss=BurstLoss(0.01, 0.3)))
    assert ge["ge"] and ge["ge_p"] == 0.01 and ge["ge_r"] == 0.3


def test_link_params_round_trip_through_json_form() -> None:
    lp = LinkParams(rtt_ms=5, bandwidth_mbps=7, burst_loss=BurstLoss(0.1, 0.2, 0.9, 0.01))
    assert link_from_dict(link_to_dict(lp)) == lp


def test_netem_limit_is_sized_for_delay_times_rate() -> None:
    lp = LinkParams(rtt_ms=200.0, bandwidth_mbps=1000.0, queue_ms=50.0)
    # (100 ms + 50 ms) of 1 Gb/s in 1500-byte packets: far above netem's default 1000.
    assert netem_limit(lp) == 12500
    assert netem.netem_config(lp).netem["limit"] == 12500


def test_netem_without_reorder_keeps_rate_in_netem() -> None:
    cfg = netem.netem_config(LinkParams(rtt_ms=60.0, bandwidth_mbps=50.0, jitter_ms=3.0,
                                        loss=0.02))
    assert cfg.htb_rate_bps is None
    assert cfg.netem["rate"] == "50000000bit" and cfg.netem["packet_overhead"] == -14
    assert cfg.netem["delay"] == 30_000 and cfg.netem["jitter"] == 3000
    assert cfg.netem["normal_dist"] is True
    assert cfg.netem["loss"] == pytest.approx(2.0)


def test_netem_reorder_with_jitter_moves_rate_to_htb() -> None:
    cfg = netem.netem_config(LinkParams(rtt_ms=60.0, bandwidth_mbps=50.0, jitter_ms=3.0,
                                        reorder=True))
    assert cfg.htb_rate_bps == 50_000_000
    assert "rate" not in cfg.netem


def test_netem_gemodel_and_down() -> None:
    bl = BurstLoss(p=0.01, r=0.3, loss_bad=0.8, loss_good=0.001)
    cfg = netem.netem_config(LinkParams(rtt_ms=10, bandwidth_mbps=10, burst_loss=bl))
    assert cfg.netem["gemodel"] == {"p": 0.01, "r": 0.3, "h": pytest.approx(0.2), "k1": 0.001}
    assert "loss" not in cfg.netem
    down = netem.netem_config(LinkParams(rtt_ms=10, bandwidth_mbps=10, down=True))
    assert down.netem["loss"] == 100.0


def test_netem_options_encode_distribution_and_gemodel() -> None:
    from pyroute2.netlink.rtnl.tcmsg import tcmsg

    bl = BurstLoss(p=0.01, r=0.3)
    cfg = netem.netem_config(LinkParams(rtt_ms=100, bandwidth_mbps=1000, jitter_ms=2,
                                        burst_loss=bl))
    msg = tcmsg()
    msg["index"], msg["handle"] = 1, netem.ROOT_HANDLE
    msg["attrs"] = [["TCA_KIND", "netem"],
                    ["TCA_OPTIONS", netem.NETEM_PLUGIN.get_parameters(dict(cfg.netem))]]
    msg.encode()
    decoded = tcmsg(msg.data)
    decoded.decode()
    opts = decoded.get_attr("TCA_OPTIONS")
    assert opts["limit"] == cfg.limit_packets
    ge = dict(opts.get_attr("TCA_NETEM_LOSS")["attrs"])["NETEM_LOSS_GE"]
    assert ge["p"] == round(0.01 * (2**32 - 1)) and ge["h"] == 0
    assert len(opts.get_attr("TCA_NETEM_DELAY_DIST")) == 2 * netem.NORMAL_TABLE_SIZE
    assert opts.get_attr("TCA_NETEM_RATE")["rate"] == 125_000_000


def test_normal_table_is_an_inverse_cdf() -> None:
    table = netem.normal_table()
    values = [int.from_bytes(table[i:i + 2], "little", signed=True)
              for i in range(0, len(table), 2)]
    assert values == sorted(values)
    assert sum(values) == 0  # symmetric
    mean_sq = sum(v * v for v in values) / len(values)
    assert math.sqrt(mean_sq) == pytest.approx(netem.NETEM_DIST_SCALE, rel=0.02)


def test_timeline_applies_events_after_the_start_signal() -> None:
    events = (PathEvent(at_s=0.0, changes={"loss": 0.05}), PathEvent(at_s=2.0, down=True))
    path = {"name": "p1", **path_timeline(spec(events=events))}
    timeline = Timeline({"paths": [path]})
    assert timeline.base[0]["a->b"].loss == 0.0
    assert timeline.wait_s(100.0) is None  # nothing happens before the start signal
    timeline.restart(100.0)
    (k, first), = timeline.due(100.0)
    assert first["a->b"].loss == 0.05 and not first["a->b"].down
    assert timeline.wait_s(100.5) == pytest.approx(1.5)
    (k, second), = timeline.due(102.0)
    assert second["b->a"].down and second["b->a"].loss == 0.05
    assert timeline.due(1e9) == []
