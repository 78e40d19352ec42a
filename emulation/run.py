"""``python -m emulation run``: one transfer over an emulated scenario, one run report.

Brings the scenario up, tunes the gateways for the transport (``baselines.netconfig``),
starts receiver(s) and sender(s), starts the events clock and the transfer
together ("go": the first byte), waits for the receiver(s) or the deadline,
checks the bytes, tears everything down and returns the run report v1
(``mode: "emulated"``).

Timing: completion is from the sender's first byte (after connection setup,
which the sender does before "go") to the moment the receiver has every byte
and its hash; both timestamps are CLOCK_MONOTONIC, shared by all namespaces.
A run that misses the deadline is stopped: ``finished`` and ``intact`` false,
completion the elapsed time (a lower bound on the true one), goodput what arrived
divided by it. A baseline's deadline is at least 10 x the ideal, and its report
carries each path's delivered rate and ``suspect`` (``baselines.delivery``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import platform
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from emulation.api import Emulation, Gateways
from emulation.baselines import netconfig, payload
from emulation.baselines.delivery import Delivery, delivery, suspect
from emulation.baselines.programs import Program
from emulation.baselines.transports import (
    BASELINES,
    TCP_BASED,
    Direction,
    PathStats,
    launch,
    path_stats,
    paths_used,
)
from emulation.bundled import resolve_scenario
from emulation.errors import EmulationError
from emulation.ratios import DNF, finished
from wanxport.aio import threadcpu
from wanxport.report import PathReport, build_report, spread
from wanxport.scenario import Scenario, ideal_time_s, relayed_ideal_time_s

log = logging.getLogger(__name__)

TRANSPORTS = ("wanxport", *BASELINES)
CONGESTION_CONTROLS = ("cubic", "bbr", "reno")
DEFAULT_CC = "cubic"
QUIC_CCS = ("cubic", "reno")  # aioquic has no bbr
WANXPORT_CCS = ("bbr", "cubic")
WANXPORT_DEFAULT_CC = "bbr"
SETUP_TIMEOUT_S = 30.0
REPORT_TIMEOUT_S = 15.0
PORTS = {"a": 5201, "b": 5202}
# Transports whose programs repeat the transfer on one session or set of connections.
STEPPED_TRANSPORTS = ("wanxport", *TCP_BASED)


@dataclass(frozen=True)
class RunOptions:
    transport: str
    cc: str | None = None  # None: cubic for TCP-based and aioquic
    size_bytes: int | None = None
    deadline_s: float | None = None
    backend: str | None = None
    steps: int | None = None  # None: the scenario's [transfer] steps
    think_ms: float | None = None
    fec: str = "auto"  # wanxport's erasure-coded tail: "auto" or "off" (SessionConfig.fec)
    #: (from, to): the two sites of an N-site scenario the transfer runs between (None: its [transfer]'s).
    between: tuple[str, str] | None = None


DEADLINE_FLOOR_S = 60.0
DEFAULT_DEADLINE_IDEALS = 20.0
# A baseline stopped sooner than this many ideals tells us little: the published
# ratio against it would be a bound set by our deadline, not by the baseline.
BASELINE_DEADLINE_IDEALS = 10.0


def _ideals_s(ideal_s: float, ideals: float, steps: int, think_ms: float) -> float:
    return steps * ideals * ideal_s + (steps - 1) * think_ms / 1000.0


def default_deadline_s(ideal_s: float, steps: int = 1, think_ms: float = 0.0) -> float:
    """max(60 s, 20 x ideal per step plus the think time between steps), as the simulator uses."""
    if not math.isfinite(ideal_s):
        return DEADLINE_FLOOR_S
    return max(DEADLINE_FLOOR_S, _ideals_s(ideal_s, DEFAULT_DEADLINE_IDEALS, steps, think_ms))


def minimum_baseline_deadline_s(ideal_s: float, steps: int = 1, think_ms: float = 0.0) -> float:
    """The shortest deadline a baseline may run under: 10 x the ideal per step plus think time."""
    if not math.isfinite(ideal_s):
        return 0.0
    return _ideals_s(ideal_s, BASELINE_DEADLINE_IDEALS, steps, think_ms)


def check_deadline(transport: str, deadline_s: float | None, scenario: Scenario) -> None:
    """ValueError (one line) when ``deadline_s`` would stop a baseline before 10 x its ideal."""
    if deadline_s is None or transport == "wanxport":
        return
    transfer = scenario.transfer
    least = minimum_baseline_deadline_s(ideal_time_s(scenario), transfer.steps, transfer.think_ms)
    if deadline_s < least:
        raise ValueError(f"--deadline {deadline_s:g}: a {transport} baseline on {scenario.name} "
                         f"needs at least {least:.1f} s ({BASELINE_DEADLINE_IDEALS:g} x the ideal "
                         f"per step), or a run it does not finish says nothing about it")


def check_options(options: RunOptions) -> str | None:
    """The congestion control to use; ValueError (one line) for a bad combination."""
    if options.transport not in TRANSPORTS:
        raise ValueError(f"--transport: unknown {options.transport!r}; valid: {', '.join(TRANSPORTS)}")
    if options.deadline_s is not None and not options.deadline_s > 0:
        raise ValueError("--deadline must be more than 0 seconds")
    if options.transport == "wanxport":
        cc = options.cc or WANXPORT_DEFAULT_CC
        if cc not in WANXPORT_CCS:
            raise ValueError(f"--cc {cc}: wanxport has no {cc}; valid: {', '.join(WANXPORT_CCS)}")
        return cc
    cc = options.cc or DEFAULT_CC
    if cc not in CONGESTION_CONTROLS:
        raise ValueError(f"--cc: unknown {cc!r}; valid: {', '.join(CONGESTION_CONTROLS)}")
    if options.transport == "aioquic" and cc not in QUIC_CCS:
        raise ValueError(f"--cc {cc}: aioquic has no {cc}; valid for aioquic: {', '.join(QUIC_CCS)}")
    return cc


def run_experiment(scenario: Scenario, options: RunOptions) -> dict[str, Any]:
    """Run one transfer of ``scenario`` with ``options``; return the run report v1."""
    cc = check_options(options)
    mesh = scenario.with_transfer(size_bytes=options.size_bytes, steps=options.steps,
                                  think_ms=options.think_ms)
    between = options.between or mesh.transfer_pair
    scenario = mesh.pair(*between)  # ScenarioError (one line) for a pair without a direct path
    if scenario.transfer.steps > 1 and options.transport not in STEPPED_TRANSPORTS:
        raise ValueError(f"--steps: {options.transport} runs one transfer per connection here; "
                         f"steps > 1 needs one of {', '.join(STEPPED_TRANSPORTS)}")
    check_deadline(options.transport, options.deadline_s, scenario)
    if options.transport in TCP_BASED:
        netconfig.require_congestion_control(cc or DEFAULT_CC)
    wall_start = time.perf_counter()
    emu = Emulation(mesh, backend=options.backend)
    emu.up()
    try:
        gateways = emu if scenario is mesh else emu.pair(*between)
        report = _run(gateways, scenario, options.transport, cc, options.deadline_s, wall_start, options.fec)
    finally:
        emu.down()
    if len(mesh.sites) > 2:
        report.update(between=list(between), ideal_relayed_s=relayed_ideal_time_s(
            mesh, *between, scenario.transfer.size_bytes, scenario.transfer.direction))
    return report


def _run(emu: Gateways, scenario: Scenario, transport: str, cc: str | None,
         deadline_s: float | None, wall_start: float, fec: str = "auto", *,
         on_go: Callable[[], None] | None = None) -> dict[str, Any]:
    """One run on an emulation that is up. ``on_go`` runs once every program is set up,
    just before the transfer starts (a test's disturbance that must meet the transfer)."""
    size = scenario.transfer.size_bytes
    transfer = scenario.transfer
    ideal = ideal_time_s(scenario)
    deadline = deadline_s or default_deadline_s(ideal, transfer.steps, transfer.think_ms)
    paths = emu.paths
    best = netconfig.best_path(scenario)
    needed = netconfig.buffer_bytes(scenario, paths_used(transport, best, len(paths)))
    buffer = needed  # root: SO_*BUFFORCE passes net.core.[rw]mem_max
    settings: dict[str, Any] = {"cc": cc, "buffer_bytes": buffer, "kernel": platform.release(),
                                **netconfig.tune_buffers(emu, buffer)}
    netconfig.source_routing(emu, best)
    if transport in TCP_BASED:
        settings["net.ipv4.tcp_slow_start_after_idle"] = netconfig.slow_start_after_idle_off(emu)
    if transport == "mptcp":
        settings["mptcp"] = netconfig.configure_mptcp(emu, best)
    directions = [Direction("a", "b", PORTS["a"])]
    if scenario.transfer.direction == "both":
        directions.append(Direction("b", "a", PORTS["b"]))
    mtu = min(p.forward.mtu for p in scenario.paths)
    pki = _make_pki() if transport == "wanxport" else None
    launches = [launch(transport, paths, best, d, seed=scenario.seed, size=size, cc=cc,
                       buffer=buffer, mtu=mtu, shards=transfer.shards, pki=pki,
                       steps=transfer.steps, think_ms=transfer.think_ms, fec=fec) for d in directions]
    settings["connections"] = len(launches[0].sender.get("conns", [None]))
    if transport == "wanxport":
        settings["fec"] = fec
    settings["paths_used"] = [paths[k].name for k in paths_used(transport, best, len(paths))]
    if transport == "wanxport":
        settings["ports"] = [p["port"] for p in launches[0].receiver["paths"]]
    programs: list[Program] = []
    try:
        receivers, senders = [], []
        for d, plan in zip(directions, launches, strict=True):
            receivers.append(Program(emu, d.receiver, plan.module, "recv", plan.receiver))
            programs.append(receivers[-1])
            _setup(receivers[-1], "listening")
        for d, plan in zip(directions, launches, strict=True):
            senders.append(Program(emu, d.sender, plan.module, "send", plan.sender, stdin=True))
            programs.append(senders[-1])
        for sender in senders:
            _setup(sender, "ready")
        if on_go is not None:
            on_go()
        counters_before = netconfig.tcp_counters(emu) if transport in TCP_BASED else None
        emu.start_events()
        engine_before = emu.engine_cpu_s()
        t_go = time.monotonic()
        for sender in senders:
            sender.tell("go")
        received = _wait_receivers(receivers, t_go + deadline)
        stopped = time.monotonic()
        engine_after = emu.engine_cpu_s()
        if not all(r["complete"] for r in received):
            for sender in senders:
                sender.interrupt()
        sent = [_sender_report(s, t_go, complete=all(r["complete"] for r in received))
                for s in senders]
        # How late the impairment engine read a frame at worst (None under netem): a run whose
        # engine fell behind measured the host, not the path.
        lag_max_s = emu.lag_max_s()
        if counters_before is not None:
            after = netconfig.tcp_counters(emu)
            settings["tcp_counters"] = {side: {k: n - counters_before[side][k] for k, n in by_name.items()}
                                        for side, by_name in after.items()}
            settings["tcp_mem_host"] = _read_proc("/proc/sys/net/ipv4/tcp_mem")
    finally:
        for program in programs:
            program.close()
        if pki is not None:
            shutil.rmtree(pki, ignore_errors=True)
    report = _report(scenario, transport, cc, directions, paths, best, sent, received, ideal,
                     deadline, t_go, stopped, wall_start, settings, emu.backend)
    report["lag_max_s"] = lag_max_s
    if engine_before is not None and engine_after is not None:
        report["cpu_other"] = {"engine": round(engine_after - engine_before, 2)}  # "go" to the last byte
    return report


def _make_pki() -> str:
    """A fresh CA and one certificate per site (``a``, ``b``) for one wanxport run: the
    gateways authenticate each other over the QUIC control channel, as users' do."""
    from wanxport.control.certs import make_test_pki

    pki = tempfile.mkdtemp(prefix="wx-run-pki-")
    make_test_pki(pki, ["a", "b"])
    os.chmod(pki, 0o755)  # the gateways' programs read it from their namespaces
    return pki


def _read_proc(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip()
    except OSError:
        return None


def _setup(program: Program, event: str) -> dict[str, Any]:
    return _expect(program, event, SETUP_TIMEOUT_S)


def _expect(program: Program, event: str, timeout_s: float) -> dict[str, Any]:
    obj = program.expect(event, timeout_s)
    if obj is None:
        raise EmulationError(f"{program.label}: no '{event}' within {timeout_s:.0f} s")
    return obj


def _sender_report(sender: Program, t_go: float, complete: bool) -> dict[str, Any]:
    """The sender's final report; after a deadline, a stand-in if it stays silent."""
    if complete:
        return _expect(sender, "done", REPORT_TIMEOUT_S)
    done = sender.expect("done", REPORT_TIMEOUT_S)
    if done is None:
        log.warning("%s did not report after the deadline", sender.label)
        return {"event": "done", "t0": t_go, "finished": False, "slices": [], "silent": True}
    return done


def _wait_receivers(receivers: list[Program], stop_at: float) -> list[dict[str, Any]]:
    """Each receiver's final report; past ``stop_at`` the rest are interrupted first."""
    results = []
    for receiver in receivers:
        done = receiver.expect("done", max(0.0, stop_at - time.monotonic()))
        if done is None:
            for other in receivers:
                other.interrupt()
            done = _expect(receiver, "done", REPORT_TIMEOUT_S)
        results.append(done)
    return results


def _digest(slices: list[dict[str, Any]]) -> str:
    return payload.payload_digest([(s["offset"], s["sha256"]) for s in slices])


def _report(scenario: Scenario, transport: str, cc: str | None, directions: list[Direction],
            paths: list[Any], best: int, sent: list[dict[str, Any]],
            received: list[dict[str, Any]], ideal: float, deadline: float, t_go: float,
            stopped: float, wall_start: float, settings: dict[str, Any],
            backend: str | None) -> dict[str, Any]:
    size = scenario.transfer.size_bytes
    steps = scenario.transfer.steps
    complete = all(r["complete"] for r in received)
    digests = [{"direction": d.name, "sent": _digest(s["slices"]),
                "received": _digest(r["slices"]) if r["slices"] else None}
               for d, s, r in zip(directions, sent, received, strict=True)]
    # Every step carries the same payload: each step's bytes must hash to what was sent.
    intact = complete and all(
        d["sent"] == d["received"] and sum(x["length"] for x in r["slices"]) == size
        and all(step == d["sent"] for step in r.get("step_digests", []))
        and all(s.get("verdicts", [True]))
        for d, s, r in zip(digests, sent, received, strict=True))
    timing = (step_timing(transport, scenario.transfer.shards, sent, received)
              if complete and transport in STEPPED_TRANSPORTS else None)  # aioquic keeps no step times
    if complete:
        completion = max(r["t_end"] for r in received) - min(s["t0"] for s in sent)
    else:
        completion = stopped - t_go
    per_path = [PathStats() for _ in paths]
    deliveries: list[list[Delivery]] = [[] for _ in paths]
    for d, s, r in zip(directions, sent, received, strict=True):
        for k, (total, one) in enumerate(zip(per_path, path_stats(transport, paths, best, d, s, r),
                                             strict=True)):
            if one.used and transport != "wanxport":
                deliveries[k].append(delivery(scenario.paths[k], d.name, one.payload_bytes, one.active_s))
            total.payload_bytes += one.payload_bytes
            total.retransmitted_bytes += one.retransmitted_bytes
            total.repair_bytes += one.repair_bytes
            total.srtt_s = total.srtt_s if total.srtt_s is not None else one.srtt_s
            total.used = total.used or one.used
            total.state = total.state or one.state
    return build_report(
        scenario=scenario.name, mode="emulated", transport=transport,
        payload_bytes=size * len(directions) * steps, completion_s=completion, ideal_s=ideal,
        intact=intact, wall_s=time.perf_counter() - wall_start,
        paths=[PathReport(p.name, st.payload_bytes, st.retransmitted_bytes, st.srtt_s,
                          st.state or ("active" if st.used else "unused"),
                          {"repair_bytes": st.repair_bytes, **_delivered(found)})
               for p, st, found in zip(paths, per_path, deliveries, strict=True)],
        repair_bytes=sum(st.repair_bytes for st in per_path),
        delivered_bytes=None if intact else (0 if complete else sum(r["bytes"] for r in received)),
        steps=steps, step_s=timing[0] if timing else None,
        **({"think_ms": scenario.transfer.think_ms} if steps > 1 else {}),
        shard_completion_s=spread(timing[1]) if timing else None,
        cc=cc, direction=scenario.transfer.direction, deadline_s=deadline,
        finished=complete, timed_out=not complete, backend=backend, seed=scenario.seed, settings=settings,
        **({} if transport == "wanxport"
           else {"suspect": suspect([x for found in deliveries for x in found])}),
        digests=digests,
        **(_session_fields(sent, received, complete) if transport == "wanxport" else {}),
        **({"timeline": sent[0].get("timeline", []),
            "diagnostics": [{"direction": d.name, "sender": s.get("diag"), "receiver": r.get("diag")}
                            for d, s, r in zip(directions, sent, received, strict=True)]}
           if transport == "wanxport" else {}),
        **({"tcp_samples": [_samples(paths, d, s) for d, s in zip(directions, sent, strict=True)]}
           if transport in TCP_BASED else {}),
    )


def _session_fields(sent: list[dict[str, Any]], received: list[dict[str, Any]], complete: bool
                    ) -> dict[str, Any]:
    """What the wanxport gateways add (docs/design.md section 5): ``verdict_s``, when the last
    sender held every verdict; ``digest_s``, one step's shard digests timed alone (inside
    the clock: hashed while the shards flow with a peer of protocol 5, before with older);
    ``setup_s``, the session setup before the clock; how the session was set up and keyed
    (``control``) and the senders' certificate names as each receiver verified them
    (``peers``); and the preset it ran with what the run changed."""
    t0 = min(s["t0"] for s in sent)
    ends = [s["verdict_at"][-1] for s in sent if s.get("verdict_at")]
    digests = [s["digest_s"] for s in sent if s.get("digest_s") is not None]
    setups = [s["setup_s"] for s in sent if s.get("setup_s") is not None]
    return {**_cpu_fields(sent, received),
            "verdict_s": round(max(ends) - t0, 6) if complete and len(ends) == len(sent) else None,
            "digest_s": max(digests) if digests else None, "setup_s": max(setups) if setups else None,
            "control": sent[0].get("control"), "peers": [r.get("peer") for r in received],
            "preset": sent[0].get("preset"),
            "preset_overrides": sent[0].get("preset_overrides")}


def _cpu_fields(sent: list[dict[str, Any]], received: list[dict[str, Any]]) -> dict[str, Any]:
    """Each end's CPU-s per thread role (docs/design.md section 5), summed over the directions'
    gateways, and per GB of the payload they moved (a sender from "go" to its last verdict,
    a receiver from its accepted session to its last shard)."""
    ends = {"sender": [s.get("cpu") for s in sent], "receiver": [r.get("cpu") for r in received]}
    if not all(ends["sender"]) or not all(ends["receiver"]):
        return {}
    moved = sum(s["bytes"] for s in received) if received else 0
    cpu = {end: threadcpu.rounded(functools.reduce(threadcpu.add_roles, parts, {}))
           for end, parts in ends.items()}
    return {"cpu": cpu, "cpu_s_per_gb": {end: threadcpu.cpu_s_per_gb(roles, moved)
                                         for end, roles in cpu.items()}}


def _samples(paths: list[Any], direction: Direction, sent: dict[str, Any]) -> dict[str, Any]:
    """The sender's per-connection TCP_INFO samples, each named by the path it was bound to."""
    by_src = {direction.src(p): p.name for p in paths}
    return {"direction": direction.name,
            "connections": [{"path": by_src.get(s.get("src") or ""), "active_s": s.get("active_s"),
                             "fields": s.get("sample_fields"), "samples": s.get("samples", [])}
                            for s in sent.get("slices", [])]}


def _delivered(found: list[Delivery]) -> dict[str, Any]:
    """A baseline path's delivered rate (the lowest of its directions') and each direction's."""
    rates = [d.rate_bps for d in found if d.rate_bps is not None]
    if not found:
        return {}
    return {"delivered_rate_bps": round(min(rates)) if rates else None,
            "delivered": [d.to_dict() for d in found]}


def step_timing(transport: str, shards: int, sent: list[dict[str, Any]], received: list[dict[str, Any]]
                ) -> tuple[list[float], list[float]]:
    """Each step's duration and each shard's completion, from the programs' CLOCK_MONOTONIC times.

    A step runs from its first submission at a sender to its last byte in at a
    receiver (all directions); a shard from its step's submission to its
    verification (wanxport; the TCP baselines carry slices, not shards, so they
    give no shard times).
    """
    ends: list[float] = []
    shard_s: list[float] = []
    for s, r in zip(sent, received, strict=True):
        submitted = s["submitted"]
        if transport == "wanxport":
            per_step = [0.0] * len(submitted)
            for shard_id, at in r["verified"]:
                step = shard_id // shards
                per_step[step] = max(per_step[step], at)
                shard_s.append(at - submitted[step])
        else:
            per_step = list(r["step_ends"])
        ends = [max(pair) for pair in zip(ends, per_step, strict=True)] if ends else per_step
    starts = [min(column) for column in zip(*(s["submitted"] for s in sent), strict=True)]
    return [end - start for start, end in zip(starts, ends, strict=True)], shard_s


def summary(report: dict[str, Any]) -> str:
    """A few human lines for a report."""
    from wanxport.units import format_rate, format_size

    ideal = f", ideal {report['ideal_s']:.2f} s" if report["ideal_s"] else ""
    dnf = f"   {DNF} within {report.get('deadline_s', report['completion_s']):.0f} s"
    lines = [
        f"{report['scenario']}: {report['transport']}"
        f"{' (' + report['cc'] + ')' if report.get('cc') else ''} moved "
        f"{format_size(report['payload_bytes'])} in {report['completion_s']:.2f} s{ideal}",
        f"goodput {format_rate(report['goodput_bps'])}   intact "
        f"{'yes' if report['intact'] else 'NO'}"
        f"{'' if finished(report) else dnf}"
        f"   wall {report['wall_s']:.1f} s",
    ]
    if report.get("suspect"):
        lines.append(f"SUSPECT: {report['suspect']['reason']}")
    if report.get("steps", 1) > 1 and report.get("mean_step_s") is not None:
        lines.append(f"steps {report['steps']}: first {report['first_step_s']:.3f} s, mean "
                     f"{report['mean_step_s']:.3f} s, p90 {report['p90_step_s']:.3f} s, worst "
                     f"{report['worst_step_s']:.3f} s, efficiency {report['efficiency']} (ideal / mean)")
    for p in report["paths"]:
        srtt = f"{p['srtt_s'] * 1000:.1f} ms" if p["srtt_s"] is not None else "-"
        lines.append(f"  {p['name']:<12} {format_size(p['payload_bytes']):>12} "
                     f"retransmitted {format_size(p['retransmitted_bytes']):>10}  srtt {srtt:>9}"
                     f"  {p['state']}")
    return "\n".join(lines)


def exit_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the ``finally`` blocks tear the namespaces down.

    Only in this process: a forked child (pyroute2 forks to create namespaces and
    stops the child with SIGTERM) must die at once, not unwind our stack.
    """
    owner = os.getpid()

    def handler(signum: int, frame: object) -> None:
        if os.getpid() != owner:
            os._exit(128 + signum)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, handler)


def main_run(args: Any) -> int:
    """``python -m emulation run``: 0 intact, 1 not (or the environment cannot run it)."""
    from wanxport.report import dumps

    exit_on_sigterm()
    report = run_experiment(resolve_scenario(args.scenario), RunOptions(
        transport=args.transport, cc=args.cc, size_bytes=args.size, deadline_s=args.deadline,
        backend=args.backend, steps=args.steps, think_ms=args.think_ms, fec=args.fec,
        between=args.between))
    print(dumps(report) if args.json else summary(report))
    return 0 if report["intact"] else 1
