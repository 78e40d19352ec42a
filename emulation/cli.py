"""``python -m emulation up|down|start|validate SCENARIO`` (and run, compare, allreduce, pipeline, diloco).

Exit status: 0 success, 1 the environment cannot do it (one line saying why),
2 bad usage or a bad scenario (one line naming the field).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

from emulation.bundled import resolve_scenario
from emulation.errors import EmulationError
from wanxport.cli import add_step_arguments, site_pair_argument, size_argument
from wanxport.scenario import ScenarioError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m emulation", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build the scenario's namespaces, links and impairment")
    up.add_argument("scenario")
    up.add_argument("--backend", choices=("netem", "engine"), help="default: netem if present")
    up.add_argument("--json", action="store_true", help="print namespaces and addresses as JSON")
    down = sub.add_parser("down", help="remove everything 'up' created")
    down.add_argument("scenario")
    start = sub.add_parser("start", help="start the events timeline now")
    start.add_argument("scenario")
    val = sub.add_parser("validate", help="measure every path with ping and iperf3")
    val.add_argument("scenario")
    val.add_argument("--backend", choices=("netem", "engine"))
    val.add_argument("--duration", type=float, default=3.0, help="seconds per iperf3 run")
    val.add_argument("--json", action="store_true")
    _add_experiment_parsers(sub)
    return parser



def _add_experiment_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``run`` and ``compare`` (side-by-side experiments, docs/notes/experiments.md)."""
    transports = ("wanxport", "tcp", "tcp-parallel", "mptcp", "aioquic")
    run = sub.add_parser("run", help="one transfer over the scenario; prints a run report")
    run.add_argument("scenario")
    run.add_argument("--transport", choices=transports, required=True)
    run.add_argument("--cc", choices=("cubic", "bbr", "reno"),
                     help="default: bbr for wanxport, cubic for TCP")
    run.add_argument("--fec", choices=("off", "auto"), default="auto",
                     help="wanxport's erasure-coded tail (default auto; off for the ablation)")
    run.add_argument("--size", type=size_argument, help="payload bytes (default: the scenario's)")
    run.add_argument("--between", type=site_pair_argument, metavar="FROM,TO",
                     help="the two sites of an N-site scenario the transfer runs between "
                          "(default: the scenario's [transfer] from/to, else its first two sites)")
    add_step_arguments(run)
    run.add_argument("--deadline", type=float, metavar="S",
                     help="stop after S seconds (default max(60, 20 x ideal))")
    run.add_argument("--backend", choices=("netem", "engine"))
    run.add_argument("--json", action="store_true", help="print exactly one run report (JSON)")
    cmp = sub.add_parser("compare", help="run a matrix of scenarios x transports; "
                                         "write reports, figures and a Markdown table")
    cmp.add_argument("scenarios", nargs="+", metavar="scenario",
                     help="a file or bundled name, optionally @SIZE (clean-2path@64MiB)")
    cmp.add_argument("--transports", default="tcp,tcp-parallel,mptcp,aioquic",
                     help="comma-separated; a TCP-based one may name its cc: mptcp:bbr")
    cmp.add_argument("--repeat", type=int, default=1)
    cmp.add_argument("--size", type=size_argument, help="payload bytes for every scenario without @SIZE")
    cmp.add_argument("--deadline", type=float, metavar="S")
    cmp.add_argument("--backend", choices=("netem", "engine"))
    cmp.add_argument("--no-sim", action="store_true", help="skip the simulator column")
    cmp.add_argument("--out", required=True, help="directory for reports, figures, table")
    ar = sub.add_parser("allreduce", help="an all-reduce among the scenario's sites, N steps, "
                                          "wanxport, gloo or gloo-striped; prints a run report")
    ar.add_argument("scenario")
    ar.add_argument("--comm", required=True, metavar="COMM",
                    help="wanxport, gloo or gloo-striped (two sites); gloo: on the best route; "
                         "gloo-striped: a gloo group per route, the array split by capacity. Among "
                         "more sites: wanxport or gloo, or a comma list (wanxport,gloo) run in turn")
    ar.add_argument("--schedule", default="auto", metavar="S",
                    help="more than two sites: wanxport's all-reduce schedule, auto (default), "
                         "direct, relay, ring or tree; a comma list runs each in turn")
    ar.add_argument("--rounds", type=int, default=1,
                    help="more than two sites: times every comm/schedule runs, in turn (default 1)")
    ar.add_argument("--out", metavar="DIR", help="more than two sites: write each run's report here")
    ar.add_argument("--ranks-per-site", type=int, default=1, metavar="R",
                    help="rank processes per site (default 1; SIZE must split evenly over them)")
    ar.add_argument("--size", type=size_argument, help="float32 array bytes (default 64MiB)")
    ar.add_argument("--steps", type=int, default=20, help="all-reduces on the same group (default 20)")
    ar.add_argument("--compress", choices=("none", "bf16", "int8"), default="none",
                    help="wanxport only (gloo: none)")
    ar.add_argument("--timeout", type=float, default=120.0, metavar="S",
                    help="per collective (default 120)")
    ar.add_argument("--chunk", type=size_argument, metavar="SIZE",
                    help="R > 1: the DDP hook's pipeline chunk (default the hook's, 4MiB)")
    ar.add_argument("--backend", choices=("netem", "engine"))
    ar.add_argument("--json", action="store_true", help="print exactly one run report (JSON)")
    _add_pipeline_parser(sub)
    _add_diloco_parser(sub)
    ren = sub.add_parser("render", help="figures and table again from a compare directory's reports")
    ren.add_argument("out", metavar="DIR", help="a compare --out directory")
    ren.add_argument("--transports", help="columns in this order (default: as found)")


