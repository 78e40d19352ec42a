"""What the two-site rank benchmarks (``allreduce``, ``pipeline``) share.

Both bring a scenario up, tune the gateways as a careful operator would
(``prepare_network``), start one program per rank in the gateway namespaces, wait
until every rank has joined, say "go" to all at once and collect each rank's
``done`` line (``run_ranks``). ``WanMeter`` reads what the run cost the emulated WAN
between "go" and the last "done": each path interface's transmitted bytes (the only
per-path figure gloo has), the impairment engine's CPU and its drops.
"""

from __future__ import annotations

import os
import time
from typing import Any

from emulation.api import Emulation
from emulation.baselines import netconfig
from emulation.baselines.programs import Program
from emulation.errors import EmulationError
from wanxport.report import PathReport
from wanxport.scenario import Scenario

SETUP_TIMEOUT_S = 180.0
TX_BYTES, TX_PACKETS = 8, 9  # columns of /proc/net/dev after the interface name


def prepare_network(emu: Emulation, scenario: Scenario, gloo: bool,
                    routes: list[int] | None = None) -> tuple[int, dict[str, Any]]:
    """Source routing, socket buffer maxima for ``routes`` (default: the best route), and for
    gloo ``net.ipv4.tcp_slow_start_after_idle=0``: between steps gloo's connections idle
    while the ranks check their results and meet at a barrier, and a connection that
    restarted from its initial window after every idle spell would charge each step a slow
    start no careful operator would leave on. Returns the best route and the settings in force."""
    best = netconfig.best_path(scenario)
    netconfig.source_routing(emu, best)
    buffer = max(netconfig.buffer_bytes(scenario, [k]) for k in (routes or [best]))
    settings: dict[str, Any] = {"buffer_bytes": buffer, **netconfig.tune_buffers(emu, buffer),
                                "best_route": emu.paths[best].name, "load_before": os.getloadavg()}
    if gloo:
        settings["net.ipv4.tcp_slow_start_after_idle"] = netconfig.slow_start_after_idle_off(emu)
    return best, settings


def host_congestion_control(emu: Emulation) -> str:
    """The congestion control TCP uses in the gateways (gloo cannot choose one per socket)."""
    return emu.run("a", ["sysctl", "-n", "net.ipv4.tcp_congestion_control"]).stdout.strip()


def make_rank_pki(directory: str, names: list[str]) -> None:
    """A test CA and one certificate per name, readable by the rank programs."""
    from wanxport.control.certs import make_test_pki

    make_test_pki(directory, names)
    os.chmod(directory, 0o755)


def run_ranks(emu: Emulation, module: str, comm: str, specs: list[tuple[str, dict[str, Any]]],
              deadline_s: float, settings: dict[str, Any]) -> tuple[list[dict[str, Any]], WanMeter]:
    """Start ``python -m module comm spec`` per (side, spec), wait for every "ready", start
    the scenario's events, say "go" and return every rank's "done" (in ``specs`` order) and
    the meter read over the run. ``settings`` gains ``run_wall_s``, "go" to the last "done",
    and what ``WanMeter`` measured over it."""
    programs: list[Program] = []
    try:
        for side, spec in specs:
            programs.append(Program(emu, side, module, comm, spec, stdin=True))
        for program in programs:
            if program.expect("ready", SETUP_TIMEOUT_S) is None:
                raise EmulationError(f"{program.label}: not ready within {SETUP_TIMEOUT_S:.0f} s")
        meter = WanMeter(emu)
        go_at = time.monotonic()
        emu.start_events()
        for program in programs:
            program.tell("go")
        stop_at = go_at + deadline_s
        done = []
        for program in programs:
            report = program.expect("done", max(1.0, stop_at - time.monotonic()))
            if report is None:
                raise EmulationError(f"{program.label}: no result within the {deadline_s:.0f} s deadline")
            done.append(report)
        settings["run_wall_s"] = round(time.monotonic() - go_at, 2)
        meter.stop(settings)
    finally:
        for program in programs:
            program.close()
    settings["load_after"] = os.getloadavg()
    return done, meter


