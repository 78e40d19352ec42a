"""``python -m emulation up|down|start|validate SCENARIO``.

Exit status: 0 success, 1 the environment cannot do it (one line saying why),
2 bad usage or a bad scenario (one line naming the field).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from emulation.errors import EmulationError
from wanxport.sim.scenario import Scenario, ScenarioError, load_scenario

BUNDLED = Path(__file__).resolve().parent / "scenarios"


def resolve_scenario(arg: str) -> Scenario:
    """A scenario file path, or the name of a bundled scenario (``emulation/scenarios``)."""
    path = Path(arg)
    if not path.exists() and (BUNDLED / f"{arg}.toml").exists():
        path = BUNDLED / f"{arg}.toml"
    return load_scenario(path)


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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
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
                      f"{emu.namespaces['a']} and {emu.namespaces['b']}")
                for p in emu.paths:
                    print(f"  {p.name}: {p.a_addr} (a) <-> {p.b_addr} (b)")
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
