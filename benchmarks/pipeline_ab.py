"""Pipeline stages across two emulated sites, wanxport against gloo alternated in one run.

    sudo .venv/bin/python benchmarks/pipeline_ab.py --scenarios allreduce-4route,east-west-us \\
        --sizes 64KiB,4MiB,16MiB [--microbatches 4] [--steps 10] [--rounds 1] --out DIR

For every round, scenario and activation size, runs ``python -m emulation pipeline``'s own
code (``emulation.pipeline.run_pipeline``) once per comm, the order of the two comms
swapped every round so neither always runs on a fresher host; the first size of each
scenario also runs the latency sweep (64 KiB to 16 MiB). Writes each run report to
``DIR/<scenario>-<size>-<comm>-r<round>.json`` as it finishes and prints one line per run;
at the end folds them into one file per scenario and size, ``DIR/<scenario>-<size>.json``:
``{"wanxport": [round 0, round 1, ...], "gloo": [...]}`` (``--fold DIR`` does only that).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from emulation.bundled import resolve_scenario
from emulation.pipeline import PipelineOptions, run_pipeline
from emulation.run import exit_on_sigterm
from wanxport.units import format_size, parse_size

RUN_FILE = re.compile(r"(?P<scenario>.+)-(?P<size>\d+[KMG]iB)-(?P<comm>wanxport|gloo)-r(?P<round>\d+)\.json")


def fold(directory: Path) -> list[Path]:
    """The run reports in ``directory`` folded into one file per scenario and size (the runs
    removed): ``{"scenario", "size", "wanxport": [round 0, ...], "gloo": [round 0, ...]}``."""
    runs: dict[tuple[str, str], dict[str, dict[int, object]]] = {}
    found = []
    for path in sorted(directory.glob("*.json")):
        match = RUN_FILE.fullmatch(path.name)
        if match is None:
            continue
        by_comm = runs.setdefault((match["scenario"], match["size"]), {})
        by_comm.setdefault(match["comm"], {})[int(match["round"])] = json.loads(path.read_text())
        found.append(path)
    written = []
    for (scenario, size), comms in runs.items():
        out = directory / f"{scenario}-{size}.json"
        folded = {"scenario": scenario, "size": size,
                  **{comm: [rounds[k] for k in sorted(rounds)] for comm, rounds in sorted(comms.items())}}
        out.write_text(json.dumps(folded, indent=1) + "\n")
        written.append(out)
    for path in found:
        path.unlink()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="allreduce-4route,east-west-us")
    parser.add_argument("--sizes", default="64KiB,4MiB,16MiB")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--fold", type=Path, metavar="DIR", help="only fold DIR's run reports")
    args = parser.parse_args(argv)
    if args.fold is not None:
        print("\n".join(str(p) for p in fold(args.fold)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    exit_on_sigterm()  # a stopped run tears its namespaces down
    args.out.mkdir(parents=True, exist_ok=True)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    for rnd in range(args.rounds):
        comms = ("wanxport", "gloo") if rnd % 2 == 0 else ("gloo", "wanxport")
        for name in args.scenarios.split(","):
            scenario = resolve_scenario(name)
            for k, size in enumerate(sizes):
                for comm in comms:
                    options = PipelineOptions(comm, microbatches=args.microbatches, activation_bytes=size,
                                              steps=args.steps, latency_sweep=k == 0, messages=args.messages)
                    report = run_pipeline(scenario, options)
                    label = format_size(size).replace(".00 ", "").replace(" ", "")
                    path = args.out / f"{name}-{label}-{comm}-r{rnd}.json"
                    path.write_text(json.dumps(report, indent=1) + "\n")
                    print(f"{name} {label} {comm}: mean step {report['mean_step_s']} s, p90 "
                          f"{report['p90_step_s']} s, bound {report['ideal_s']} s, "
                          f"correct {report['correct']}", flush=True)
    fold(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
