"""``python -m emulation allreduce``: argument checks (one line, exit 2) without namespaces."""

from __future__ import annotations

import pytest

from emulation.allreduce import AllreduceOptions, check_options
from emulation.cli import main


@pytest.mark.parametrize(("options", "message"), [
    (AllreduceOptions("gloo", compress="int8"), "gloo has no compression"),
    (AllreduceOptions("mpi"), "--comm"),
    (AllreduceOptions("wanxport", ranks_per_site=0), "--ranks-per-site"),
    (AllreduceOptions("wanxport", steps=0), "--steps"),
    (AllreduceOptions("wanxport", ranks_per_site=2, size_bytes=6), "--size"),
])
def test_bad_options_are_one_line_errors(options: AllreduceOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_options(options)


def test_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allreduce", "allreduce-4route", "--comm", "gloo", "--compress", "bf16"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "gloo has no compression" in err[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["allreduce-4route", "--comm", "wanxport", "--schedule", "relay"], "need more than two sites"),
    (["allreduce-4route", "--comm", "wanxport,gloo"], "need more than two sites"),
    (["mesh-4site", "--comm", "gloo-striped"], "valid: wanxport, gloo"),
    (["mesh-4site", "--comm", "wanxport", "--schedule", "butterfly"], "--schedule: unknown"),
    (["mesh-4site", "--comm", "wanxport", "--rounds", "0"], "--rounds"),
    (["mesh-4site", "--comm", "wanxport,gloo", "--compress", "int8"], "gloo has no compression"),
])
def test_n_site_usage_errors_exit_2_before_any_namespace(argv: list[str], message: str,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["allreduce", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_bundled_scenario_ideal_is_a_few_seconds() -> None:
    from emulation.bundled import resolve_scenario
    from wanxport.scenario import ideal_time_s

    for name in ("allreduce-4route", "allreduce-4route-blackhole"):
        scenario = resolve_scenario(name)
        assert len(scenario.paths) == 4
        assert 1.0 < ideal_time_s(scenario, 64 << 20, "both") < 5.0


@pytest.mark.parametrize("compress", [None, "int8"])
def test_rank_checker_agrees_with_the_float64_bound(compress: str | None) -> None:
    """The rank's float32 check accepts the fixed-order float32 sum and rejects exactly what
    the float64 bound rejects (never tighter, and not looser by a float32 ulp's worth)."""
    import numpy as np

    from emulation.baselines.allreduce_app import Checker, inputs

    spec = {"ranks_per_site": 1, "count": 4096, "seed": 7, "site": 1, "rank": 0, "compress": compress}
    checker = Checker(spec)
    xs = inputs(7, 2, 1, 4096)
    result = xs[0][0] + xs[1][0]
    ok, ratio, digest = checker.verdict(result)
    assert ok and ratio < 1.0 and len(digest) == 16
    exact = xs[0][0].astype(np.float64) + xs[1][0]
    tol = checker.tol.astype(np.float64)
    for i, sign in ((17, 1.0), (300, -1.0)):
        over = result.copy()
        over[i] = np.float32(exact[i] + sign * 3.0 * tol[i])  # beyond the bound (a few ulps)
        assert checker.check(over)[0] is False
        assert checker.check(over)[1] > 1.0
    for bad in (np.nan, np.inf):
        broken = result.copy()
        broken[5] = bad
        assert checker.check(broken)[0] is False
    assert np.all(checker.lo.astype(np.float64) <= exact - tol * (1 - 1e-6))
    assert np.all(checker.hi.astype(np.float64) >= exact + tol * (1 - 1e-6))


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to create network namespaces")
@pytest.mark.parametrize("compress", ["none", "int8"])
def test_two_ranks_per_site_run_the_hooks_chunked_path_over_the_emulated_wan(compress: str) -> None:
    """R = 2 through ``wanxport.torch.allreduce_tensor`` with several chunks (the last one
    short): every rank's result within its bound (int8: per chunk slice), all ranks equal."""
    pytest.importorskip("torch", reason="R > 1 needs the torch extra")
    from emulation.allreduce import run_allreduce
    from emulation.bundled import resolve_scenario

    options = AllreduceOptions("wanxport", ranks_per_site=2, size_bytes=(3 << 20) + 8, steps=2,
                               compress=compress, chunk_bytes=1 << 20, timeout_s=60.0)
    report = run_allreduce(resolve_scenario("allreduce-4route"), options)
    assert report["errors"] == [] and report["correct"] is True, report["errors"]
    assert report["identical_across_ranks"] is True and report["chunk_bytes"] == 1 << 20
    assert len(report["step_s"]) == 2
    sent = report["collective_bytes_sent"]
    raw = 2 * 2 * (options.size_bytes // 2) * 2  # 2 sites x 2 ranks, each its half, x 2 steps
    assert (sent < raw / 3.5) if compress == "int8" else (raw <= sent < raw * 1.01), (sent, raw)
    # Each rank's CPU by thread role over its timed steps: its group's loop thread ran the
    # sessions and hashed shards; the roles add up to no more than the process's CPU then.
    assert [(r["site"], r["rank"]) for r in report["ranks"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for rank, step_cpu in zip(report["ranks"], report["rank_step_cpu_s"], strict=True):
        roles = rank["cpu"]
        assert all(v >= 0 for v in roles.values()) and roles["loop"] > 0 and roles["digest"] > 0
        assert sum(roles.values()) <= sum(step_cpu) + 0.01  # step_cpu_s is rounded to ms
        assert rank["cpu_s_per_gb"] > 0
    assert report["backend"] != "engine" or report["cpu_other"]["engine"] >= 0


TWO_ROUTES = """
name = "gloo-striped-2route"
seed = 3
[transfer]
direction = "both"
[[paths]]
name = "fast"
rtt_ms = 4.0
bandwidth_mbps = 300.0
[[paths]]
name = "slow"
rtt_ms = 8.0
bandwidth_mbps = 100.0
"""


def test_the_checker_is_bitwise_for_two_ranks_when_asked() -> None:
    import numpy as np

    from emulation.baselines.allreduce_app import Checker

    spec = {"ranks_per_site": 1, "count": 1000, "seed": 5, "site": 0, "rank": 0, "bitwise": True}
    checker = Checker(spec)
    a, b = (np.random.default_rng([5, s, 0]).standard_normal(1000, dtype=np.float32) for s in (0, 1))
    assert checker.check(a + b)[0] is True
    nudged = a + b
    nudged[7] = np.nextafter(nudged[7], np.float32(np.inf))  # within the tolerance, one ulp off
    assert checker.check(nudged)[0] is False
    assert Checker({**spec, "bitwise": False}).check(nudged)[0] is True


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to create network namespaces")
def test_gloo_striped_all_reduces_over_both_routes_bit_for_bit() -> None:
    """One gloo group per route, the array split 3:1 by capacity: every step's result equals the
    plain float32 sum bit for bit on both ranks, and both routes carried their stripe."""
    pytest.importorskip("torch", reason="gloo needs the torch extra")
    from emulation.allreduce import run_allreduce
    from wanxport.scenario import parse_scenario

    options = AllreduceOptions("gloo-striped", size_bytes=4 << 20, steps=2, timeout_s=60.0)
    report = run_allreduce(parse_scenario(TWO_ROUTES), options)
    assert report["errors"] == [] and report["correct"] is True, report["errors"]
    assert report["identical_across_ranks"] is True and len(report["step_s"]) == 2
    stripes = report["settings"]["stripes"]
    assert [s["elements"] for s in stripes] == [786432, 262144]  # 3:1 of 1 Mi float32
    assert report["settings"]["net.ipv4.tcp_slow_start_after_idle"] == {"a": "0", "b": "0"}
    fast, slow = (p["wire_bytes_a_to_b"] for p in report["paths"])
    # Each route carried at least its stripe's reduce-scatter and all-gather share (2 ranks:
    # half its bytes each way, twice per step), so neither route idled.
    assert fast >= 2 * 786432 * 4 // 2 * 2 and slow >= 2 * 262144 * 4 // 2 * 2, (fast, slow)


TRIANGLE = """
name = "t-mesh-allreduce"
[[sites]]
name = "a"
[[sites]]
name = "b"
[[sites]]
name = "c"
[[paths]]
name = "ab"
between = ["a", "b"]
rtt_ms = 10.0
bandwidth_mbps = 100.0
[[paths]]
name = "bc"
between = ["b", "c"]
rtt_ms = 10.0
bandwidth_mbps = 100.0
[[paths]]
name = "ac"
between = ["a", "c"]
rtt_ms = 20.0
bandwidth_mbps = 50.0
"""


@pytest.mark.netns
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.skipif(__import__("os").geteuid() != 0, reason="needs root to create network namespaces")
def test_an_all_reduce_among_three_sites_is_correct_and_reports_each_ranks_cpu() -> None:
    """The N-site runner end to end, wanxport then gloo on the same emulation: both correct and
    equal at every rank; wanxport's report carries each rank's CPU by thread role and per GB
    it moved (sent plus received), and the impairment engine's CPU beside them."""
    from emulation.mesh_allreduce import run_mesh
    from wanxport.scenario import parse_scenario

    options = AllreduceOptions("wanxport", size_bytes=1 << 20, steps=2, timeout_s=60.0)
    wanxport, gloo = run_mesh(parse_scenario(TRIANGLE), options, ["wanxport", "gloo"], ["auto"], 1)
    for report in (wanxport, gloo):
        assert report["errors"] == [] and report["correct"] is True, report["errors"]
        assert report["identical_across_ranks"] is True and len(report["step_s"]) == 2
    assert [(r["site"], r["rank"]) for r in wanxport["ranks"]] == [(0, 0), (1, 0), (2, 0)]
    for rank in wanxport["ranks"]:
        assert rank["cpu"]["loop"] > 0 and all(v >= 0 for v in rank["cpu"].values())
        assert rank["cpu_s_per_gb"] > 0
    assert [r["cpu_s_per_gb"] for r in gloo["ranks"]] == [None] * 3  # gloo counts no collective bytes
    assert wanxport["backend"] != "engine" or wanxport["cpu_other"]["engine"] >= 0
