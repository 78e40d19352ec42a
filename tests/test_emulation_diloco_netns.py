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
# delay (50 ms), so the 10 outer steps cannot end before the kill at 0.2 s, and the survivors
# go on without the killed site only once they have found it dead (3 s). Its restart comes
# 6 s after the kill and must import torch first: the survivors reach their last step before
# it is back and hold there until it is (``--hold``), however slow the host.
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
OUTER_STEPS = 10


def _log_tails(logs: Path) -> str:
    """The end of every process's stderr, for a failure's message."""
    files = sorted(logs.glob("*.log"))
    return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-1500:]}" for f in files)


def test_a_killed_site_rejoins_and_every_site_ends_with_the_same_model(tmp_path: Path) -> None:
    scenario = parse_scenario(THREE.format(name=f"t-diloco-{os.getpid()}"))
    raw = [{"kind": "kill", "target": "r", "at_s": 0.2, "rejoin_after_s": 6.0}]
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
    assert report["held_from_step"] == OUTER_STEPS and fault["rejoin_s"] is not None
    assert report["rejoin_s"] == fault["rejoin_s"] and report["rejoin_s"] > 0
    # Every site, the restarted one included, finished the whole run with the same parameters.
    assert sorted(report["final_loss_per_site"]) == ["p", "q", "r"]
    assert report["identical_across_sites"]
    steps = report["outer_steps"]
    assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) > OUTER_STEPS
    assert sorted(steps[-1]["sites"]) == ["p", "q", "r"]  # the last step, held for it, had the restarted site
    assert report["state_bytes"] > 4 * report["model"]["params"]
    assert report["lag_max_s"] is not None and report["commit"]
