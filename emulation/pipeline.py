"""``python -m emulation pipeline``: a two-stage pipeline between the two sites of a scenario.

Brings the scenario up, starts stage 0 of ``examples/pipeline_two_sites.py`` in site a's
gateway namespace and stage 1 in site b's (``emulation.baselines.pipeline_app``), lets
them join (a wanxport group over every path, or a gloo world of the two ranks on the
best route), says "go" and collects each stage's step times. Every step runs the
example's schedule: M microbatches, each activation (S bytes: rows of ``HIDDEN``
float32) crossing a -> b and its gradient crossing b -> a as point-to-point messages.

One run report v1 (``workload: "pipeline"``): ``step_s`` is, per step, the later stage's
end minus the earlier one's start (each step starts after a barrier, untimed), with the
step figures of ``wanxport.report.step_summary`` (``mean_step_s`` over steps 2..N,
``first_step_s``, ``p90_step_s``, ``worst_step_s``); ``ideal_s`` is one step's bound
(``wanxport.scenario.ideal.pipeline_step_ideal_s``: all activations a -> b, then the
last gradient back; compute counted as free). ``correct``: every step finished, its loss
is finite, and what each site sent is, digest for digest, what the other received.

``--latency-sweep`` adds, after the steps and on the same group, ``messages`` messages of
each size from 64 KiB to 16 MiB from a to b, one after another; ``latency`` holds per
size the median, p90, min and max of b's ``recv`` returning minus a's send call (one
kernel's CLOCK_MONOTONIC), with wanxport the payload bytes a's session put on each path
while that size ran (``payload_bytes_per_path``), and the bound: the scenario's a->b ideal for that size
(``ideal_time_s``: one-way delay + size / capacity of the path set, each path counted
from its own delay).

gloo, as ``python -m emulation allreduce`` runs it (``emulation.ranks.prepare_network``):
bound to the best route, socket buffer maxima raised to twice its bandwidth-delay
product, ``net.ipv4.tcp_slow_start_after_idle=0`` (recorded in ``settings``).
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

from emulation.api import Emulation
from emulation.bundled import resolve_scenario
from emulation.ranks import host_congestion_control, make_rank_pki, path_reports, prepare_network, run_ranks
from wanxport.report import build_report, step_summary
from wanxport.scenario import Scenario, ideal_time_s
from wanxport.scenario.ideal import pipeline_step_ideal_s

COMMS = ("wanxport", "gloo")
HIDDEN = 256  # activation width: S bytes are S / (4 x HIDDEN) rows
ROW_BYTES = 4 * HIDDEN
LATENCY_SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20)
MAX_ACTIVATION = 256 << 20
PORT = 7800  # site b's wanxport port on every path
GLOO_PORT = 29510


@dataclass(frozen=True)
class PipelineOptions:
    comm: str
    microbatches: int = 4
    activation_bytes: int = 4 << 20
    steps: int = 10
    latency_sweep: bool = False
    messages: int = 20
    backend: str | None = None
    timeout_s: float = 120.0
    latency_sizes: tuple[int, ...] = field(default=LATENCY_SIZES)


def check_options(options: PipelineOptions) -> None:
    """ValueError (one line) for a combination that cannot run."""
    if options.comm not in COMMS:
        raise ValueError(f"--comm: unknown {options.comm!r}; valid: {', '.join(COMMS)}")
    if not 1 <= options.microbatches <= 64:
        raise ValueError(f"--microbatches: {options.microbatches} is not valid; use 1..64")
    if options.activation_bytes <= 0 or options.activation_bytes % ROW_BYTES \
            or options.activation_bytes > MAX_ACTIVATION:
        raise ValueError(f"--activation-size: {options.activation_bytes} B is not valid; use a multiple "
                         f"of {ROW_BYTES} B (rows of {HIDDEN} float32) up to 256 MiB")
    if options.steps < 1:
        raise ValueError(f"--steps: {options.steps} is not valid; use >= 1")
    if options.messages < 2:
        raise ValueError(f"--messages: {options.messages} is not valid; use >= 2")
    if not math.isfinite(options.timeout_s) or options.timeout_s <= 0:
        raise ValueError(f"--timeout: {options.timeout_s} is not valid; use a positive number of seconds")
    if importlib.util.find_spec("torch") is None:
        raise ValueError("the pipeline's stages need torch; install it: pip install torch==2.13.0")


def run_pipeline(scenario: Scenario, options: PipelineOptions) -> dict[str, Any]:
    """Run the benchmark over ``scenario``; return the run report v1."""
    check_options(options)
    wall_start = time.perf_counter()
    emu = Emulation(scenario, backend=options.backend)
    emu.up()
    try:
        return _run(emu, scenario, options, wall_start)
    finally:
        emu.down()


def _run(emu: Emulation, scenario: Scenario, options: PipelineOptions, wall_start: float) -> dict[str, Any]:
    gloo = options.comm == "gloo"
    best, settings = prepare_network(emu, scenario, gloo)
    cc = host_congestion_control(emu)
    ideal = pipeline_step_ideal_s(scenario, options.activation_bytes, options.microbatches)
    sizes = list(options.latency_sizes) if options.latency_sweep else []
    sweep_ideal = sum(ideal_time_s(scenario, s, "a->b") for s in sizes) * options.messages
    deadline_s = 60.0 + options.steps * max(30.0, 20.0 * ideal) + max(30.0, 20.0 * sweep_ideal)
    common = {"microbatches": options.microbatches, "rows": options.activation_bytes // ROW_BYTES,
              "hidden": HIDDEN, "steps": options.steps, "timeout": options.timeout_s,
              "latency_sizes": sizes, "messages": options.messages}
    with tempfile.TemporaryDirectory(prefix="wx-pipeline-") as pki:
        specs = []
        for site, side in enumerate("ab"):
            spec = {**common, "site": site}
            if gloo:
                route = emu.paths[best]
                spec.update(master=route.a_addr, master_port=GLOO_PORT, ifname=route.ifname)
            else:
                spec.update(pki=pki, names=["a", "b"], paths=[f"{p.b_addr}:{PORT}" for p in emu.paths])
            specs.append((side, spec))
        if not gloo:
            make_rank_pki(pki, ["a", "b"])
        done, meter = run_ranks(emu, "emulation.baselines.pipeline_app", options.comm, specs, deadline_s,
                                settings)
    return _report(scenario, options, emu, done, meter.wire, ideal, cc, settings, wall_start)


def latency_rows(scenario: Scenario, sweep_a: dict[str, Any], sweep_b: dict[str, Any],
                 names: list[str] | None = None) -> list[dict[str, Any]]:
    """Per size: a message's latency (b's return minus a's call) summarised, against the bound;
    with wanxport also the payload bytes a's session put on each path (``names``) meanwhile."""
    rows = []
    for size, sent in sweep_a["stamps"].items():
        latencies = sorted(r - s for s, r in zip(sent, sweep_b["stamps"][size], strict=True))
        bound = ideal_time_s(scenario, int(size), "a->b")
        median = statistics.median(latencies)
        p90 = latencies[min(len(latencies) - 1, round(0.9 * (len(latencies) - 1)))]
        rows.append({"size_bytes": int(size), "messages": len(latencies), "median_s": round(median, 6),
                     "p90_s": round(p90, 6), "min_s": round(latencies[0], 6),
                     "max_s": round(latencies[-1], 6),
                     "bound_s": round(bound, 6), "median_over_bound": round(median / bound, 3)})
        carried = sweep_a.get("payload_bytes_per_path", {}).get(size)
        if carried is not None and names is not None:  # wanxport: which paths carried this size
            rows[-1]["payload_bytes_per_path"] = dict(zip(names, carried, strict=True))
    return rows


