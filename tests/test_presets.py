"""One place for the tuning defaults: every way of building a session reads the presets."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from emulation.api import PathInfo
from emulation.baselines import wanxport_app
from emulation.baselines.transports import Direction, launch
from wanxport.bench.transfer import TransferSpec, preset_overrides
from wanxport.bench.transfer import session_config as bench_session_config
from wanxport.collective.mesh import default_options
from wanxport.gateway.config import GatewayOptions, session_config
from wanxport.presets import COLLECTIVE, GATEWAY, overrides
from wanxport.presets import session_config as preset_session_config

ROOT = Path(__file__).resolve().parent.parent


def test_only_the_presets_and_the_simulator_build_a_session_config() -> None:
    hits = sorted(str(path.relative_to(ROOT)) for tree in ("wanxport", "emulation", "benchmarks", "examples")
                  for path in (ROOT / tree).rglob("*.py") if "SessionConfig(" in path.read_text())
    assert hits == ["wanxport/presets.py", "wanxport/sim/runner.py"]


def test_gateway_options_default_to_the_gateway_preset() -> None:
    options = GatewayOptions()
    assert overrides(GATEWAY, options.preset()) == {}
    built = session_config(2, options.mtu, options.segments, options.credit_bytes)
    assert built == preset_session_config(["p0", "p1"], GATEWAY)
    assert built.ack_threshold == GATEWAY.segments and built.max_ack_delay_s == GATEWAY.ack_delay_s
    # Both presets run the session once per control interval on WAN paths (a receive hold-off).
    assert options.receive_holdoff_s == GATEWAY.receive_holdoff_s == COLLECTIVE.receive_holdoff_s > 0


def test_the_collective_reads_its_preset() -> None:
    assert overrides(COLLECTIVE, default_options().preset()) == {}
    assert overrides(GATEWAY, COLLECTIVE) == {"segments": 64, "min_ack_delay_s": None,
                                         "control_timeout_s": 10.0}


def spec(**changes: object) -> TransferSpec:
    base = TransferSpec(2, 4 << 20, GATEWAY.mtu, "aes-256-gcm", "native", GATEWAY.segments, 2, 0, 60.0)
    return dataclasses.replace(base, **changes)


def test_the_bench_runs_the_gateway_preset_and_names_what_it_changes() -> None:
    assert preset_overrides(spec()) == {}
    assert bench_session_config(spec()) == preset_session_config(["lo0", "lo1"], GATEWAY)
    assert preset_overrides(spec(segments=128, ack_every=7)) == {"segments": 128, "ack_threshold": 7}


def test_the_emulated_app_gets_certificates_not_keys() -> None:
    path = PathInfo(name="p1", a_addr="10.0.1.1", b_addr="10.0.1.2", ifname="wx1")
    plan = launch("wanxport", [path], 0, Direction("a", "b", 5201), seed=1, size=1 << 20, cc="bbr",
                  buffer=1 << 20, mtu=1500, shards=2, pki="/tmp/pki")
    for side in (plan.sender, plan.receiver):
        assert "keys" not in side
        assert side["pki"] == "/tmp/pki" and side["names"] == {"sender": "a", "receiver": "b"}
    assert wanxport_app.identity(plan.sender, sender=True) == ("/tmp/pki/a", "/tmp/pki/ca.pem")
    assert wanxport_app.identity(plan.receiver, sender=False) == ("/tmp/pki/b", "/tmp/pki/ca.pem")
    assert overrides(GATEWAY, wanxport_app.run_preset(plan.sender)) == {}
