"""Loopback goodput against iperf3 -u, measured in the same run (README table numbers).

Runs ``wanxport bench`` (native data path, AES-256-GCM, BBR) a few times, each
with its own iperf3 UDP baseline (1472-byte datagrams) just before it, and
prints one line per run plus the median ratio. The clock is the report's
(``completion_s``: from the sender's first shard digest to the last byte verified at
the receiver); each line shows the digests' share and when the sender held the
verdict. Usage:

    PYTHONPATH=. .venv/bin/python benchmarks/loopback_goodput.py [--size 1GiB] [--paths 4] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--paths", default="4")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--shards", default="64")
    args = parser.parse_args()
    ratios = []
    for run in range(args.runs):
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from wanxport.bench.cli import main_for_scripts; "
             "sys.exit(main_for_scripts())", "--size", args.size, "--paths", args.paths,
             "--shards", args.shards, "--baseline", "iperf3", "--json"],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"run {run}: failed: {proc.stderr.strip()[-300:]}")
            continue
        r = json.loads(proc.stdout)
        ratio = r["goodput_bps"] / r["baseline_iperf3_udp_bps"]
        ratios.append(ratio)
        lost = sum(p["packets_lost"] for p in r["paths"])
        print(f"run {run}: wanxport {r['goodput_bps'] / 1e9:.2f} Gb/s in {r['completion_s']:.2f} s "
              f"(digests {r['digest_s']:.2f} s of it, verdict at {r['verdict_s']:.2f} s; "
              f"intact {r['intact']}, core packets lost {lost}), iperf3 -u "
              f"{r['baseline_iperf3_udp_bps'] / 1e9:.2f} Gb/s received -> ratio {ratio:.2f}")
    if ratios:
        print(f"median ratio {statistics.median(ratios):.2f} over {len(ratios)} runs")
    return 0 if ratios else 1


if __name__ == "__main__":
    sys.exit(main())
