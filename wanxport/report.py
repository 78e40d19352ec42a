"""Run reports, contract v1 (docs/design.md section 5): one JSON object per run.

Every runner (simulator, loopback bench, emulation, baselines) builds its
report here so the required fields keep one meaning everywhere.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SCHEMA = "wanxport.report/1"
MODES = ("sim", "emulated", "loopback", "network")
TRANSPORTS = ("wanxport", "tcp", "tcp-parallel", "mptcp", "aioquic")
# What a stepped run's efficiency divides by: the mean of steps 2..N ("median" in
# reports from before December 2026, which used steady_step_s).
EFFICIENCY_BASIS = "mean"


@dataclass
class PathReport:
    name: str
    payload_bytes: int
    retransmitted_bytes: int
    srtt_s: float | None
    state: str
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "payload_bytes": self.payload_bytes,
                "retransmitted_bytes": self.retransmitted_bytes, "srtt_s": self.srtt_s,
                "state": self.state, **self.extra}


def build_report(*, scenario: str, mode: str, transport: str, payload_bytes: int,
                 completion_s: float, ideal_s: float | None, intact: bool, wall_s: float | None,
                 paths: list[PathReport], delivered_bytes: int | None = None,
                 steps: int = 1, step_s: list[float] | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The v1 report; ``extra`` fields are added after the required ones.

    ``goodput_bps`` is the payload delivered intact divided by the completion time,
    so an incomplete run reports what actually arrived. ``wall_s`` None means the
    runner keeps no real time (the simulator): its caller fills it in with
    ``with_wall_time``.

    With ``steps`` > 1, ``payload_bytes`` and ``completion_s`` cover the whole run
    (every step and the think time between them), ``ideal_s`` is one step's ideal,
    ``step_s`` holds the steps that finished, and ``efficiency`` is
    ``ideal_s / mean_step_s`` (None until two steps finished): a training job pays
    every step after the first, its slow ones included, and the first (cold) one once.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}")
    if steps < 1:
        raise ValueError("steps must be at least 1")
    delivered = payload_bytes if delivered_bytes is None else delivered_bytes
    goodput = delivered * 8 / completion_s if completion_s > 0 else 0.0
    stepped = step_summary(step_s or []) if steps > 1 else {}
    denominator = stepped.get("mean_step_s") if steps > 1 else completion_s
    efficiency = (ideal_s / denominator
                  if ideal_s and denominator and denominator > 0 and math.isfinite(ideal_s) else None)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "scenario": scenario,
        "mode": mode,
        "transport": transport,
        "payload_bytes": payload_bytes,
        "completion_s": _round(completion_s),
        "ideal_s": _round(ideal_s) if ideal_s is not None and math.isfinite(ideal_s) else None,
        "efficiency": _round(efficiency) if efficiency is not None else None,
        "goodput_bps": _round(goodput),
        "intact": intact,
        "wall_s": _round(wall_s) if wall_s is not None else None,
        "paths": [p.to_dict() for p in paths],
    }
    if steps > 1:
        report["steps"] = steps
        report.update(stepped)
        report["efficiency_basis"] = EFFICIENCY_BASIS
    report.update(extra)
    return report


def step_summary(step_s: list[float]) -> dict[str, Any]:
    """``step_s`` and its summary (docs/design.md section 5): the first (cold) step, then over
    steps 2..N the mean (what a training job pays per step, the efficiency's denominator),
    the 90th percentile, the worst, and the median (``steady_step_s``, kept to compare
    with reports from before the mean). None where fewer than two steps finished."""
    later = sorted(step_s[1:])
    return {
        "step_s": [_round(s) for s in step_s],
        "first_step_s": _round(step_s[0]) if step_s else None,
        "mean_step_s": _round(math.fsum(later) / len(later)) if later else None,
        "p90_step_s": _round(_quantile(later, 0.9)) if later else None,
        "worst_step_s": _round(later[-1]) if later else None,
        "steady_step_s": _round(_quantile(later, 0.5)) if later else None,
    }


def spread(values: list[float]) -> dict[str, float] | None:
    """``{"p50", "p99", "max"}`` of ``values`` (e.g. shard completion times), None if empty.

    Quantiles interpolate linearly between order statistics, so a handful of
    shards still gives a p99 that lies between the two slowest.
    """
    if not values:
        return None
    ordered = sorted(values)
    return {"p50": _round(_quantile(ordered, 0.5)), "p99": _round(_quantile(ordered, 0.99)),
            "max": _round(ordered[-1])}


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def with_wall_time(run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Call ``run`` and set its report's ``wall_s`` to the real seconds the call took.

    The simulator runs on virtual time only (docs/design.md section 2), so the real
    time a run took is measured here, by whoever starts it.
    """
    start = time.perf_counter()
    report = run()
    report["wall_s"] = _round(time.perf_counter() - start)
    return report


def _round(value: float) -> float:
    return float(f"{value:.6g}")


def dumps(report: dict[str, Any]) -> str:
    return json.dumps(report, sort_keys=False)