def _add_pipeline_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``pipeline``: two pipeline stages at the two sites (emulation/pipeline.py)."""
    pp = sub.add_parser("pipeline", help="a two-stage pipeline, stage 0 at site a and stage 1 at b, "
                                         "N steps over wanxport or gloo; prints a run report")
    pp.add_argument("scenario")
    pp.add_argument("--comm", choices=("wanxport", "gloo"), required=True,
                    help="gloo: on the best route")
    pp.add_argument("--microbatches", type=int, default=4, metavar="M", help="per step (default 4)")
    pp.add_argument("--activation-size", type=size_argument, default=4 << 20, metavar="S",
                    help="bytes of one microbatch's activation, and of its gradient (default 4MiB)")
    pp.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    pp.add_argument("--latency-sweep", action="store_true",
                    help="then time single messages of 64KiB..16MiB from a to b")
    pp.add_argument("--messages", type=int, default=20, help="messages per size in the sweep (default 20)")
    pp.add_argument("--timeout", type=float, default=120.0, metavar="S", help="per message (default 120)")
    pp.add_argument("--backend", choices=("netem", "engine"))
    pp.add_argument("--json", action="store_true", help="print exactly one run report (JSON)")


def _add_diloco_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``diloco``: DiLoCo across the sites while they fail (emulation/diloco.py)."""
    from emulation.faults import add_fault_arguments, seconds

    dl = sub.add_parser("diloco", help="DiLoCo (examples/diloco_elastic.py) at the scenario's sites, a "
                                       "control network for the store, faults injected; prints a summary")
    dl.add_argument("scenario")
    dl.add_argument("--sites", type=int, required=True, metavar="N", help="the scenario's first N sites")
    dl.add_argument("--outer-steps", type=int, default=10, help="outer steps (default 10)")
    dl.add_argument("--inner-steps", type=int, default=20, metavar="H",
                    help="inner steps per outer step (default 20)")
    dl.add_argument("--hidden", type=int, default=2048,
                    help="model width (default 2048: about 5 M parameters)")
    dl.add_argument("--compress", choices=("none", "int8", "bf16"), default="none",
                    help="the pseudo-gradients' codec (default none)")
    dl.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    dl.add_argument("--noise", type=float, metavar="SIGMA",
                    help="the targets' noise (the held-out loss's floor is its square; default the "
                         "example's, 0.5)")
    dl.add_argument("--timeout", type=float, default=60.0, metavar="S", help="per collective (default 60)")
    dl.add_argument("--deadline", type=float, metavar="S",
                    help="stop the run after S seconds from go (default 120 + 60 x outer steps + "
                         "the hold)")
    dl.add_argument("--hold", type=seconds, default=120.0, metavar="S",
                    help="past the last outer step, train on for up to S seconds while a site the "
                         "faults bring back (restarted, or cut off and healed) is not back (default 120)")
    add_fault_arguments(dl)
    dl.add_argument("--backend", choices=("netem", "engine"))
    dl.add_argument("--json", metavar="FILE", help="write the run report (JSON) here")
    dl.add_argument("--logs", metavar="DIR",
                    help="keep every site process's stderr in DIR/LABEL.log (the store's too); "
                         "by default only its last lines, on failure")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.command == "run":
            from emulation.run import main_run

            return main_run(args)
        if args.command == "compare":
            from emulation.compare import main_compare

            return main_compare(args)
        if args.command == "allreduce":
            from emulation.allreduce import main_allreduce

            return main_allreduce(args)
        if args.command == "pipeline":
            from emulation.pipeline import main_pipeline

            return main_pipeline(args)
        if args.command == "diloco":
            from emulation.diloco import main_diloco

            return main_diloco(args)
        if args.command == "render":
            from emulation.compare import main_render

            return main_render(args)
        scenario = resolve_scenario(args.scenario)
        # Imported late: a bad scenario or argument must not need pyroute2.
        from emulation.api import Emulation

        if args.command == "up":
            emu = Emulation(scenario, backend=args.backend)
            emu.up()
            if args.json:
                print(json.dumps(emu.describe()))
            else:
                print(f"{scenario.name}: up with {emu.backend}; namespaces "
                      + ", ".join(f"{ns} ({site})" for site, ns in emu.namespaces.items()))
                for p in emu.paths:
                    print(f"  {p.name}: {p.a_addr} ({p.between[0]}) <-> {p.b_addr} ({p.between[1]})")
        elif args.command == "down":
            removed = Emulation(scenario).down()
            print(f"{scenario.name}: removed {len(removed)} item(s)")
        elif args.command == "start":
            Emulation.attach(scenario).start_events()
        else:
            from emulation.validate import format_report, validate

            report = validate(scenario, backend=args.backend, duration_s=args.duration)
            print(json.dumps(report, indent=2) if args.json else format_report(report))
            return 0 if report["ok"] else 1
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # a scenario the emulation cannot hold (e.g. too many paths)
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except EmulationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
