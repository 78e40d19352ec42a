"""The A/B runner's summary of emulated transfers: completion medians, and each end's CPU."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ab_emulated as ab  # noqa: E402 - a script beside the package, not installed


def report(completion_s: float, sender: float, receiver: float, loop_share: float,
           engine: float | None = 2.0) -> dict[str, Any]:
    """A run report as `emulation run --json` writes it (only the fields the summary reads)."""
    roles = {"loop": loop_share, "release": 1.0 - loop_share, "digest": 0.0}
    cpu = {end: dict(roles) for end in ("sender", "receiver")}
    out: dict[str, Any] = {"completion_s": completion_s, "intact": True, "cpu": cpu,
                           "cpu_s_per_gb": {"sender": sender, "receiver": receiver}}
    if engine is not None:
        out["cpu_other"] = {"engine": engine}
    return out


def test_transfers_compare_each_ends_cpu_beside_the_completion_times(
        capsys: pytest.CaptureFixture[str]) -> None:
    reports = {"hetero-8path": {
        "a": [report(12.0, 7.0, 7.0, 0.5), report(12.4, 8.0, 9.0, 0.5), report(12.2, 7.5, 8.0, 0.5)],
        "b": [report(12.1, 6.0, 5.0, 0.25), report(12.0, 5.0, 4.0, 0.25), report(13.0, 7.0, 6.0, 0.25)],
    }}
    entry = ab.transfer_summary(reports)["hetero-8path"]
    assert (entry["a_median_s"], entry["b_median_s"]) == (12.2, 12.1)
    cpu = entry["cpu"]
    assert cpu["a_median"]["sender_cpu_s_per_gb"] == 7.5 and cpu["b_median"]["receiver_cpu_s_per_gb"] == 5.0
    # the loop's share of each end's CPU, per GB: half of A's, a quarter of B's
    assert cpu["a_median"]["receiver_loop_cpu_s_per_gb"] == pytest.approx(4.0)
    assert cpu["b_median"]["sender_loop_cpu_s_per_gb"] == pytest.approx(1.5)
    assert cpu["b_over_a"]["receiver_cpu_s_per_gb"] == pytest.approx(5.0 / 8.0)
    assert cpu["a_median"]["engine_cpu_s"] == 2.0
    assert "receiver 8.00 -> 5.00" in capsys.readouterr().out


def test_transfers_without_cpu_figures_compare_completion_only() -> None:
    plain = {"completion_s": 10.0, "intact": True}  # another transport's report: no CPU
    reports = {"clean-2path": {"a": [plain], "b": [dict(plain, completion_s=11.0)]}}
    entry = ab.transfer_summary(reports)["clean-2path"]
    assert entry["b_over_a"] == pytest.approx(1.1) and "cpu" not in entry
