"""The simulator between N sites: a transfer between any directly linked pair, and flows of
different pairs sharing one network (DESIGN.md section 4, contract v2)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from emulation import bundled
from wanxport.scenario import ScenarioError, pair_ideal_time_s, parse_scenario
from wanxport.sim.multi import FlowSpec, MultiRun
from wanxport.sim.runner import SimOptions, simulate

ROOT = Path(__file__).resolve().parent.parent
FIVE = bundled.resolve_scenario("mesh-5site")
SIZE = 1 << 20


@pytest.mark.parametrize(("src", "dst"), [("eu", "asia"), ("asia", "eu"), ("west", "east")])
def test_a_transfer_between_two_of_five_sites_is_intact_on_their_own_paths(src: str, dst: str) -> None:
    report = simulate(FIVE, SimOptions(size_bytes=SIZE, between=(src, dst), payload_mode="bytes"))
    assert report["intact"] and report["between"] == [src, dst]
    assert [p["name"] for p in report["paths"]] == [p.name for p in FIVE.paths_between(src, dst)]
    assert report["ideal_s"] == pytest.approx(pair_ideal_time_s(FIVE, src, dst, SIZE), rel=1e-5)
    relayed = pair_ideal_time_s(FIVE, src, dst, SIZE, relay=True)
    assert report["ideal_relayed_s"] == pytest.approx(relayed, rel=1e-5)
    assert report["ideal_relayed_s"] <= report["ideal_s"] <= report["completion_s"]


def test_the_direction_of_a_pair_picks_the_paths_direction() -> None:
    # eu-asia carries 15 Mb/s towards asia and 25 Mb/s back: the two transfers see different links.
    to_asia = simulate(FIVE, SimOptions(size_bytes=SIZE, between=("eu", "asia"), payload_mode="virtual"))
    to_eu = simulate(FIVE, SimOptions(size_bytes=SIZE, between=("asia", "eu"), payload_mode="virtual"))
    assert to_asia["ideal_s"] > to_eu["ideal_s"]
    assert to_asia["completion_s"] > to_eu["completion_s"]


def test_the_default_pair_is_the_transfer_pair_and_a_two_site_report_is_unchanged() -> None:
    report = simulate(FIVE, SimOptions(size_bytes=SIZE, payload_mode="virtual"))
    assert report["between"] == ["east", "central"]
    v1 = parse_scenario('name = "v1"\n[[paths]]\nname = "p"\nrtt_ms = 10\nbandwidth_mbps = 20\n')
    assert "between" not in simulate(v1, SimOptions(size_bytes=SIZE))


def test_a_pair_without_a_direct_path_is_a_one_line_error() -> None:
    with pytest.raises(ScenarioError, match="no direct path between east and asia"):
        simulate(FIVE, SimOptions(size_bytes=SIZE, between=("east", "asia")))


def test_flows_of_different_pairs_share_one_network() -> None:
    relay = bundled.resolve_scenario("mesh-3site-relay")
    size = 512 * 1024
    flows = [
        FlowSpec("e2w", ("east-west",), size_bytes=size, shards=4, between=("east", "west")),
        FlowSpec("w2e", ("east-west",), size_bytes=size, shards=4, between=("west", "east")),
        FlowSpec("c2w", ("central-west",), size_bytes=size, shards=4, between=("central", "west")),
        FlowSpec("tcp", ("east-central",), kind="tcp", size_bytes=size, between=("central", "east")),
    ]
    report = MultiRun(relay, flows, duration_s=30.0).run()
    assert all(f["completion_s"] is not None for f in report["flows"]), report["flows"]
    links = {link["name"]: link for link in report["links"]}
    # east-west is written east -> west: each flow's data leaves its own site, in its own queue.
    assert links["east-west"]["a->b"]["bytes_delivered"] >= size
    assert links["east-west"]["b->a"]["bytes_delivered"] >= size
    assert links["central-west"]["a->b"]["bytes_delivered"] >= size
    # The TCP-like flow sends central -> east: the reverse of east-central as written.
    east_central = links["east-central"]
    assert east_central["b->a"]["bytes_delivered"] >= size > east_central["a->b"]["bytes_delivered"]


@pytest.mark.parametrize(("flow", "message"), [
    (FlowSpec("f", ("east-west",)), "flow 'f': name the two sites it runs between"),
    (FlowSpec("f", ("east-west",), between=("east", "central")),
     "flow 'f': link 'east-west' joins east and west, not east and central"),
    (FlowSpec("f", ("east-west",), between=("east", "mars")), "flow 'f': unknown site 'mars'"),
    (FlowSpec("f", ("east-west",), between=("east", "east")), "flow 'f': a flow needs two different sites"),
])
def test_a_flow_that_does_not_fit_the_sites_is_refused(flow: FlowSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MultiRun(bundled.resolve_scenario("mesh-3site-relay"), [flow], duration_s=1.0)


def test_the_sim_command_takes_a_pair() -> None:
    path = str(bundled.DIRECTORY / "mesh-4site.toml")

    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "wanxport", "sim", path, "--size", "256KiB", *args],
                              capture_output=True, text=True, cwd=ROOT, timeout=120)

    done = sim("--between", "asia,west", "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["between"] == ["asia", "west"] and report["intact"]
    assert [p["name"] for p in report["paths"]] == ["west-asia"]
    no_path = f"--between: {path}: no direct path between eu and asia"
    bad_pair = "expected two site names FROM,TO"
    for args, message in [(("--between", "eu,asia"), no_path), (("--between", "eu"), bad_pair)]:
        refused = sim(*args)
        assert refused.returncode == 2 and message in refused.stderr and refused.stdout == ""
