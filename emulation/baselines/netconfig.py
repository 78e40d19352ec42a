"""Tuning of the gateway namespaces for a baseline, as a careful operator would do it.

* Socket buffers of at least twice the bandwidth-delay product, where the delay
  counts the bottleneck queue too (a loss-based controller fills it), and the
  namespaces' ``tcp_rmem``/``tcp_wmem`` maxima raised to match (those are per
  network namespace; ``net.core.[rw]mem_max`` are not writable inside one, so
  the programs use SO_SNDBUFFORCE/SO_RCVBUFFORCE, which root may).
* The requested congestion control, when the kernel has it.
* ``net.ipv4.tcp_slow_start_after_idle=0`` (``slow_start_after_idle_off``): a connection
  that waits between training steps keeps its window, as an operator tuning for
  bulk transfers would configure it.
* For MPTCP: ``net.mptcp.enabled``, path-manager limits on both sides, one
  ``subflow`` endpoint per extra path on the client side.
* Source-based policy routing on both gateways, so a socket bound to path k's
  address leaves through path k whatever the destination address. MPTCP needs
  it: its extra subflows go from path k's address to the peer's address on the
  first path, which the main table would route over the first path. The first
  path's own address gets no rule: the peer's answers from it to path k's
  address must follow the main table (destination on path k), and strict
  reverse-path filtering checks incoming subflows the same way.
"""

from __future__ import annotations

import logging
import subprocess
from typing import Any

from emulation.api import Gateways
from emulation.errors import EmulationError
from wanxport.scenario import LinkParams, Scenario

log = logging.getLogger(__name__)

CC_FILE = "/proc/sys/net/ipv4/tcp_available_congestion_control"
RULE_PRIORITY = 100
TABLE_BASE = 100
MPTCP_MAX_SUBFLOWS = 8  # the in-kernel path manager's limit
MIN_BUFFER = 4 << 20


def available_congestion_controls() -> list[str]:
    with open(CC_FILE) as fh:
        return fh.read().split()


def require_congestion_control(cc: str) -> None:
    """Load ``tcp_<cc>`` if needed; one clear line when the kernel cannot do it."""
    if cc in available_congestion_controls():
        return
    subprocess.run(["modprobe", f"tcp_{cc}"], capture_output=True, check=False)
    available = available_congestion_controls()
    if cc not in available:
        raise EmulationError(f"--cc {cc}: not available in this kernel "
                             f"(available: {', '.join(available)}; modprobe tcp_{cc} failed)")


def best_path(scenario: Scenario, direction: str = "a->b") -> int:
    """Index of the path with the highest bandwidth, ties broken by the lowest RTT."""
    params = [p.params_at(0.0, direction) for p in scenario.paths]
    return min(range(len(params)), key=lambda k: (-params[k].bandwidth_mbps, params[k].rtt_ms))


def bdp_bytes(params: list[LinkParams]) -> int:
    """Bytes in flight needed to fill ``params`` together at their longest delay plus queue."""
    delay_s = max((p.rtt_ms + p.queue_ms) / 1000 for p in params)
    return int(sum(p.bandwidth_mbps for p in params) * 1e6 / 8 * delay_s)


def buffer_bytes(scenario: Scenario, path_indexes: list[int]) -> int:
    """Socket buffer for one socket using these paths: twice the BDP, at least 4 MiB."""
    params = [scenario.paths[k].params_at(0.0, "a->b") for k in path_indexes]
    return max(MIN_BUFFER, 2 * bdp_bytes(params))


def _sysctl(emu: Gateways, side: str, key: str, value: str) -> None:
    emu.run(side, ["sysctl", "-q", "-w", f"{key}={value}"])


def _read_sysctl(emu: Gateways, side: str, key: str) -> str:
    return emu.run(side, ["sysctl", "-n", key]).stdout.strip()


