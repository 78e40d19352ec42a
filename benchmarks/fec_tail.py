"""With and without the erasure-coded tail, same scenarios and seeds, in the simulator.

Why: what the coded tail buys: completion and the worst run on lossy-long-2path
and hetero-8path at 16 and 64 MiB, with repair bytes as a share of payload.
Each run is ``--steps`` exchanges on one session (warm steps), in the virtual
payload mode (tests/test_fec.py holds it to the bytes mode's results).
Simulator results are virtual-time and deterministic, so this needs no lock.

    python benchmarks/fec_tail.py --steps 20 --out results/fec-tail.json
    python benchmarks/fec_tail.py --steps 20 --all --jobs 2 --out all.json   # every bundled scenario

A scenario with an events timeline cannot repeat steps (contract v1), so with
``--all`` those run one step of each size (``steps`` is 1 in their rows).
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from wanxport.scenario import Scenario
from wanxport.scenario.resolve import resolve
from wanxport.sim.runner import SimOptions, simulate

BUNDLED = Path(__file__).resolve().parent.parent / "emulation" / "scenarios"

SCENARIOS = ("lossy-long-2path", "hetero-8path")
SIZES = {"16MiB": 16 << 20, "64MiB": 64 << 20}
KEEP = ("scenario", "seed", "steps", "payload_bytes", "completion_s", "ideal_s", "efficiency", "intact",
        "fec",
        "step_s", "first_step_s", "mean_step_s", "p90_step_s", "worst_step_s", "steady_step_s",
        "efficiency_basis",
        "repair_bytes", "repaired_bytes", "retransmitted_after_repair_bytes", "fec_blocks_rebuilt",
        "fec_blocks_short")


def one(scenario: Scenario, fec: str) -> dict[str, Any]:
    report = simulate(scenario, SimOptions(payload_mode="virtual", fec=fec))
    row = {key: report.get(key) for key in KEEP}
    row["retransmitted_bytes"] = sum(p["retransmitted_bytes"] for p in report["paths"])
    row["paths_repair_bytes"] = {p["name"]: p["repair_bytes"] for p in report["paths"]}
    return row


def job(name: str, label: str, steps: int, fec: str) -> dict[str, Any]:
    scenario = resolve(name, BUNDLED)
    scenario = scenario.with_transfer(size_bytes=SIZES[label], steps=1 if scenario.has_events() else steps)
    row = one(scenario, fec)
    row["size"] = label
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--scenario", action="append",
                        help="a bundled name or a scenario file (default: both bundled)")
    parser.add_argument("--all", action="store_true", help="every bundled scenario (unless --scenario)")
    parser.add_argument("--size", action="append", choices=sorted(SIZES), help="default: both")
    parser.add_argument("--fec", action="append", choices=("off", "auto"), help="default: both")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (processes)")
    parser.add_argument("--out")
    args = parser.parse_args()
    names = args.scenario or (sorted(p.stem for p in BUNDLED.glob("*.toml")) if args.all else SCENARIOS)
    work = [(name, label, args.steps, fec) for name in names for label in (args.size or SIZES)
            for fec in (args.fec or ("off", "auto"))]
    print("scenario                    size   fec  steps   mean_s worst_s  ideal_s  efficiency worst/ideal "
          "repair%  intact")
    rows: list[dict[str, Any]] = []
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for r in pool.map(job, *zip(*work, strict=True)):
            rows.append(r)
            mean = r["mean_step_s"] if r["steps"] > 1 else r["completion_s"]
            worst = r["worst_step_s"] if r["steps"] > 1 else r["completion_s"]
            ideal = r["ideal_s"]
            print(f"{r['scenario']:27s} {r['size']:6s} {r['fec']:5s} {r['steps']:4d} "
                  f"{mean:8.3f} {worst:8.3f} "
                  f"{ideal:8.3f} {r['efficiency']:10.3f} {worst / ideal:11.3f} "
                  f"{100 * r['repair_bytes'] / r['payload_bytes']:7.2f}  {r['intact']}", flush=True)
    if args.out:
        with open(args.out, "w") as out:
            json.dump(rows, out, separators=(",", ":"))
            out.write("\n")
    return 0 if all(r["intact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
