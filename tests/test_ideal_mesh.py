"""The N-site bounds of DESIGN.md section 4: a pair's transfer (direct and relayed) and the all-reduce."""

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.scenario import (
    Scenario,
    allreduce_ideal_time_s,
    capacities_Bps,
    egress_ingress_Bps,
    ideal_time_s,
    max_flow_Bps,
    pair_ideal_time_s,
    parse_scenario,
)

MB = 1_000_000
Mbps = 125_000.0  # bytes per second in one Mb/s


def mesh(sites: list[str], paths: list[tuple[str, str, str, float, float, str]], extra: str = "") -> Scenario:
    """``paths``: (name, one end, other end, rtt_ms, Mb/s, more TOML lines)."""
    text = f'name = "m"\n{extra}\n' + "".join(f'[[sites]]\nname = "{s}"\n' for s in sites)
    for name, one, other, rtt, mbps, rest in paths:
        text += (f'[[paths]]\nname = "{name}"\nbetween = ["{one}", "{other}"]\n'
                 f"rtt_ms = {rtt}\nbandwidth_mbps = {mbps}\n{rest}\n")
    return parse_scenario(text, "m.toml")


TRIANGLE = mesh(["e", "w", "u"], [
    ("ew", "e", "w", 60, 100, ""),
    ("eu", "e", "u", 20, 400, ""),
    ("uw", "u", "w", 30, 300, "[paths.reverse]\nbandwidth_mbps = 50"),
])


def test_a_two_site_v2_file_has_the_v1_ideal_whatever_the_written_order() -> None:
    v1 = parse_scenario('name = "v"\n[[paths]]\nname = "p"\nrtt_ms = 40\nbandwidth_mbps = 80\n'
                        "[paths.reverse]\nbandwidth_mbps = 20\n")
    v2 = mesh(["x", "y"], [("p", "y", "x", 40, 20, "[paths.reverse]\nbandwidth_mbps = 80")],
              '[transfer]\nfrom = "x"\nto = "y"')
    for direction in ("a->b", "b->a", "both"):
        assert ideal_time_s(v2, 10 * MB, direction) == ideal_time_s(v1, 10 * MB, direction)
    assert ideal_time_s(v1, 10 * MB, "a->b") == pytest.approx(0.02 + 10 * MB / (80 * Mbps))
    assert allreduce_ideal_time_s(v2, 10 * MB) == ideal_time_s(v1, 10 * MB, "both")


def test_direct_pair_bound_uses_only_the_pair_paths() -> None:
    # e -> w: 100 Mb/s direct, 30 ms one way.
    assert pair_ideal_time_s(TRIANGLE, "e", "w", 10 * MB) == pytest.approx(0.03 + 10 * MB / (100 * Mbps))
    assert ideal_time_s(TRIANGLE, 10 * MB) == pair_ideal_time_s(TRIANGLE, "e", "w", 10 * MB)
    # The transfer's pair is the first two sites; the scenario's other paths do not count.
    assert ideal_time_s(TRIANGLE.pair("e", "w"), 10 * MB) == ideal_time_s(TRIANGLE, 10 * MB)


def test_relayed_bound_adds_the_max_flow_through_other_sites_after_the_relay_delay() -> None:
    # e -> u -> w: min(400, 300) = 300 Mb/s, one-way 10 + 15 = 25 ms; direct 100 Mb/s from 30 ms.
    size = 40 * MB
    relayed = pair_ideal_time_s(TRIANGLE, "e", "w", size, relay=True)
    early = 300 * Mbps * 0.005  # the relayed bytes before the direct path's first byte
    assert relayed == pytest.approx(0.03 + (size - early) / (400 * Mbps))
    # w -> e: direct 100, relayed w -> u is the reverse of uw: 50 Mb/s.
    assert max_flow_Bps(TRIANGLE, "w", "e") == pytest.approx(150 * Mbps)
    assert max_flow_Bps(TRIANGLE, "w", "e", direct=False) == pytest.approx(50 * Mbps)


def test_a_pair_with_no_direct_path_has_only_a_relayed_bound() -> None:
    line = mesh(["a1", "b1", "c1"], [("p", "a1", "b1", 10, 100, ""), ("q", "b1", "c1", 10, 40, "")])
    assert pair_ideal_time_s(line, "a1", "c1", MB) == math.inf
    assert pair_ideal_time_s(line, "a1", "c1", MB, relay=True) == pytest.approx(0.01 + MB / (40 * Mbps))