def tune_buffers(emu: Gateways, buffer: int) -> dict[str, Any]:
    """Raise tcp_rmem/tcp_wmem maxima in both gateways; return the settings in force."""
    settings: dict[str, Any] = {}
    for side in ("a", "b"):
        for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
            low, default, high = (int(v) for v in _read_sysctl(emu, side, key).split())
            _sysctl(emu, side, key, f"{low} {default} {max(high, 2 * buffer)}")
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.core.rmem_max",
                "net.core.wmem_max"):
        settings[key] = _read_sysctl(emu, "a", key)
    return settings


def source_routing(emu: Gateways, first_path: int) -> None:
    """On each gateway: traffic from path k's address leaves through path k (k != first)."""
    for k, path in enumerate(emu.paths, start=1):
        if k - 1 == first_path:
            continue
        for side, local, peer in (("a", path.a_addr, path.b_addr), ("b", path.b_addr, path.a_addr)):
            table = str(TABLE_BASE + k)
            emu.run(side, ["ip", "route", "replace", "default", "via", peer, "dev", path.ifname,
                           "table", table])
            rule = ["from", local, "table", table, "priority", str(RULE_PRIORITY)]
            emu.run(side, ["ip", "rule", "del", *rule], check=False)  # idempotent: runs may repeat
            emu.run(side, ["ip", "rule", "add", *rule])


def configure_mptcp(emu: Gateways, first_path: int) -> dict[str, Any]:
    """Enable MPTCP; each side may open one subflow per extra path as a client."""
    extra = min(MPTCP_MAX_SUBFLOWS, len(emu.paths) - 1)
    for side in ("a", "b"):
        _sysctl(emu, side, "net.mptcp.enabled", "1")
        emu.run(side, ["ip", "mptcp", "limits", "set", "subflow", str(extra),
                       "add_addr_accepted", str(extra)])
    endpoints: list[str] = []
    for k, path in enumerate(emu.paths):
        if k == first_path or len(endpoints) >= extra:
            continue
        for side, local in (("a", path.a_addr), ("b", path.b_addr)):
            emu.run(side, ["ip", "mptcp", "endpoint", "add", local, "dev", path.ifname,
                           "subflow"])
        endpoints.append(path.name)
    return {"subflow_limit": extra, "add_addr_accepted": extra,
            "subflow_endpoints": endpoints, "first_path": emu.paths[first_path].name,
            "scheduler": emu.run("a", ["sysctl", "-n", "net.mptcp.scheduler"],
                                    check=False).stdout.strip() or "default"}


# TcpExt counters (per namespace) that say a TCP baseline was held back by the host, not
# the path: memory pressure (net.ipv4.tcp_mem is one limit for the whole host), pruned or
# dropped receive queues.
HOST_LIMIT_COUNTERS = ("TCPMemoryPressures", "TCPMemoryPressuresChrono", "PruneCalled", "RcvPruned",
                       "OfoPruned", "TCPRcvQDrop", "TCPBacklogDrop", "TCPOFODrop", "TCPSlowStartRetrans",
                       "TCPLossProbes", "TCPTimeouts")


def tcp_counters(emu: Gateways) -> dict[str, dict[str, int]]:
    """Per gateway, the ``HOST_LIMIT_COUNTERS`` of its namespace's /proc/net/netstat now."""
    out = {}
    for side in ("a", "b"):
        lines = emu.run(side, ["cat", "/proc/net/netstat"]).stdout.splitlines()
        values: dict[str, int] = {}
        for names, numbers in zip(lines[::2], lines[1::2], strict=False):
            if names.startswith("TcpExt:"):
                values = dict(zip(names.split()[1:], (int(n) for n in numbers.split()[1:]), strict=False))
        out[side] = {k: values.get(k, 0) for k in HOST_LIMIT_COUNTERS}
    return out


def slow_start_after_idle_off(emu: Gateways) -> dict[str, str]:
    """``net.ipv4.tcp_slow_start_after_idle=0`` in both gateways: a connection that waited (for
    the next step, the next stripe) keeps its window instead of starting over from the
    initial one. Returns the setting as read back, per side."""
    for side in ("a", "b"):
        _sysctl(emu, side, "net.ipv4.tcp_slow_start_after_idle", "0")
    return {side: _read_sysctl(emu, side, "net.ipv4.tcp_slow_start_after_idle") for side in ("a", "b")}

