"""A/B of ``wanxport bench`` variants in one run: CPU-seconds per GB at each end, and goodput.

    PYTHONPATH=. .venv/bin/python benchmarks/cpu_ab.py --runs 3 -- "" "--segments 64"

Each positional argument is one variant (extra ``wanxport bench`` arguments;
"" is the default). Variants run in turn, A B A B ..., so a drift in the
machine's load hits every variant alike; the medians are printed per variant.
CPU-s/GB (each end's own getrusage) holds on a loaded host, goodput does not:
run it under the shared lock. Reports go to ``--out`` as JSON lines.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys


def run_variant(common: list[str], extra: str) -> dict[str, object] | None:
    cmd = [sys.executable, "-m", "wanxport", "bench", *common, *shlex.split(extra), "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        print(f"  [{extra or 'default'}] failed: {proc.stderr.strip()[-300:]}", flush=True)
        return None
    report: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--paths", default="4")
    parser.add_argument("--out", default=None, help="append every report here (JSON lines)")
    parser.add_argument("variants", nargs="+")
    args = parser.parse_args()
    common = ["--size", args.size, "--paths", args.paths]
    got: dict[str, list[dict[str, object]]] = {v: [] for v in args.variants}
    for run in range(args.runs):
        for variant in args.variants:
            report = run_variant(common, variant)
            if report is None:
                continue
            report["variant"] = variant
            got[variant].append(report)
            cpu = report["cpu_s_per_gb"]
            assert isinstance(cpu, dict)
            print(f"run {run} [{variant or 'default'}]: {float(report['goodput_bps']) / 1e9:.2f} Gb/s, "  # type: ignore[arg-type]
                  f"CPU-s/GB sender {cpu['sender']:.3f} receiver {cpu['receiver']:.3f}, "
                  f"intact {report['intact']}", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(report, separators=(",", ":")) + "\n")
    for variant, reports in got.items():
        if not reports:
            continue
        med = {end: statistics.median(r["cpu_s_per_gb"][end] for r in reports)  # type: ignore[index]
               for end in ("sender", "receiver")}
        goodput = statistics.median(float(r["goodput_bps"]) for r in reports)  # type: ignore[arg-type]
        print(f"median [{variant or 'default'}] over {len(reports)}: {goodput / 1e9:.2f} Gb/s, "
              f"CPU-s/GB sender {med['sender']:.3f} receiver {med['receiver']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
