"""A/B of two checkouts over the same emulated scenarios, runs interleaved.

Why interleaved: on a small shared host the machine's speed drifts over
minutes, so "all of A, then all of B" compares two moments as much as two
commits. Alternating A B A B ... gives each commit the same drift.

Each checkout needs its own ``.venv`` (``./dev setup`` there); every run is
``CHECKOUT/.venv/bin/python -m emulation run SCENARIO --transport wanxport
--json`` with the checkout as working directory, as root (namespaces).

    sudo .venv/bin/python benchmarks/ab_emulated.py --a /path/to/old --b . \\
        --runs 5 hetero-8path failover-4path --out results/ab.json

Prints, per scenario, each side's completion times, medians and B's median
over A's; ``--out`` keeps every report.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_once(checkout: Path, scenario: str, deadline_s: float, extra: list[str]) -> dict[str, Any]:
    python = checkout / ".venv" / "bin" / "python"
    cmd = [str(python), "-m", "emulation", "run", scenario, "--transport", "wanxport", "--json",
           "--deadline", str(deadline_s), *extra]
    done = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(cmd[1:])} failed ({done.returncode}): "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="+")
    parser.add_argument("--a", type=Path, required=True, help="checkout A (the baseline)")
    parser.add_argument("--b", type=Path, required=True, help="checkout B (the change)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=60.0)
    parser.add_argument("--out", type=Path, help="write every report and the summary here (JSON)")
    parser.add_argument("extra", nargs=argparse.REMAINDER, help="after --: more `emulation run` flags")
    args = parser.parse_args(argv)
    extra = args.extra[1:] if args.extra[:1] == ["--"] else args.extra
    sides = {"a": args.a.resolve(), "b": args.b.resolve()}
    reports: dict[str, dict[str, list[dict[str, Any]]]] = {s: {"a": [], "b": []} for s in args.scenarios}
    for i in range(args.runs):
        for scenario in args.scenarios:
            for side, checkout in sides.items():
                report = run_once(checkout, scenario, args.deadline, extra)
                reports[scenario][side].append(report)
                print(f"run {i + 1}/{args.runs} {scenario} {side}: {report['completion_s']:.2f} s "
                      f"intact={report['intact']}", file=sys.stderr, flush=True)
    summary = {}
    for scenario, by_side in reports.items():
        medians = {side: statistics.median(r["completion_s"] for r in runs) for side, runs in by_side.items()}
        summary[scenario] = {
            "a_completion_s": [r["completion_s"] for r in by_side["a"]],
            "b_completion_s": [r["completion_s"] for r in by_side["b"]],
            "a_median_s": medians["a"], "b_median_s": medians["b"],
            "b_over_a": medians["b"] / medians["a"],
            "all_intact": all(r["intact"] for runs in by_side.values() for r in runs),
        }
        print(f"{scenario}: A median {medians['a']:.2f} s, B median {medians['b']:.2f} s, "
              f"B/A {medians['b'] / medians['a']:.3f}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"a": str(sides["a"]), "b": str(sides["b"]), "summary": summary,
                                        "reports": reports}, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
