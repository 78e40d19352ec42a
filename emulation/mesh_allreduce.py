"""``python -m emulation allreduce`` among the N > 2 sites of a v2 scenario.

The emulation comes up once; each run (a comm, for wanxport a schedule) starts R rank
processes in every site's namespace (``emulation.baselines.allreduce_app``), lets them
join, says "go" to all at once and collects each rank's step times and verdicts, as
the two-site runner does; with several comms or schedules the runs alternate, round
after round, on the same links, so a shared host's drift touches every one alike.
Each run is one run report v1 (``workload: "allreduce"``) with ``ideal_kind:
"bus-bandwidth"``: ``ideal_s`` is section 4's all-reduce bound among all the sites
(``allreduce_ideal_time_s``), ``efficiency`` that over the mean step (steps 2..N).

wanxport: rank r of every site forms one group; each pair of sites with direct paths
has one session over all of them (the higher-index site listens), a pair without has
none, and the group's schedule ("auto" unless forced) is recorded per step
(``schedules``: chosen schedule, predicted seconds, relayed shares).

gloo, the flat world as torch users run it: N x R ranks contiguous per site, each
site's ranks bound (``GLOO_SOCKET_IFNAME``) to the interface of its fattest path, and
the kernel routing every pair: a site reaches another's gloo address over their
fattest direct path, or, for a pair without one, through the third site with the
fattest two-hop route (IP forwarding on). Socket buffers as in the two-site benchmark:
``tcp_rmem``/``tcp_wmem`` maxima at twice the largest path's bandwidth-delay product,
``tcp_slow_start_after_idle=0``; both comms run on the same settings.
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any

from emulation.allreduce import (
    GLOO_PORT,
    INTRA_PORT,
    PORT_BASE,
    SEED,
    AllreduceOptions,
    rank_cpu,
)
from emulation.api import Emulation, PathInfo
from emulation.baselines import netconfig
from emulation.baselines.programs import Program
from emulation.errors import EmulationError
from emulation.ranks import SETUP_TIMEOUT_S, engine_drops, make_rank_pki
from wanxport.presets import COLLECTIVE
from wanxport.report import PathReport, build_report, step_summary
from wanxport.scenario import Scenario, allreduce_ideal_time_s

MESH_COMMS = ("wanxport", "gloo")
SCHEDULE_CHOICES = ("auto", "direct", "relay", "ring", "tree")
PORTS_PER_RUN = 16  # each run's ports move on: a run never waits for the last one's to free


def check_mesh(scenario: Scenario, comms: list[str], schedules: list[str], rounds: int) -> None:
    """ValueError (one line) for what an N-site run cannot do."""
    for comm in comms:
        if comm not in MESH_COMMS:
            raise ValueError(f"--comm: {comm!r} among {len(scenario.sites)} sites; "
                             f"valid: {', '.join(MESH_COMMS)}")
    for schedule in schedules:
        if schedule not in SCHEDULE_CHOICES:
            raise ValueError(f"--schedule: unknown {schedule!r}; valid: {', '.join(SCHEDULE_CHOICES)}")
    if rounds < 1:
        raise ValueError(f"--rounds: {rounds} is not valid; use >= 1")


def fattest(paths: list[PathInfo], scenario: Scenario, one: str, other: str) -> int | None:
    """The index of the fattest direct path between two sites (file order on ties)."""
    joined = [k for k, p in enumerate(paths) if set(p.between) == {one, other}]
    return max(joined, key=lambda k: (_rate(scenario, k), -k), default=None)


def _rate(scenario: Scenario, k: int) -> float:
    forward = scenario.paths[k].forward
    return forward.bandwidth_mbps * (1 - forward.loss)


def address_at(path: PathInfo, site: str) -> str:
    return path.a_addr if path.between[0] == site else path.b_addr


def gloo_endpoints(emu: Emulation, scenario: Scenario) -> dict[str, tuple[str, str]]:
    """Each site's (interface, address) for gloo: its fattest path's end."""
    paths, out = emu.paths, {}
    for site in scenario.sites:
        touching = [k for k, p in enumerate(paths) if site in p.between]
        best = max(touching, key=lambda k: (_rate(scenario, k), -k))
        out[site] = (paths[best].ifname, address_at(paths[best], site))
    return out


def mesh_routes(emu: Emulation, scenario: Scenario, endpoints: dict[str, tuple[str, str]]) -> list[str]:
    """Routes so that every site reaches every other's gloo address: over the fattest direct
    path, else through the site with the fattest two-hop route. Returns them, for the report."""
    paths, sites, done = emu.paths, scenario.sites, []
    for site in sites:
        emu.run(site, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        for key in ("all", "default"):
            emu.run(site, ["sysctl", "-q", "-w", f"net.ipv4.conf.{key}.rp_filter=0"])
    for site in sites:
        for other in sites:
            if other == site:
                continue
            target = endpoints[other][1]
            direct = fattest(paths, scenario, site, other)
            if direct is not None:
                hop = address_at(paths[direct], other)
            else:
                hops = [(m, fattest(paths, scenario, site, m), fattest(paths, scenario, m, other))
                        for m in sites if m not in (site, other)]
                relays = [(min(_rate(scenario, a), _rate(scenario, b)), m, a)
                          for m, a, b in hops if a is not None and b is not None]
                if not relays:
                    raise EmulationError(f"no route from site {site} to site {other} within two hops")
                _, via, first = max(relays)
                hop = address_at(paths[first], via)
            if hop == target:
                continue  # on the link itself
            # From this site's own gloo address: the far end routes replies to that one only.
            emu.run(site, ["ip", "route", "replace", f"{target}/32", "via", hop, "src", endpoints[site][1]])
            done.append(f"{site}: {target} via {hop}")
    return done


def tune(emu: Emulation, scenario: Scenario) -> dict[str, Any]:
    """Socket buffer maxima and slow start after idle, in every site (the two-site runner's)."""
    buffer = max(netconfig.buffer_bytes(scenario, [k]) for k in range(len(scenario.paths)))
    for site in scenario.sites:
        for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            low, default, _ = emu.run(site, ["sysctl", "-n", key]).stdout.split()
            emu.run(site, ["sysctl", "-q", "-w", f"{key}={low} {default} {buffer}"])
        emu.run(site, ["sysctl", "-q", "-w", "net.ipv4.tcp_slow_start_after_idle=0"])
    return {"buffer_bytes": buffer, "net.ipv4.tcp_slow_start_after_idle": "0"}


def _specs(emu: Emulation, scenario: Scenario, options: AllreduceOptions, comm: str, schedule: str,
           run: int, pki: str, endpoints: dict[str, tuple[str, str]]) -> list[tuple[str, dict[str, Any]]]:
    sites, paths, ranks = scenario.sites, emu.paths, options.ranks_per_site
    common: dict[str, Any] = {
              "ranks_per_site": ranks, "count": options.size_bytes // 4, "steps": options.steps,
              "compress": None if options.compress == "none" else options.compress, "seed": SEED,
              "timeout": options.timeout_s, "intra_port": INTRA_PORT + run * PORTS_PER_RUN,
              "chunk_bytes": options.chunk_bytes, "sites": len(sites)}
    out = []
    for i, site in enumerate(sites):
        for r in range(ranks):
            spec = {**common, "site": i, "rank": r}
            if comm == "wanxport":
                port = PORT_BASE + run * PORTS_PER_RUN + r
                listener = {j: sites[max(i, j)] for j in range(len(sites)) if j != i}
                spec.update(pki=pki, names=[f"{s}-r{r}" for s in sites], schedule=schedule,
                            paths={j: [f"{address_at(p, listener[j])}:{port}" for p in paths
                                       if set(p.between) == {site, sites[j]}] for j in listener})
            else:
                spec.update(master=endpoints[sites[0]][1], master_port=GLOO_PORT + run,
                            ifname=endpoints[site][0])
            out.append((site, spec))
    return out


def _tx_bytes(emu: Emulation, scenario: Scenario) -> dict[str, dict[str, int]]:
    """Per site, the transmitted bytes of each of its interfaces."""
    out = {}
    for site in scenario.sites:
        table = {}
        for line in emu.run(site, ["cat", "/proc/net/dev"]).stdout.splitlines()[2:]:
            name, _, rest = line.partition(":")
            table[name.strip()] = int(rest.split()[8])
        out[site] = table
    return out


def run_once(emu: Emulation, scenario: Scenario, options: AllreduceOptions, comm: str, schedule: str,
             run: int, endpoints: dict[str, tuple[str, str]], settings: dict[str, Any]) -> dict[str, Any]:
    """One comm (and schedule) for ``options.steps`` steps on the emulation as it is."""
    wall_start = time.perf_counter()
    ideal = allreduce_ideal_time_s(scenario, options.size_bytes)
    deadline_s = 60.0 + options.steps * max(30.0, 20.0 * ideal)
    programs: list[Program] = []
    settings = {**settings, "run": run, "load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="wx-allreduce-") as pki:
        if comm == "wanxport":
            make_rank_pki(pki, [f"{s}-r{r}" for s in scenario.sites for r in range(options.ranks_per_site)])
        try:
            for site, spec in _specs(emu, scenario, options, comm, schedule, run, pki, endpoints):
                programs.append(Program(emu, site, "emulation.baselines.allreduce_app", comm, spec,
                                        stdin=True))
            for program in programs:
                if program.expect("ready", SETUP_TIMEOUT_S) is None:
                    raise EmulationError(f"{program.label}: not ready within {SETUP_TIMEOUT_S:.0f} s")
            before, drops_before = _tx_bytes(emu, scenario), engine_drops(emu)
            engine_before, go_at = emu.engine_cpu_s(), time.monotonic()
            emu.start_events()
            for program in programs:
                program.tell("go")
            stop_at, done = time.monotonic() + deadline_s, []
            for program in programs:
                report = program.expect("done", max(1.0, stop_at - time.monotonic()))
                if report is None:
                    raise EmulationError(f"{program.label}: no result within the {deadline_s:.0f} s deadline")
                done.append(report)
            settings["run_wall_s"] = round(time.monotonic() - go_at, 2)
            after, drops_after, engine_after = _tx_bytes(emu, scenario), engine_drops(emu), emu.engine_cpu_s()
        finally:
            for program in programs:
                program.close()
    if engine_before is not None and engine_after is not None:
        settings["engine_cpu_s"] = round(engine_after - engine_before, 2)
    if drops_after:
        settings["lag_max_s"] = max(c["lag_max_s"] for dirs in drops_after.values() for c in dirs.values())
        settings["engine_drops"] = {
            path: {d: {cause: n if cause == "lag_max_s" else n - drops_before[path][d][cause]
                       for cause, n in by_cause.items()} for d, by_cause in dirs.items()}
            for path, dirs in drops_after.items()}
    settings["load_after"] = os.getloadavg()
    return _report(emu, scenario, options, comm, schedule, done, before, after, ideal, settings, wall_start)


def _report(emu: Emulation, scenario: Scenario, options: AllreduceOptions, comm: str, schedule: str,
            done: list[dict[str, Any]], before: dict[str, dict[str, int]], after: dict[str, dict[str, int]],
            ideal: float, settings: dict[str, Any], wall_start: float) -> dict[str, Any]:
    errors = [d["error"] for d in done if d.get("error")]
    n_steps = min(len(d["steps"]) for d in done)
    step_s = [max(d["steps"][k][1] for d in done) - min(d["steps"][k][0] for d in done)
              for k in range(n_steps)]
    checked = min(len(d["digests"]) for d in done)  # a rank that failed after a step has no verdict for it
    identical = all(len({d["digests"][k] for d in done}) == 1 for k in range(checked))
    correct = not errors and n_steps == options.steps and identical and all(d["correct"] for d in done)
    paths = []
    for p in emu.paths:
        first, second = p.between
        forward = after[first].get(p.ifname, 0) - before[first].get(p.ifname, 0)
        backward = after[second].get(p.ifname, 0) - before[second].get(p.ifname, 0)
        paths.append(PathReport(p.name, forward + backward, 0, None, "active" if forward + backward > 1 << 20
                                else "unused", {"between": list(p.between), "wire_bytes_a_to_b": forward,
                                                "wire_bytes_b_to_a": backward}))
    moved = 2 * options.size_bytes * n_steps
    chosen = done[0].get("schedules") if comm == "wanxport" and done else None
    out = build_report(
        scenario=scenario.name, mode="emulated", transport="wanxport" if comm == "wanxport" else "tcp",
        payload_bytes=moved, completion_s=sum(step_s), ideal_s=ideal, intact=correct,
        wall_s=time.perf_counter() - wall_start, paths=paths, delivered_bytes=moved if correct else 0,
        steps=options.steps, step_s=step_s,
        **({} if options.steps > 1 else {"steps": 1, **step_summary(step_s)}),
        workload="allreduce", comm=comm, sites=list(scenario.sites), ideal_kind="bus-bandwidth",
        schedule=schedule if comm == "wanxport" else None, schedules=chosen,
        measured_mesh=done[0].get("mesh") if comm == "wanxport" and done else None,
        ranks_per_site=options.ranks_per_site,
        compress=None if options.compress == "none" else options.compress,
        size_bytes=options.size_bytes, correct=correct, identical_across_ranks=identical,
        preset=COLLECTIVE.name if comm == "wanxport" else None,
        worst_error_ratio=max(d["worst_error_ratio"] for d in done),
        cross_site_wire_bytes=sum(p.payload_bytes for p in paths), rank_cpu_s=[d.get("cpu_s") for d in done],
        cc="bbr" if comm == "wanxport" else emu.run(scenario.sites[0], ["sysctl", "-n",
                                                                        "net.ipv4.tcp_congestion_control"]).stdout.strip(),
        backend=emu.backend, settings=settings, errors=errors)
    out["ranks"] = rank_cpu(done, options.ranks_per_site)
    out["cpu_other"] = {"engine": settings.get("engine_cpu_s")}  # "go" to the last rank's "done"
    return out


def run_mesh(scenario: Scenario, options: AllreduceOptions, comms: list[str], schedules: list[str],
             rounds: int) -> list[dict[str, Any]]:
    """Every (comm, schedule) run, alternating, ``rounds`` times, on one emulation; the reports."""
    check_mesh(scenario, comms, schedules, rounds)
    emu = Emulation(scenario, backend=options.backend)
    emu.up()
    try:
        endpoints = gloo_endpoints(emu, scenario)
        settings = {**tune(emu, scenario), "routes": mesh_routes(emu, scenario, endpoints),
                    "gloo_interfaces": {s: list(e) for s, e in endpoints.items()}}
        runs = [(comm, schedule) for comm in comms
                for schedule in (schedules if comm == "wanxport" else ["-"])]
        reports = []
        for round_ in range(rounds):
            for k, (comm, schedule) in enumerate(runs):
                reports.append(run_once(emu, scenario, options, comm, schedule, round_ * len(runs) + k,
                                        endpoints, settings))
        return reports
    finally:
        emu.down()


def summary(report: dict[str, Any]) -> str:
    from wanxport.units import format_size

    chosen = ",".join(sorted({s[0] for s in report.get("schedules") or []}))
    schedule = f" schedule={report['schedule']} (ran {chosen})" if report["comm"] == "wanxport" else ""
    return (f"{report['scenario']}: allreduce {format_size(report['size_bytes'])} x {report['steps']} "
            f"among {len(report['sites'])} sites, {report['comm']}{schedule}: first "
            f"{report['first_step_s']} s, mean {report['mean_step_s']} s, bound {report['ideal_s']} s "
            f"-> efficiency {report['efficiency']}, "
            f"lag_max_s {report['settings'].get('lag_max_s')}, correct {'yes' if report['correct'] else 'NO'}"
            + "".join(f"\n  error: {e}" for e in report["errors"]))


def main_mesh(args: Any, scenario: Scenario, options: AllreduceOptions, comms: list[str]) -> int:
    """The N-site ``allreduce``: 0 when every run was correct."""
    from pathlib import Path

    from wanxport.report import dumps

    schedules = args.schedule.split(",")
    check_mesh(scenario, comms, schedules, args.rounds)
    if options.compress != "none" and "gloo" in comms:
        raise ValueError("--compress: gloo has no compression; use --compress none with --comm gloo")
    reports = run_mesh(scenario, options, comms, schedules, args.rounds)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    for k, report in enumerate(reports):
        label = report["comm"] + (f"-{report['schedule']}" if report["schedule"] else "")
        if out is not None:
            (out / f"{scenario.name}-{label}-{k:02d}.json").write_text(dumps(report) + "\n")
        print(dumps(report) if args.json else summary(report), flush=True)
    return 0 if all(r["correct"] for r in reports) else 1
