"""``wanxport sim``: a scenario's transfer in the simulator, as a summary or a run report."""

from __future__ import annotations

import argparse
from typing import Any

from wanxport.units import format_rate, format_size
from wanxport.usage import UsageError

from .arguments import (
    add_step_arguments,
    apply_step_arguments,
    seed_argument,
    site_pair_argument,
    size_argument,
)


def _add_fec(p: Any) -> None:
    from wanxport.core.config import FEC_MODES

    p.add_argument("--fec", choices=FEC_MODES, default="auto",
                   help="erasure-coded tail: auto adds repair where a recovery round trip would "
                        "extend the transfer; off never (default auto)")


def register(sub: Any) -> None:
    """``wanxport sim``."""
    from wanxport.core.cc import available_congestion_controls
    from wanxport.core.scheduler import available_schedulers

    p = sub.add_parser("sim", help="run a scenario's transfer in the simulator (virtual time)",
                       description="Run a scenario's transfer between two simulated gateways in "
                                   "virtual time and print a summary or a run report.")
    p.add_argument("scenario", metavar="SCENARIO.toml", help="scenario file (docs/design.md section 4)")
    p.add_argument("--size", type=size_argument, help="payload bytes per direction, e.g. 1GiB "
                                              "(default: the scenario's [transfer] size)")
    p.add_argument("--seed", type=seed_argument,
                   help="randomness of loss and jitter (default: the scenario's)")
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
