"""What one ``Session.stats()`` call costs, at 8 and 256 paths, before and after a change.

    python benchmarks/stats_cost.py --before /path/to/old/checkout [--json]

Each tree is measured in a child process of its own (``PYTHONPATH`` set to it),
alternated round by round in the same run, so both see the same minutes of a
shared host. In each child the sessions are taken from a finished simulated
transfer (``SimRun``: every path measured, controllers past their start-up), so
the snapshot reads the state a running gateway has, not freshly built objects.
Each child times 15 repeats of enough calls to take ~20 ms and keeps the
fastest (on a shared host the slower repeats measure the neighbours); the
figure is the fastest over rounds, with the median over rounds beside it. A
run report goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PATH_COUNTS = (8, 256)
SCENARIO = """
name = "stats-{n}"
seed = 1
[transfer]
size = "{size}"
shards = 4
"""
PATH = """
[[paths]]
name = "p{i}"
rtt_ms = {rtt}
bandwidth_mbps = 50.0
"""


def measure(paths: int) -> dict[str, float]:
    """In the child: per-call seconds of ``stats()`` on the sender of a finished transfer."""
    from wanxport.scenario import parse_scenario
    from wanxport.sim.runner import SimOptions, SimRun

    text = SCENARIO.format(n=paths, size=f"{paths * 256}KiB") + "".join(
        PATH.format(i=i, rtt=20.0 + (i % 8) * 10.0) for i in range(paths))
    sim = SimRun(parse_scenario(text), SimOptions(payload_mode="virtual"))
    report = sim.run()
    if not report["intact"]:
        raise SystemExit(f"the {paths}-path transfer did not finish: nothing to measure")
    session = sim.a.session
    timer = timeit.Timer(session.stats)
    calls, took = timer.autorange()  # enough calls to take at least 0.2 s
    calls = max(1, int(calls * 0.02 / max(took, 1e-9)))
    best = min(timer.repeat(repeat=15, number=calls)) / calls
    return {"per_call_s": best, "calls": calls}


def child(tree: Path, paths: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--child", str(paths)], env=env, cwd=tree,
                         capture_output=True, text=True, check=True)
    return float(json.loads(out.stdout)["per_call_s"])


def commit_of(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=False, help="a checkout of the code to compare with")
    parser.add_argument("--rounds", type=int, default=5, help="alternated rounds per tree and path count")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(measure(args.child)))
        return
    if args.before is None:
        parser.error("--before: a checkout of the code to compare with")
    trees = {"before": args.before.resolve(), "after": ROOT}
    samples: dict[str, dict[int, list[float]]] = {k: {n: [] for n in PATH_COUNTS} for k in trees}
    for _ in range(args.rounds):
        for n in PATH_COUNTS:
            for name, tree in trees.items():
                samples[name][n].append(child(tree, n))
    result: dict[str, Any] = {
        "benchmark": "stats_cost", "host_cpu": cpu_model(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "rounds": args.rounds,
        "commit_before": commit_of(trees["before"]), "commit_after": commit_of(trees["after"]),
        "paths": {},
    }
    for n in PATH_COUNTS:
        before, after = min(samples["before"][n]), min(samples["after"][n])
        before_median = statistics.median(samples["before"][n])
        after_median = statistics.median(samples["after"][n])
        result["paths"][str(n)] = {
            "before_us": round(before * 1e6, 2), "after_us": round(after * 1e6, 2),
            "after_vs_before": round(after / before, 3),
            "before_us_per_path": round(before * 1e6 / n, 3), "after_us_per_path": round(after * 1e6 / n, 3),
            "median_before_us": round(before_median * 1e6, 2),
            "median_after_us": round(after_median * 1e6, 2),
            "median_after_vs_before": round(after_median / before_median, 3),
            "samples_before_us": [round(s * 1e6, 2) for s in samples["before"][n]],
            "samples_after_us": [round(s * 1e6, 2) for s in samples["after"][n]],
        }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
