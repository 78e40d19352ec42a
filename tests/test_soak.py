"""benchmarks/soak.py: the long monitored run of two daemons, in short."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import soak  # noqa: E402


def args(*argv: str) -> argparse.Namespace:
    return soak.parse_args(list(argv))


def test_durations_parse_and_bad_ones_are_usage_errors() -> None:
    assert soak.parse_duration("1h") == 3600 and soak.parse_duration("45s") == 45
    assert soak.parse_duration("2m") == 120 and soak.parse_duration("7") == 7
    for bad in ("soon", "-3s", "0"):
        with pytest.raises(argparse.ArgumentTypeError):
            soak.parse_duration(bad)
    with pytest.raises(SystemExit) as exc:
        args("--flap-every", "10s", "--down-s", "10")
    assert exc.value.code == 2


def test_the_units_environment_lines_are_read_as_systemd_does(tmp_path: Path) -> None:
    unit = tmp_path / "x.service"
    unit.write_text('[Service]\nEnvironment=A=1 "B=two words"\nEnvironment=C=3\nExecStart=/bin/true\n')
    assert soak.unit_environment(unit) == {"A": "1", "B": "two words", "C": "3"}
    unit.write_text("[Service]\nEnvironment=JUSTANAME\n")
    with pytest.raises(ValueError, match="JUSTANAME"):
        soak.unit_environment(unit)


def test_scenario_is_capped_renamed_and_flaps_one_path() -> None:
    from emulation.bundled import resolve_scenario

    base = resolve_scenario("failover-4path")
    s = soak.soak_scenario(base, args("--scenario", "failover-4path", "--duration", "3m",
                                      "--rate-mbps", "50", "--flap-path", "2"))
    assert s.name != base.name and s.name.endswith("failover-4path")
    assert {p.forward.bandwidth_mbps for p in s.paths} == {50.0}
    assert {p.reverse.bandwidth_mbps for p in s.paths} == {50.0}
    assert [p.events for i, p in enumerate(s.paths) if i != 2] == [(), (), ()]  # its own events gone
    flaps = [(e.at_s, e.down) for e in s.paths[2].events]
    assert flaps[:4] == [(60, True), (70, False), (120, True), (130, False)]
    assert s.paths[2].params_at(65).down and not s.paths[2].params_at(75).down


def _samples(rss_a: list[int]) -> list[dict[str, object]]:
    return [{"t_s": float(10 * i), "gw-a": {"rss_anon_kib": r}, "gw-b": {"rss_anon_kib": 1000}}
            for i, r in enumerate(rss_a)]


def test_verdict_compares_last_window_with_second_quarter() -> None:
    flat = soak.verdict(_samples([1000] * 40), 400.0)  # 40 samples over 400 s: window 100 s
    assert flat["pass"] and flat["gw-a"]["change"] == 0 and flat["last_window_s"] == 100
    growing = soak.verdict(_samples([1000 + 3 * i for i in range(40)]), 400.0)
    assert not growing["pass"] and growing["gw-a"]["change"] > 0.02
    assert growing["gw-b"]["change"] == 0


@pytest.mark.netns
@pytest.mark.timeout(120)
def test_short_soak_moves_verified_bytes_and_cleans_up(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("ethtool") is None:
        pytest.skip("needs root, iproute2 and ethtool for network namespaces")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--duration", "25s", "--flap-every", "10s",
         "--down-s", "3", "--reload-every", "8s", "--sample-every", "2s", "--file-size", str(8 << 20),
         "--out", str(out)],
        capture_output=True, text=True, timeout=100, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert "verdict:" in proc.stdout and "t=" in proc.stdout, proc.stdout + proc.stderr
    report = json.loads((out / "soak.json").read_text())
    assert report["error"] is None and report["complete"], report["error"]
    assert report["failures"] == [] and report["bytes_verified"] > 0
    assert report["transfers_done"] * (8 << 20) == report["bytes_verified"]
    samples = report["samples"]
    assert len(samples["t_s"]) >= 8 and samples["t_s"][-1] >= 25
    assert any(samples["flap_down"]) and not all(samples["flap_down"])
    for site in ("gw-a", "gw-b"):
        assert min(samples[site]["rss_anon_kib"]) > 0 and min(samples[site]["fds"]) > 0
        assert min(samples[site]["tasks"]) > 0
        assert samples[site]["reloads"][-1] >= 2  # the daemons applied the SIGHUPs
    assert report["cleanup"]["daemon_exit_codes"] == {"gw-a": 0, "gw-b": 0}
    assert report["cleanup"]["namespaces_left"] == []
    ours = {r.split()[-1] for r in report["cleanup"]["removed"] if r.startswith("namespace ")}
    listed = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert len(ours) == 3 and not ours & listed
    assert (out / "soak.png").stat().st_size > 10_000
