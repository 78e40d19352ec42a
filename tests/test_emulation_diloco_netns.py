"""``python -m emulation diloco`` for real, tiny: three sites in namespaces, one killed and restarted.

Needs root (``@pytest.mark.netns``). The run removes its namespaces (the control network's
included) and processes, also when it fails.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from emulation.control import ControlNetwork
from emulation.diloco import DilocoOptions, check_options, run_diloco
from emulation.naming import plan
from emulation.topology import existing_namespaces
from wanxport.scenario import parse_scenario

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to create network namespaces"),
]

# 100 ms of round trip on every pair: an outer step's all-reduce takes at least one one-way
# delay (50 ms), so the survivors' 200 outer steps last at least 10 s after the kill at 1 s
# (about 25 s here): the restarted site, started 1 s after the kill, has that long to import
# torch and be admitted on a busy host. Later than that it is told the group ended.
THREE = """
name = "{name}"
[[sites]]
name = "p"
[[sites]]
name = "q"
[[sites]]
name = "r"
[[paths]]
name = "pq"
between = ["p", "q"]
rtt_ms = 100.0
bandwidth_mbps = 50.0
[[paths]]
name = "qr"
between = ["q", "r"]
rtt_ms = 100.0
bandwidth_mbps = 50.0
[[paths]]
name = "pr"
between = ["p", "r"]
rtt_ms = 100.0
bandwidth_mbps = 50.0
"""
OUTER_STEPS = 200


def _log_tails(logs: Path) -> str:
    """The end of every process's stderr, for a failure's message."""
    files = sorted(logs.glob("*.log"))
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in files)


def test_a_killed_site_rejoins_and_every_site_ends_with_the_same_model(tmp_path: Path) -> None:
    scenario = parse_scenario(THREE.format(name=f"t-diloco-{os.getpid()}"))
    raw = [{"kind": "kill", "target": "r", "at_s": 1.0, "rejoin_after_s": 1.0}]
    sites, faults = check_options(scenario, 3, OUTER_STEPS, 2, 16, raw)
    options = DilocoOptions(sites=3, outer_steps=OUTER_STEPS, inner_steps=2, hidden=16, timeout_s=30.0,
                            deadline_s=150.0, backend="engine", faults=tuple(faults),
                            logs=str(tmp_path))
    try:
        report = run_diloco(scenario, sites, options)
    finally:
        built = plan(scenario)
        assert existing_namespaces([*built.namespaces, ControlNetwork(built, sites).namespace]) == []
        assert not os.path.exists(built.state_dir)
    assert report["errors"] == [] and report["intact"], json.dumps(report["errors"]) + _log_tails(tmp_path)
    assert report["workload"] == "diloco" and report["sites"] == ["p", "q", "r"]
    (fault,) = report["faults"]
    assert fault["kind"] == "kill" and fault["rejoined_as"] == "r#2"
    assert fault["recovery_s"] is not None and fault["recovery_s"] > 0
    assert report["rejoin_s"] == fault["rejoin_s"] and report["rejoin_s"] > 0
    # Every site, the restarted one included, finished the whole run with the same parameters.
    assert sorted(report["final_loss_per_site"]) == ["p", "q", "r"]
    assert report["identical_across_sites"]
    assert [s["step"] for s in report["outer_steps"]] == list(range(1, OUTER_STEPS + 1))
    assert report["state_bytes"] > 4 * report["model"]["params"]
    assert report["lag_max_s"] is not None and report["commit"]
