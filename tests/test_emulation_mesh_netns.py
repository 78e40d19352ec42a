"""N sites in namespaces for real: one namespace per site, each path a link between two of them
through the impairment engine, and a transfer between two sites of an N-site scenario.

Needs root (``@pytest.mark.netns``). Every test removes what it built, even on failure.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator

import pytest

from emulation.api import Emulation
from emulation.run import RunOptions, run_experiment
from emulation.topology import existing_namespaces
from wanxport.scenario import ScenarioError, parse_scenario

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
]

# Four sites; "ux" is written from its second site; w and x have no path between them.
FOUR = """
name = "{name}"
[transfer]
size = "1MiB"
shards = 2
[[sites]]
name = "u"
[[sites]]
name = "v"
[[sites]]
name = "w"
[[sites]]
name = "x"
[[paths]]
name = "uv"
between = ["u", "v"]
rtt_ms = 4.0
bandwidth_mbps = 50.0
[[paths]]
name = "vw"
between = ["v", "w"]
rtt_ms = 8.0
bandwidth_mbps = 40.0
[[paths]]
name = "ux"
between = ["x", "u"]
rtt_ms = 12.0
bandwidth_mbps = 30.0
[[paths]]
name = "ux2"
between = ["u", "x"]
rtt_ms = 20.0
bandwidth_mbps = 20.0
"""


def assert_nothing_left(emu: Emulation) -> None:
    assert existing_namespaces(emu.plan.namespaces) == []
    assert not os.path.exists(emu.plan.state_dir)


@pytest.fixture
def emu(request: pytest.FixtureRequest) -> Iterator[Emulation]:
    emulation = Emulation(parse_scenario(FOUR.format(name=f"t-{request.node.name[:16]}")), backend="engine")
    try:
        yield emulation
    finally:
        emulation.down()
        assert_nothing_left(emulation)


def test_one_namespace_per_site_and_each_path_joins_its_two_sites(emu: Emulation) -> None:
    emu.up()
    assert list(emu.namespaces) == ["u", "v", "w", "x"]
    assert len(existing_namespaces(emu.plan.namespaces)) == 5  # four sites and the middle
    for info, spec in zip(emu.paths, emu.scenario.paths, strict=True):
        one, other = info.between
        out = emu.run(one, ["ping", "-c", "2", "-i", "0.05", "-W", "5", info.b_addr]).stdout
        rtt_min = float(re.search(r"= ([\d.]+)/", out).group(1))  # type: ignore[union-attr]
        assert rtt_min >= spec.forward.rtt_ms  # through the engine, never faster than the path
        assert info.b_addr in emu.run(other, ["ip", "-br", "addr"]).stdout
    # w holds no address of x's: w and x have no path, and nothing routes between sites.
    unreachable = emu.run("w", ["ping", "-c", "1", "-W", "1", emu.paths[2].a_addr], check=False)
    assert unreachable.returncode != 0
    counters = emu.counters()
    assert counters["vw"]["a->b"]["tx_packets"] >= 2 and counters["ux"]["a->b"]["tx_packets"] >= 2
    lag = emu.lag_max_s()
    assert lag is not None and lag >= 0.0


def test_a_pair_view_orients_the_pair_paths_away_from_its_first_site(emu: Emulation) -> None:
    emu.up()
    view = emu.pair("u", "x")
    assert view.namespaces == {"a": emu.namespaces["u"], "b": emu.namespaces["x"]}
    assert [p.name for p in view.paths] == [p.name for p in view.scenario.paths] == ["ux", "ux2"]
    u_addresses = emu.run("u", ["ip", "-br", "addr"]).stdout
    for path in view.paths:
        assert path.between == ("u", "x") and path.a_addr in u_addresses
        assert view.run("a", ["ping", "-c", "1", "-W", "5", path.b_addr]).returncode == 0
    with pytest.raises(ScenarioError, match="no direct path between w and x"):
        emu.pair("w", "x")


def test_a_transfer_between_two_of_four_sites_is_intact_and_reports_the_engine_lag() -> None:
    scenario = parse_scenario(FOUR.format(name="t-mesh-run"))
    report = run_experiment(scenario, RunOptions(transport="wanxport", backend="engine", between=("x", "u")))
    assert report["intact"] and report["between"] == ["x", "u"]
    assert [p["name"] for p in report["paths"]] == ["ux", "ux2"]
    assert report["ideal_s"] <= report["completion_s"]
    # x reaches nobody but u: relaying adds nothing to the pair's own paths.
    assert report["ideal_relayed_s"] == pytest.approx(report["ideal_s"], rel=1e-5)
    assert isinstance(report["lag_max_s"], float) and report["lag_max_s"] >= 0.0
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert "t-mesh-run" not in left
