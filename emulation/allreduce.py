"""``python -m emulation allreduce``: an all-reduce between the two sites of a scenario, N steps
(among more sites: ``emulation.mesh_allreduce``).

Brings the scenario up, starts R rank processes in each gateway namespace
(``emulation.baselines.allreduce_app``), lets them join (wanxport groups, or the
flat gloo world), says "go" to all of them at once and collects each rank's step
times and verdicts. One run report v1 (``workload: "allreduce"``): ``step_s`` is,
per step, the last rank's end minus the first rank's start (every step starts after
a barrier, and ranks check their results after another, both untimed),
the step figures of ``wanxport.report.step_summary`` (``mean_step_s`` over steps
2..N, with ``first_step_s``, ``p90_step_s``, ``worst_step_s`` and the median
``steady_step_s``), ``ideal_s`` the scenario's ``direction = "both"`` ideal for SIZE
(the bytes an all-reduce between two sites must move each way, whatever R and the
compression), ``efficiency`` = ideal / mean step (with one step: ideal / its time).
``correct``: every rank's every result within its check (allreduce_app) and all ranks'
results identical at every step.

Bytes per path: wanxport's own per-path payload counters (``payload_bytes_a_to_b`` /
``_b_to_a``, retransmissions included), and for both comms the gateway interfaces'
transmitted bytes (``wire_bytes_*``: IP packets, headers and acknowledgements included),
which is the only per-path figure gloo has.

gloo, as a careful operator would run it: ranks contiguous per site, bound to the best
route (``GLOO_SOCKET_IFNAME``), the namespaces' ``tcp_rmem``/``tcp_wmem`` maxima raised to
twice that route's bandwidth-delay product (TCP autotuning then sizes the socket buffers;
gloo has no option for them), the host's congestion control named in ``cc`` (gloo cannot
choose one per socket, and this kernel refuses one per namespace).
gloo-striped, as a careful operator without a multipath transport would stripe: the same
world once per route, each group's gloo device bound to that route's interface, the array
split over the routes by capacity (``baselines.stripes``; ``settings.stripes``), every
stripe in flight at once; the ``tcp_rmem``/``tcp_wmem`` maxima cover the largest route's
bandwidth-delay product. Both gloo comms run with ``net.ipv4.tcp_slow_start_after_idle=0``
in the namespaces (recorded in ``settings``): between steps gloo's connections idle while
the ranks check their results and meet at a barrier, and a connection that restarted from
its initial window after every idle spell would charge each step a slow start no careful
operator would leave on.
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
import time
from dataclasses import dataclass
from typing import Any

from emulation.api import Emulation
from emulation.baselines.stripes import capacity_split, route_capacity_bps
from emulation.bundled import resolve_scenario
from emulation.ranks import host_congestion_control, make_rank_pki, path_reports, prepare_network, run_ranks
from wanxport.aio import threadcpu
from wanxport.presets import COLLECTIVE
from wanxport.report import build_report, step_summary
from wanxport.scenario import Scenario, ideal_time_s

log = logging.getLogger(__name__)

COMMS = ("wanxport", "gloo", "gloo-striped")
GLOO_COMMS = ("gloo", "gloo-striped")
COMPRESS = ("none", "bf16", "int8")
PORT_BASE = 7700  # rank r of site b listens on PORT_BASE + r on every path
GLOO_PORT = 29500
INTRA_PORT = 29600  # each site's own TCPStore (its namespace's loopback)
SEED = 1234


@dataclass(frozen=True)
class AllreduceOptions:
    comm: str
    ranks_per_site: int = 1
    size_bytes: int = 64 << 20
    steps: int = 20
    compress: str = "none"
    backend: str | None = None
    timeout_s: float = 120.0
    chunk_bytes: int | None = None  # R > 1: the hook's pipeline chunk (None: its default)


def check_options(options: AllreduceOptions) -> None:
    """ValueError (one line) for a combination that cannot run."""
    if options.comm not in COMMS:
        raise ValueError(f"--comm: unknown {options.comm!r}; valid: {', '.join(COMMS)}")
    if options.compress not in COMPRESS:
        raise ValueError(f"--compress: unknown {options.compress!r}; valid: {', '.join(COMPRESS)}")
    if options.comm in GLOO_COMMS and options.compress != "none":
        raise ValueError(f"--compress: gloo has no compression; "
                         f"use --compress none with --comm {options.comm}")
    if not 1 <= options.ranks_per_site <= 8:
        raise ValueError(f"--ranks-per-site: {options.ranks_per_site} is not valid; use 1..8")
    if options.steps < 1:
        raise ValueError(f"--steps: {options.steps} is not valid; use >= 1")
    if options.chunk_bytes is not None and (options.chunk_bytes <= 0 or options.comm != "wanxport"):
        raise ValueError(f"--chunk: {options.chunk_bytes} B is not valid; use a positive size "
                         "with --comm wanxport")
    if options.size_bytes <= 0 or options.size_bytes % (4 * options.ranks_per_site):
        raise ValueError(f"--size: {options.size_bytes} B must be a positive multiple of "
                         f"4 x ranks-per-site (float32 elements, split evenly over the ranks)")
    needs_torch = options.comm in GLOO_COMMS or options.ranks_per_site > 1
    if needs_torch and importlib.util.find_spec("torch") is None:
        raise ValueError("this run needs torch (gloo); install it: pip install torch==2.13.0")


def run_allreduce(scenario: Scenario, options: AllreduceOptions) -> dict[str, Any]:
    """Run the benchmark over ``scenario``; return the run report v1."""
    check_options(options)
    if len(scenario.sites) != 2:
        raise ValueError(f"{scenario.name}: {len(scenario.sites)} sites; this all-reduce runs between two")
    wall_start = time.perf_counter()
    emu = Emulation(scenario, backend=options.backend)
    emu.up()
    try:
        report = _run(emu, scenario, options, wall_start)
        report["lag_max_s"] = emu.lag_max_s()  # the engine's worst read delay over the run (None: netem)
        return report
    finally:
        emu.down()


def _specs(emu: Emulation, options: AllreduceOptions, best: int, pki: str,
           stripes: list[tuple[int, int]] | None = None) -> list[tuple[str, dict[str, Any]]]:
    ranks = options.ranks_per_site
    common = {"ranks_per_site": ranks, "count": options.size_bytes // 4, "steps": options.steps,
              "compress": None if options.compress == "none" else options.compress, "seed": SEED,
              "timeout": options.timeout_s, "intra_port": INTRA_PORT, "chunk_bytes": options.chunk_bytes}
    out = []
    for site, side in enumerate(("a", "b")):
        for r in range(ranks):
            spec = {**common, "site": site, "rank": r}
            if options.comm == "wanxport":
                spec.update(pki=pki, names=[f"a-r{r}", f"b-r{r}"],
                            paths=[f"{p.b_addr}:{PORT_BASE + r}" for p in emu.paths])
            else:
                spec.update(master=emu.paths[best].a_addr, master_port=GLOO_PORT,
                            ifname=emu.paths[best].ifname, bitwise=True)
                if stripes is not None:
                    spec.update(best=best, stripes=stripes,
                                routes=[{"name": p.name, "ifname": p.ifname} for p in emu.paths])
            out.append((side, spec))
    return out


def _run(emu: Emulation, scenario: Scenario, options: AllreduceOptions, wall_start: float) -> dict[str, Any]:
    striped = options.comm == "gloo-striped"
    routes = list(range(len(emu.paths))) if striped else None
    best, settings = prepare_network(emu, scenario, options.comm in GLOO_COMMS, routes)
    stripes = None
    if striped:
        capacities = [route_capacity_bps(scenario, k) for k in range(len(emu.paths))]
        stripes = capacity_split(options.size_bytes // 4, capacities)  # every rank's whole array
        settings["stripes"] = [{"route": emu.paths[k].name, "capacity_bps": round(c),
                                "offset": off, "elements": n}
                               for k, (c, (off, n)) in enumerate(zip(capacities, stripes, strict=True))]
    cc = host_congestion_control(emu)
    ideal = ideal_time_s(scenario, options.size_bytes, "both")
    deadline_s = 60.0 + options.steps * max(30.0, 20.0 * ideal)
    with tempfile.TemporaryDirectory(prefix="wx-allreduce-") as pki:
        if options.comm == "wanxport":
            make_rank_pki(pki, [f"{s}-r{r}" for s in "ab" for r in range(options.ranks_per_site)])
        done, meter = run_ranks(emu, "emulation.baselines.allreduce_app", options.comm,
                                _specs(emu, options, best, pki, stripes), deadline_s, settings)
    report = _report(scenario, options, emu, done, meter.wire, ideal, cc, settings, wall_start)
    if meter.engine_s is not None:
        report["cpu_other"] = {"engine": meter.engine_s}  # "go" to the last rank's "done"
    return report


def _report(scenario: Scenario, options: AllreduceOptions, emu: Emulation, done: list[dict[str, Any]],
            wire: dict[str, list[int]], ideal: float, cc: str, settings: dict[str, Any],
            wall_start: float) -> dict[str, Any]:
    ranks = options.ranks_per_site
    errors = [d["error"] for d in done if d.get("error")]
    n_steps = min(len(d["steps"]) for d in done)
    step_s = [max(d["steps"][k][1] for d in done) - min(d["steps"][k][0] for d in done)
              for k in range(n_steps)]
    identical = all(len({d["digests"][k] for d in done}) == 1 for k in range(n_steps))
    correct = not errors and n_steps == options.steps and identical and all(d["correct"] for d in done)
    sides = ["a" if k < ranks else "b" for k in range(len(done))]
    paths = path_reports(emu, options.comm == "wanxport", done, sides, wire)
    collective = [d["collective_bytes_sent"] for d in done if d.get("collective_bytes_sent") is not None]
    moved = 2 * options.size_bytes * n_steps
    report = build_report(
        scenario=scenario.name, mode="emulated",
        transport="wanxport" if options.comm == "wanxport" else "tcp",
        payload_bytes=moved, completion_s=sum(step_s) if step_s else 0.0, ideal_s=ideal, intact=correct,
        wall_s=time.perf_counter() - wall_start, paths=paths, delivered_bytes=moved if correct else 0,
        workload="allreduce", comm=options.comm, ranks_per_site=ranks,
        compress=None if options.compress == "none" else options.compress, size_bytes=options.size_bytes,
        steps=options.steps, step_s=step_s,
        correct=correct, identical_across_ranks=identical,
        preset=COLLECTIVE.name if options.comm == "wanxport" else None,  # wanxport.collective's default
        worst_error_ratio=max(d["worst_error_ratio"] for d in done),
        cross_site_wire_bytes=sum(wire["a"]) + sum(wire["b"]),
        rank_cpu_s=[d.get("cpu_s") for d in done], rank_step_cpu_s=[d.get("step_cpu_s") for d in done],
        chunk_bytes=done[0].get("chunk_bytes") if done else None,
        rank_diag=[d.get("diag") for d in done],
        collective_bytes_sent=sum(collective) if collective else None,
        cc=cc if options.comm in GLOO_COMMS else "bbr", backend=emu.backend, settings=settings, errors=errors)
    report["ranks"] = rank_cpu(done, ranks)
    if options.steps == 1:  # build_report summarises steps only from two on
        report.update(steps=1, **step_summary(step_s))
    return report


def rank_cpu(done: list[dict[str, Any]], ranks_per_site: int) -> list[dict[str, Any]]:
    """Each rank's CPU-s per thread role over its timed steps and per GB it moved across
    sites (collective bytes sent plus received; None where the comm counts none: gloo), and
    what its control channels carried per timed step (``control.counters``; None for gloo).
    ``done`` is in ``_specs`` order: site by site, rank by rank."""
    out = []
    for k, d in enumerate(done):
        moved = (d.get("collective_bytes_sent") or 0) + (d.get("collective_bytes_received") or 0)
        cpu = d.get("cpu")
        out.append({"site": k // ranks_per_site, "rank": k % ranks_per_site, "cpu": cpu,
                    "cpu_s_per_gb": threadcpu.cpu_s_per_gb(cpu, moved) if cpu else None,
                    "control_per_step": d.get("control_per_step")})
    return out


def summary(report: dict[str, Any]) -> str:
    """A few lines for people."""
    from wanxport.units import format_size

    lines = [f"{report['scenario']}: allreduce {format_size(report['size_bytes'])} "
             f"x {report['steps']} steps, "
             f"{report['comm']} R={report['ranks_per_site']} compress={report['compress']}",
             f"first {_s(report['first_step_s'])}, mean {_s(report['mean_step_s'])}, p90 "
             f"{_s(report['p90_step_s'])}, worst {_s(report['worst_step_s'])}, ideal "
             f"{report['ideal_s']:.3f} s -> efficiency {report['efficiency']}   "
             f"correct {'yes' if report['correct'] else 'NO'}"]
    for p in report["paths"]:
        lines.append(f"  {p['name']:<8} wire a->b {format_size(p['wire_bytes_a_to_b']):>10}  "
                     f"b->a {format_size(p['wire_bytes_b_to_a']):>10}  {p['state']}")
    lines.extend(f"  error: {e}" for e in report["errors"])
    return "\n".join(lines)


def _s(value: float | None) -> str:
    return f"{value:.3f} s" if value is not None else "-"


def main_allreduce(args: Any) -> int:
    """``python -m emulation allreduce``: 0 correct, 1 not (or the environment cannot run it)."""
    from emulation.run import exit_on_sigterm
    from wanxport.report import dumps

    exit_on_sigterm()
    comms = args.comm.split(",")
    options = AllreduceOptions(comm=comms[0], ranks_per_site=args.ranks_per_site,
                               size_bytes=args.size if args.size is not None else 64 << 20,
                               steps=args.steps, compress=args.compress, backend=args.backend,
                               timeout_s=args.timeout, chunk_bytes=args.chunk)
    scenario = resolve_scenario(args.scenario)
    if len(scenario.sites) > 2:
        from emulation.mesh_allreduce import main_mesh

        return main_mesh(args, scenario, options, comms)
    if len(comms) > 1 or args.schedule != "auto" or args.rounds != 1 or args.out:
        raise ValueError("--comm takes one comm, and --schedule, --rounds and --out need more than "
                         "two sites")
    check_options(options)
    report = run_allreduce(scenario, options)
    print(dumps(report) if args.json else summary(report))
    return 0 if report["correct"] else 1