def _report(scenario: Scenario, options: PipelineOptions, emu: Emulation, done: list[dict[str, Any]],
            wire: dict[str, list[int]], ideal: float, cc: str, settings: dict[str, Any],
            wall_start: float) -> dict[str, Any]:
    a, b = done
    errors = [d["error"] for d in done if d.get("error")]
    n_steps = min(len(d["steps"]) for d in done)
    step_s = [max(d["steps"][k][1] for d in done) - min(d["steps"][k][0] for d in done)
              for k in range(n_steps)]
    matched = all(a["digests"][k]["sent"] == b["digests"][k]["received"]
                  and b["digests"][k]["sent"] == a["digests"][k]["received"]
                  for k in range(min(len(a["digests"]), len(b["digests"]))))
    finite = all(math.isfinite(loss) for loss in b["losses"])
    latency = None
    if options.latency_sweep and a.get("sweep") and b.get("sweep"):
        latency = latency_rows(scenario, a["sweep"], b["sweep"], [p.name for p in emu.paths])
    swept = not options.latency_sweep or (latency is not None and bool(b["sweep"]["intact"]))
    correct = (not errors and n_steps == options.steps and len(a["digests"]) == n_steps and matched
               and finite and swept)
    paths = path_reports(emu, options.comm == "wanxport", done, ["a", "b"], wire)
    moved = 2 * options.microbatches * options.activation_bytes * n_steps
    report = build_report(
        scenario=scenario.name, mode="emulated",
        transport="wanxport" if options.comm == "wanxport" else "tcp",
        payload_bytes=moved, completion_s=sum(step_s), ideal_s=ideal, intact=correct,
        wall_s=time.perf_counter() - wall_start, paths=paths, delivered_bytes=moved if correct else 0,
        workload="pipeline", comm=options.comm, sites=2, ranks_per_site=1, compress=None,
        microbatches=options.microbatches, activation_bytes=options.activation_bytes, hidden=HIDDEN,
        steps=options.steps, step_s=step_s,
        ideal_kind="pipeline-step", correct=correct, messages_matched=matched,
        losses=[round(x, 6) for x in b["losses"]], latency=latency,
        rank_cpu_s=[d.get("cpu_s") for d in done], rank_step_cpu_s=[d.get("step_cpu_s") for d in done],
        rank_diag=[d.get("diag") for d in done], cross_site_wire_bytes=sum(wire["a"]) + sum(wire["b"]),
        cc=cc if options.comm == "gloo" else "bbr", backend=emu.backend, settings=settings, errors=errors)
    if options.steps == 1:  # build_report summarises steps only from two on
        report.update(steps=1, **step_summary(step_s))
    return report


