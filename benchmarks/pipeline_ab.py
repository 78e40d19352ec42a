"""Pipeline stages across two emulated sites, wanxport against gloo alternated in one run.

    sudo .venv/bin/python benchmarks/pipeline_ab.py --scenarios allreduce-4route,east-west-us \\
        --sizes 64KiB,4MiB,16MiB [--microbatches 4] [--steps 10] [--rounds 1] --out DIR

For every round, scenario and activation size, runs ``python -m emulation pipeline``'s own
code (``emulation.pipeline.run_pipeline``) once per comm, the order of the two comms
swapped every round so neither always runs on a fresher host; the first size of each
scenario also runs the latency sweep (64 KiB to 16 MiB). Writes each run report to
``DIR/<scenario>-<size>-<comm>-r<round>.json`` as it finishes and prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from emulation.bundled import resolve_scenario
from emulation.pipeline import PipelineOptions, run_pipeline
from emulation.run import exit_on_sigterm
from wanxport.units import format_size, parse_size


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="allreduce-4route,east-west-us")
    parser.add_argument("--sizes", default="64KiB,4MiB,16MiB")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--messages", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
