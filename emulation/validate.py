"""Measure every path with tools we did not write: ping (RTT), iperf3 UDP (rate, loss).

Per path, a->b:
* RTT: ``ping`` after one warm-up echo (the first one also waits for ARP);
  the median is checked against ``rtt_ms`` within max(1 ms, 3 %) when the path
  has no jitter (jitter shifts the mean of a non-reordering path).
* rate: iperf3 UDP offered at 1.25x the bottleneck / (1 - loss); the receiver's
  per-second rate, without the first and last second (start-up and queue
  drain), converted to IP bytes, is checked within 5 %.
* iperf3 receiver overload: datagrams the receiving host drops at its socket
  buffer (kernel UDP RcvbufErrors in gateway b) are reported and added back,
  since they did cross the emulated link.
* loss: iperf3 UDP at half the bottleneck (no queue drops); the measured loss
  is checked within 3 sigma of the configured (or stationary burst) loss,
  sigma = sqrt(p (1 - p) / packets).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import subprocess
from typing import Any

from emulation.api import Emulation, PathInfo
from emulation.errors import EmulationError
from emulation.hostenv import require_tool
from wanxport.scenario import LinkParams, Scenario

UDP_PAYLOAD = 1400
UDP_IP_OVERHEAD = 28  # IPv4 + UDP headers
IPERF_PORT = 5201
_INTERVAL = re.compile(
    r"\[\s*\d+\]\s+([\d.]+)-([\d.]+)\s+sec\s+[\d.]+\s+\w*Bytes\s+([\d.]+)\s+(\w?)bits/sec"
    r"\s+[\d.]+\s+ms\s+(\d+)/(\d+)"
)
_SCALE = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9}


def ping_rtt_ms(emu: Emulation, path: PathInfo, count: int = 30) -> dict[str, float]:
    """min/median/avg/max of ``count`` echoes from the path's first site to its second, after a
    warm-up echo.

    The median is what is checked: on a small, shared machine one echo in 30
    can meet a scheduling stall that would move the mean by milliseconds.
    """
    emu.run(path.between[0], ["ping", "-c", "1", "-W", "5", path.b_addr], check=False)
    out = emu.run(path.between[0], ["ping", "-c", str(count), "-i", "0.02", path.b_addr]).stdout
    times = sorted(float(t) for t in re.findall(r"time=([\d.]+) ms", out))
    if not times:
        raise EmulationError(f"ping {path.b_addr} got no replies: {out.strip()[-200:]!r}")
    return {"min": times[0], "median": statistics.median(times),
            "avg": statistics.fmean(times), "max": times[-1], "replies": float(len(times))}


def udp_rcvbuf_errors(emu: Emulation, side: str) -> int:
    """The kernel's count of UDP datagrams dropped at full socket buffers in ``side``.

    On a small machine the iperf3 receiver, not the emulated link, can drop;
    the kernel counts those drops per namespace, so they can be told apart.
    """
    lines = [ln.split() for ln in emu.run(side, ["cat", "/proc/net/snmp"]).stdout.splitlines()
             if ln.startswith("Udp:")]
    return int(dict(zip(lines[0], lines[1], strict=True))["RcvbufErrors"])


def iperf_udp(emu: Emulation, path: PathInfo, rate_bps: float, duration_s: float,
              port: int, attempts: int = 3) -> dict[str, float]:
    """``_iperf_udp_once``, retried: iperf3 3.12's control connection, which shares the
    saturated, lossy path, now and then fails with EAGAIN ("unable to read from stream socket").
    """
    for attempt in range(1, attempts + 1):
        try:
            return _iperf_udp_once(emu, path, rate_bps, duration_s, port)
        except EmulationError as exc:
            if attempt == attempts or "stream socket" not in str(exc):
                raise
    raise AssertionError("unreachable")


def _iperf_udp_once(emu: Emulation, path: PathInfo, rate_bps: float, duration_s: float,
                    port: int) -> dict[str, float]:
    """One iperf3 UDP run from the path's first site to its second: the receiver's steady rate
    (IP bytes) and its loss counts.

    Datagrams the receiving host dropped at its socket buffer are reported as
    ``host_drops`` and added back: they crossed the emulated link.
    """
    host_drops = udp_rcvbuf_errors(emu, path.between[1])
    server = emu.popen(path.between[1], ["iperf3", "-s", "-1", "--forceflush", "-B", path.b_addr,
                                "-p", str(port)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        # "Server listening on ..." appears once it listens (after a line of dashes).
        lines = [server.stdout.readline() for _ in range(2)]
        if not any("listening" in line.lower() for line in lines):
            raise EmulationError(f"iperf3 server did not start: {' '.join(lines).strip()!r}")
        out = emu.run(
            path.between[0],
            ["iperf3", "-c", path.b_addr, "-p", str(port), "-u", "-b", str(int(rate_bps)),
             "-l", str(UDP_PAYLOAD), "-t", str(duration_s), "--json", "--get-server-output"],
            timeout=duration_s + 30,
            check=False,  # iperf3 reports its errors inside the JSON
        ).stdout
    finally:
        server.kill()
        server.wait()
    result = json.loads(out)
    if "error" in result:
        raise EmulationError(f"iperf3 to {path.b_addr}: {result['error']}")
    received = result["end"]["sum_received"]
    rows = [m.groups() for m in _INTERVAL.finditer(result.get("server_output_text", ""))]
    steady = [r for r in rows[:-1] if float(r[0]) >= 1.0 and float(r[1]) <= duration_s]
    if not steady:
        steady = rows
    seconds = sum(float(r[1]) - float(r[0]) for r in steady)
    bits = sum(float(r[2]) * _SCALE[r[3]] * (float(r[1]) - float(r[0])) for r in steady)
    host_drops = udp_rcvbuf_errors(emu, path.between[1]) - host_drops
    ip_bits = (UDP_PAYLOAD + UDP_IP_OVERHEAD) * 8
    ip_factor = ip_bits / (UDP_PAYLOAD * 8)
    rate = bits / seconds * ip_factor if seconds else 0.0
    return {
        "rate_bps": rate + host_drops * ip_bits / float(received["seconds"] or duration_s),
        "packets": float(received["packets"]),
        # The namespace's counter also takes drops iperf3 never counted (late datagrams after
        # its last interval, on a busy host): never more added back than iperf3 lost.
        "lost": float(max(0, received["lost_packets"] - host_drops)),
        "host_drops": float(host_drops),
    }


def _check_path(emu: Emulation, info: PathInfo, lp: LinkParams, duration_s: float,
                port: int) -> dict[str, Any]:
    rtt = ping_rtt_ms(emu, info)
    rtt_tol = max(1.0, 0.03 * lp.rtt_ms)
    loss_cfg = lp.effective_loss
    rate_cfg = lp.bandwidth_mbps * 1e6
    sat = iperf_udp(emu, info, 1.25 * rate_cfg / max(0.05, 1.0 - loss_cfg), duration_s, port)
    low = iperf_udp(emu, info, 0.5 * rate_cfg, duration_s, port)
    loss = low["lost"] / low["packets"] if low["packets"] else 1.0
    sigma = math.sqrt(max(loss_cfg * (1 - loss_cfg), 1e-12) / max(low["packets"], 1.0))
    checks = {
        "rtt": lp.jitter_ms > 0 or abs(rtt["median"] - lp.rtt_ms) <= rtt_tol,
        "rate": abs(sat["rate_bps"] - rate_cfg) <= 0.05 * rate_cfg,
        "loss": abs(loss - loss_cfg) <= max(3 * sigma, 1.0 / max(low["packets"], 1.0)),
    }
    return {
        "path": info.name,
        "direction": "a->b",
        "rtt_ms": {"configured": lp.rtt_ms, "measured": rtt, "tolerance": rtt_tol},
        "rate_mbps": {"configured": lp.bandwidth_mbps, "measured": sat["rate_bps"] / 1e6},
        "loss": {"configured": loss_cfg, "measured": loss, "sigma": sigma,
                 "packets": low["packets"]},
        "receiver_host_drops": {"rate_run": sat["host_drops"], "loss_run": low["host_drops"]},
        "ok": all(checks.values()),
        "checks": checks,
    }


def validate(scenario: Scenario, backend: str | None = None,
             duration_s: float = 3.0) -> dict[str, Any]:
    """Measure every path (bringing the scenario up and down unless it is up already)."""
    require_tool("ping")
    require_tool("iperf3")
    emu = Emulation(scenario, backend=backend)
    owned = not emu.is_up()
    if owned:
        emu.up()
    else:
        emu = Emulation.attach(scenario)
    try:
        results = [
            _check_path(emu, info, spec.forward, duration_s, IPERF_PORT + k)
            for k, (info, spec) in enumerate(zip(emu.paths, scenario.paths, strict=True))
        ]
    finally:
        if owned:
            emu.down()
    return {"scenario": scenario.name, "backend": emu.backend, "paths": results,
            "ok": all(r["ok"] for r in results)}


def format_report(report: dict[str, Any]) -> str:
    """A table: configured against measured, per path."""
    lines = [f"scenario {report['scenario']} ({report['backend']})",
             f"{'path':<10} {'rtt cfg/median ms':>20} {'rate cfg/meas Mb/s':>22} "
             f"{'loss cfg/meas (3σ)':>28}  ok"]
    for r in report["paths"]:
        rtt, rate, loss = r["rtt_ms"], r["rate_mbps"], r["loss"]
        lines.append(
            f"{r['path']:<10} {rtt['configured']:>9.2f}/{rtt['measured']['median']:<10.2f}"
            f" {rate['configured']:>10.2f}/{rate['measured']:<11.2f}"
            f" {loss['configured']:>9.4f}/{loss['measured']:.4f} (±{3 * loss['sigma']:.4f})"
            f"  {'yes' if r['ok'] else 'NO'}"
        )
    return "\n".join(lines)