def test_relayed_bound_follows_the_timeline_of_every_path() -> None:
    line = mesh(["a1", "b1", "c1"], [
        ("p", "a1", "b1", 0, 100, ""),
        ("q", "b1", "c1", 0, 40, "[[paths.events]]\nat_s = 1.0\ndown = true\n"
                                 "[[paths.events]]\nat_s = 2.0\ndown = false"),
    ])
    # 40 Mb/s for 1 s, nothing for 1 s, then 40 Mb/s again: 8 MB arrive at 2.6 s.
    assert pair_ideal_time_s(line, "a1", "c1", 8 * MB, relay=True) == pytest.approx(2.6)


def test_pair_bound_argument_errors() -> None:
    with pytest.raises(ValueError, match="unknown site 'z'; sites: e, w, u"):
        pair_ideal_time_s(TRIANGLE, "e", "z", MB)
    with pytest.raises(ValueError, match="two different sites"):
        max_flow_Bps(TRIANGLE, "e", "e")
    assert pair_ideal_time_s(TRIANGLE, "e", "w", 0) == 0.0


def test_allreduce_bound_is_the_busiest_site_share_over_its_narrower_side() -> None:
    size = 30 * MB
    # egress/ingress (Mb/s): e 500/500, w 150/400, u 700/450 -> w's 150 limits.
    assert egress_ingress_Bps(TRIANGLE, "w") == (pytest.approx(150 * Mbps), pytest.approx(400 * Mbps))
    share = 2 * size * 2 / 3
    assert allreduce_ideal_time_s(TRIANGLE, size) == pytest.approx(share / (150 * Mbps) + 0.010)


def test_allreduce_bound_counts_loss_and_down_paths_at_the_start() -> None:
    square = mesh(["s0", "s1", "s2", "s3"], [
        ("a", "s0", "s1", 10, 100, "loss = 0.5"),
        ("b", "s1", "s2", 10, 100, ""),
        ("c", "s2", "s3", 4, 100, "[[paths.events]]\nat_s = 0.0\ndown = true"),
        ("d", "s3", "s0", 8, 100, ""),
        ("e", "s2", "s3", 6, 100, ""),
    ])
    # s0 and s1: 50 + 100 = 150 Mb/s each way (a loses half); s2 and s3: 200 (c is down, and its
    # 2 ms one-way delay does not count: e's 3 ms is the smallest).
    assert allreduce_ideal_time_s(square, 8 * MB) == pytest.approx(2 * 8 * MB * 3 / 4 / (150 * Mbps) + 0.003)
    lonely = mesh(["x", "y", "z"], [("a", "x", "y", 1, 10, ""), ("b", "y", "z", 1, 10, "loss = 1.0")])
    assert allreduce_ideal_time_s(lonely, MB) == math.inf
    assert allreduce_ideal_time_s(lonely, 0) == 0.0


def _min_cut(caps: dict[tuple[str, str], float], sites: tuple[str, ...], src: str, dst: str) -> float:
    """Brute force over every cut separating ``src`` from ``dst`` (the min-cut side of max-flow)."""
    others = [s for s in sites if s not in (src, dst)]
    best = math.inf
    for k in range(len(others) + 1):
        for chosen in itertools.combinations(others, k):
            side = {src, *chosen}
            best = min(best, sum(c for (x, y), c in caps.items() if x in side and y not in side))
    return best


@st.composite
def random_meshes(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(2, 6))
    sites = [f"s{i}" for i in range(n)]
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1])
    pairs = draw(st.lists(pair, min_size=1, max_size=12))
    paths = []
    for k, (i, j) in enumerate(pairs):
        mbps = draw(st.integers(1, 1000))
        back = draw(st.integers(1, 1000))
        reverse = f"[paths.reverse]\nbandwidth_mbps = {back}"
        paths.append((f"p{k}", sites[i], sites[j], 10.0, float(mbps), reverse))
    touched = {s for _, x, y, *_ in paths for s in (x, y)}
    for s in sites:
        if s not in touched:
            paths.append((f"q{s}", s, sites[0] if s != sites[0] else sites[1], 10.0, 5.0, ""))
    return mesh(sites, paths)


@settings(max_examples=60)
@given(random_meshes(), st.data())
def test_max_flow_equals_the_min_cut(scenario: Scenario, data: st.DataObject) -> None:
    src, dst = data.draw(st.permutations(scenario.sites))[:2]
    caps = capacities_Bps(scenario)
    cut = _min_cut(caps, scenario.sites, src, dst)
    assert max_flow_Bps(scenario, src, dst) == pytest.approx(cut, rel=1e-9)
    direct = caps.get((src, dst), 0.0)
    assert max_flow_Bps(scenario, src, dst, direct=False) == pytest.approx(
        max_flow_Bps(scenario, src, dst) - direct, rel=1e-9, abs=1e-6)