def summary(report: dict[str, Any]) -> str:
    """A few lines for people."""
    from wanxport.units import format_size

    def s(value: float | None) -> str:
        return f"{value:.3f} s" if value is not None else "-"

    lines = [f"{report['scenario']}: pipeline, {report['microbatches']} microbatches of "
             f"{format_size(report['activation_bytes'])} each way x {report['steps']} steps, "
             f"{report['comm']}",
             f"first {s(report['first_step_s'])}, mean {s(report['mean_step_s'])}, p90 "
             f"{s(report['p90_step_s'])}, worst {s(report['worst_step_s'])}, bound "
             f"{report['ideal_s']:.3f} s -> efficiency {report['efficiency']}   "
             f"correct {'yes' if report['correct'] else 'NO'}"]
    for row in report["latency"] or []:
        lines.append(f"  {format_size(row['size_bytes']):>9}: median {row['median_s'] * 1e3:8.1f} ms, "
                     f"p90 {row['p90_s'] * 1e3:8.1f} ms, bound {row['bound_s'] * 1e3:8.1f} ms")
    lines.extend(f"  error: {e}" for e in report["errors"])
    return "\n".join(lines)


def main_pipeline(args: Any) -> int:
    """``python -m emulation pipeline``: 0 correct, 1 not (or the environment cannot run it)."""
    from emulation.run import exit_on_sigterm
    from wanxport.report import dumps

    options = PipelineOptions(comm=args.comm, microbatches=args.microbatches,
                              activation_bytes=args.activation_size, steps=args.steps,
                              latency_sweep=args.latency_sweep, messages=args.messages, backend=args.backend,
                              timeout_s=args.timeout)
    scenario = resolve_scenario(args.scenario)
    check_options(options)
    exit_on_sigterm()
    report = run_pipeline(scenario, options)
    print(dumps(report) if args.json else summary(report))
    return 0 if report["correct"] else 1