class WanMeter:
    """The emulated WAN's counters at the start; ``stop`` adds what changed since to a
    settings dict, and keeps each path interface's transmitted bytes in ``wire``."""

    def __init__(self, emu: Emulation) -> None:
        self.emu = emu
        self.before = tx_counter(emu, TX_BYTES)
        self.wire: dict[str, list[int]] = {}
        self.engine_s: float | None = None  # the impairment engine's CPU-s over the run (None: netem)
        self._datagrams = _sent_datagrams(emu)
        self._drops = engine_drops(emu)
        self._engine = emu.engine_cpu_s()

    def stop(self, settings: dict[str, Any]) -> None:
        after = tx_counter(self.emu, TX_BYTES)
        self.wire = {side: [b - a for a, b in zip(self.before[side], after[side], strict=True)]
                     for side in self.before}
        engine, drops = self.emu.engine_cpu_s(), engine_drops(self.emu)
        if self._drops and drops:
            settings["engine_drops"] = {
                path: {d: {cause: n if cause == "lag_max_s" else n - self._drops[path][d][cause]
                           for cause, n in by_cause.items()}
                       for d, by_cause in dirs.items()}
                for path, dirs in drops.items()}
        if self._engine is not None and engine is not None:
            self.engine_s = round(engine - self._engine, 2)
            settings["engine_cpu_s"] = self.engine_s  # over run_wall_s
            datagrams = _sent_datagrams(self.emu) - self._datagrams
            settings["engine_datagrams"] = datagrams
            if datagrams:
                settings["engine_us_per_datagram"] = round(1e6 * (engine - self._engine) / datagrams, 2)


def tx_counter(emu: Emulation, column: int) -> dict[str, list[int]]:
    """Per side, a transmit counter (bytes or packets) of each path's gateway interface."""
    out = {}
    for side in ("a", "b"):
        table = {}
        for line in emu.run(side, ["cat", "/proc/net/dev"]).stdout.splitlines()[2:]:
            name, _, rest = line.partition(":")
            table[name.strip()] = int(rest.split()[column])
        out[side] = [table.get(p.ifname, 0) for p in emu.paths]
    return out


def _sent_datagrams(emu: Emulation) -> int:
    """Frames both sites' path interfaces have transmitted so far: what the engine must
    forward, the denominator of its CPU per datagram."""
    return sum(sum(counts) for counts in tx_counter(emu, TX_PACKETS).values())


def engine_drops(emu: Emulation) -> dict[str, dict[str, dict[str, float]]]:
    """The engine's drops so far by path, direction and cause (queue: the bottleneck's
    drop-tail buffer overflowed; loss: the scenario's random loss); empty under netem. A
    step's retransmissions beyond the random loss are these queue drops: what its
    congestion control cost. ``stamped`` frames entered the queue at their kernel
    arrival time; ``lag_max_s`` is the longest one waited for the engine to read it."""
    if emu.backend != "engine":
        return {}
    return {path: {d: {"queue": c["drop_queue"], "loss": c["drop_loss"], "forwarded": c["tx_packets"],
                       "stamped": c["rx_stamped"], "lag_max_s": round(c["rx_lag_max_s"], 6)}
                   for d, c in dirs.items()}
            for path, dirs in emu.counters().items()}


def path_reports(emu: Emulation, wanxport: bool, done: list[dict[str, Any]], sides: list[str],
                 wire: dict[str, list[int]]) -> list[PathReport]:
    """Per path: wanxport's own payload counters summed over each side's ranks (``sides[k]``
    is ``done[k]``'s gateway; retransmissions included), and for every comm the gateway
    interfaces' transmitted bytes (``wire_bytes_*``: IP packets, headers and acknowledgements
    included), the only per-path figure gloo has."""
    n = len(emu.paths)
    payload = {"a": [0] * n, "b": [0] * n}
    retrans = [0] * n
    srtt: list[float | None] = [None] * n
    states: list[str | None] = [None] * n
    for side, d in zip(sides, done, strict=True):
        for i, (sent, retransmitted, rtt, state) in enumerate(d.get("paths") or []):
            payload[side][i] += sent
            retrans[i] += retransmitted
            srtt[i] = srtt[i] if srtt[i] is not None else rtt
            states[i] = states[i] or state
    paths = []
    for i, p in enumerate(emu.paths):
        if wanxport:
            total, state = payload["a"][i] + payload["b"][i], states[i] or "unused"
            extra = {"payload_bytes_a_to_b": payload["a"][i], "payload_bytes_b_to_a": payload["b"][i]}
        else:
            total = wire["a"][i] + wire["b"][i]
            state = "active" if total > (1 << 20) else "unused"
            extra = {}
        extra.update(wire_bytes_a_to_b=wire["a"][i], wire_bytes_b_to_a=wire["b"][i])
        paths.append(PathReport(p.name, total, retrans[i], srtt[i], state, extra))
    return paths
