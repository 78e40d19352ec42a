"""The ``wanxport`` command.

Usage errors (bad arguments, a bad scenario file) print one line and exit 2;
they never show a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from wanxport import __version__
from wanxport.units import format_rate, format_size, parse_size
from wanxport.usage import USAGE_ERROR, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def size_argument(text: str) -> int:
    """argparse type: a positive size such as 64MiB (shared by the emulation CLI)."""
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError("must be more than 0 bytes")
    return value


def site_pair_argument(text: str) -> tuple[str, str]:
    """argparse type: two site names, ``FROM,TO`` (shared by the emulation CLI)."""
    names = [name.strip() for name in text.split(",")]
    if len(names) != 2 or not all(names):
        raise argparse.ArgumentTypeError(f"expected two site names FROM,TO, e.g. east,west; got {text!r}")
    return (names[0], names[1])


def _number(convert: Callable[[str], Any], kind: str, accept: Callable[[Any], bool],
            bounds: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text (else "must be KIND"), then check it is in ``bounds``."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {kind}, got {text!r}") from None
        if not accept(value):
            raise argparse.ArgumentTypeError(f"must be {bounds}")
        return value

    return parse


_seed = _number(int, "a whole number", lambda v: 0 <= v < 1 << 63, "between 0 and 2^63-1")
_steps = _number(int, "a whole number", lambda v: v >= 1, "at least 1")
_think_ms = _number(float, "a number of milliseconds", lambda v: 0.0 <= v < float("inf"),
                    "a finite number >= 0 (milliseconds)")


def add_step_arguments(parser: argparse.ArgumentParser) -> None:
    """``--steps`` and ``--think-ms`` (shared by the emulation CLI)."""
    parser.add_argument("--steps", type=_steps, metavar="N",
                        help="exchange the size N times on one session, as training steps do "
                             "(default: the scenario's [transfer] steps)")
    parser.add_argument("--think-ms", type=_think_ms, metavar="MS",
                        help="compute time between learning a step verified and submitting the next "
                             "(default: the scenario's [transfer] think_ms)")


def apply_step_arguments(scenario: Any, args: argparse.Namespace) -> Any:
    """The scenario with ``--steps``/``--think-ms`` applied; UsageError (one line) if refused."""
    if args.steps is None and args.think_ms is None:
        return scenario
    try:
        return scenario.with_transfer(steps=args.steps, think_ms=args.think_ms)
    except ValueError as exc:
        raise UsageError(f"--steps/--think-ms: {exc}") from None


# -- sim ---------------------------------------------------------------------


def _add_fec(p: Any) -> None:
    from wanxport.core.config import FEC_MODES

    p.add_argument("--fec", choices=FEC_MODES, default="auto",
                   help="erasure-coded tail: auto adds repair where a recovery round trip would "
                        "extend the transfer; off never (default auto)")


def _add_sim(sub: Any) -> None:
    from wanxport.core.cc import available_congestion_controls
    from wanxport.core.scheduler import available_schedulers

    p = sub.add_parser("sim", help="run a scenario's transfer in the simulator (virtual time)",
                       description="Run a scenario's transfer between two simulated gateways in "
                                   "virtual time and print a summary or a run report.")
    p.add_argument("scenario", metavar="SCENARIO.toml", help="scenario file (DESIGN.md section 4)")
    p.add_argument("--size", type=size_argument, help="payload bytes per direction, e.g. 1GiB "
                                              "(default: the scenario's [transfer] size)")
    p.add_argument("--seed", type=_seed, help="randomness of loss and jitter (default: the scenario's)")
    p.add_argument("--between", type=site_pair_argument, metavar="FROM,TO",
                   help="the two sites of an N-site scenario the transfer runs between, e.g. east,west "
                        "(default: the scenario's [transfer] from/to, else its first two sites)")
    add_step_arguments(p)
    p.add_argument("--quantum", type=size_argument, metavar="BYTES",
                   help="simulate packets of this payload size instead of the MTU, so very large "
                        "scenarios finish quickly (implies --payload virtual)")
    p.add_argument("--payload", choices=("auto", "bytes", "virtual"), default="auto",
                   help="bytes: real data sealed with AES-GCM and checked byte for byte; virtual: "
                        "sizes only (auto: bytes up to 256 MiB)")
    p.add_argument("--cc", choices=available_congestion_controls(), default="bbr",
                   help="congestion controller (default bbr)")
    p.add_argument("--scheduler", choices=available_schedulers(), default="earliest-arrival")
    _add_fec(p)
    p.add_argument("--deadline", type=float, metavar="S",
                   help="give up after S virtual seconds (default max(60, 20 x ideal))")
    p.add_argument("--json", action="store_true", help="print exactly one run report (JSON)")
    p.set_defaults(func=_run_sim)


def _run_sim(args: argparse.Namespace) -> int:
    from wanxport.core.cc import cc_config
    from wanxport.report import dumps, with_wall_time
    from wanxport.scenario import ScenarioError, load_scenario
    from wanxport.sim.runner import SimOptions, simulate

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as exc:
        raise UsageError(str(exc)) from None
    scenario = apply_step_arguments(scenario, args)
    try:
        scenario.pair(*(args.between or scenario.transfer_pair))
    except ScenarioError as exc:
        raise UsageError(f"--between: {exc}") from None
    if args.quantum is not None and args.payload == "bytes":
        raise UsageError("--quantum simulates aggregate packets and needs --payload virtual or auto")
    if args.deadline is not None and not args.deadline > 0:
        raise UsageError("--deadline must be more than 0 seconds")
    try:
        cc_config(args.cc)  # a controller that needs options (fixed: rate_bps) cannot run from --cc
    except ValueError as exc:
        raise UsageError(f"--cc {args.cc}: {exc}") from None
    options = SimOptions(size_bytes=args.size, seed=args.seed, quantum=args.quantum,
                         payload_mode="virtual" if args.quantum else args.payload,
                         congestion_control=args.cc, scheduler=args.scheduler, fec=args.fec,
                         deadline_s=args.deadline, between=args.between)
    report = with_wall_time(lambda: simulate(scenario, options))
    if args.json:
        print(dumps(report))
    else:
        print(_summary(report))
    return 0 if report["intact"] else 1


def _summary(report: dict[str, Any]) -> str:
    lines = [
        f"scenario {report['scenario']} ({report['mode']}, {report['transport']}, cc {report.get('cc')}, "
        f"payload {report.get('payload_mode')}, seed {report.get('seed')})",
        f"moved    {format_size(report['payload_bytes'])} in {report['completion_s']:.3f} s "
        f"(ideal{' step' if report.get('steps', 1) > 1 else ''} {report['ideal_s']:.3f} s, "
        f"efficiency {report['efficiency']:.3f})"
        if report["ideal_s"] and report["efficiency"] else
        f"moved    {format_size(report['payload_bytes'])} in {report['completion_s']:.3f} s",
        f"goodput  {format_rate(report['goodput_bps'])}   intact {'yes' if report['intact'] else 'NO'}   "
        f"wall {report['wall_s']:.2f} s",
        *_step_lines(report),
        "",
        f"{'path':<20} {'payload':>12} {'retransmit':>12} {'srtt':>9}  state",
    ]
    for path in report["paths"]:
        srtt = f"{path['srtt_s'] * 1000:.1f} ms" if path["srtt_s"] is not None else "-"
        lines.append(f"{path['name']:<20} {format_size(path['payload_bytes']):>12} "
                     f"{format_size(path['retransmitted_bytes']):>12} {srtt:>9}  {path['state']}")
    return "\n".join(lines)


def _step_lines(report: dict[str, Any]) -> list[str]:
    """One line on steps, if the run had several (the whole-run figures above include think time)."""
    if report.get("steps", 1) <= 1:
        return []

    def s(value: float | None) -> str:
        return f"{value:.3f} s" if value is not None else "-"

    spread = report.get("shard_completion_s") or {}
    return [f"steps    {report['steps']}: first {s(report['first_step_s'])}, mean "
            f"{s(report['mean_step_s'])}, p90 {s(report['p90_step_s'])}, worst {s(report['worst_step_s'])}"
            + (f"; shards p50 {s(spread['p50'])} p99 {s(spread['p99'])}" if spread else "")]


# -- bench -------------------------------------------------------------------


def _add_bench(sub: Any) -> None:
    from wanxport.bench.cli import add_bench_arguments, bench_main

    p = sub.add_parser("bench", help="loopback goodput and pacing benchmarks (native data path)",
                       description="Loopback benchmarks: a multipath transfer between two processes, "
                                   "or the pacer's precision.")
    add_bench_arguments(p)
    p.set_defaults(func=bench_main)


# -- entry point -------------------------------------------------------------

SUBCOMMANDS: list[Callable[[Any], None]] = [_add_sim, _add_bench]
# Other layers contribute subcommands through a module-level ``register(subparsers)``
# that adds a parser with ``set_defaults(func=...)``; func returns the exit status
# and raises ``UsageError`` for mistakes the user can fix.
SUBCOMMAND_MODULES = ("wanxport.gateway.cli", "wanxport.daemon.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wanxport", description="Multipath WAN transport for training shards.")
    parser.add_argument("--version", action="version", version=f"wanxport {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for add in SUBCOMMANDS:
        add(sub)
    for name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result: int = args.func(args)
        return result
    except UsageError as exc:
        print(f"wanxport {args.command}: {exc}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print("wanxport: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: not an error worth a traceback
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
