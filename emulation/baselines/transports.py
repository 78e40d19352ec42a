"""What each baseline launches, and how its programs' reports become per-path numbers.

The four baselines differ in which paths they use and how: ``tcp`` one
connection on the best path; ``tcp-parallel`` one connection per path with the
payload split evenly; ``mptcp`` one MPTCP connection starting on the best path
with a subflow per extra path; ``aioquic`` one QUIC connection on the best path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from emulation.api import PathInfo
from emulation.baselines import payload

BASELINES = ("tcp", "tcp-parallel", "mptcp", "aioquic")
# Path k of a direction uses UDP port WANXPORT_PORT_BASE + direction.port + k at both ends:
# consecutive ports, one per path (as a gateway's --listen). The other direction's
# ports are one higher, so on any one path (one address per end) they never meet.
WANXPORT_PORT_BASE = 6000
TCP_BASED = ("tcp", "tcp-parallel", "mptcp")
QUIC_HEADROOM = 28  # IPv4 + UDP headers inside the MTU


@dataclass(frozen=True)
class Direction:
    """One direction of a transfer: who sends, who receives, on which port."""

    sender: str  # "a" | "b"
    receiver: str
    port: int

    @property
    def name(self) -> str:
        return f"{self.sender}->{self.receiver}"

    def src(self, path: PathInfo) -> str:
        return path.a_addr if self.sender == "a" else path.b_addr

    def dst(self, path: PathInfo) -> str:
        return path.b_addr if self.sender == "a" else path.a_addr


@dataclass(frozen=True)
class Launch:
    """The module both programs run and their JSON specs."""

    module: str
    receiver: dict[str, Any]
    sender: dict[str, Any]


def paths_used(transport: str, best: int, count: int) -> list[int]:
    """Path indexes a baseline sends on."""
    return list(range(count)) if transport in ("tcp-parallel", "mptcp", "wanxport") else [best]


def launch(transport: str, paths: list[PathInfo], best: int, direction: Direction, *,
           seed: int, size: int, cc: str | None, buffer: int, mtu: int, shards: int = 1,
           pki: str | None = None, steps: int = 1, think_ms: float = 0.0,
           fec: str = "auto") -> Launch:
    """The receiver's and sender's specs for one direction of ``transport``.

    ``steps`` > 1 repeats the transfer on the same session or connections
    (not aioquic's: the runner refuses that combination). ``pki`` (wanxport): the
    run's certificate directory, ``ca.pem`` and one identity per site named by the site.
    """
    stepping = {"steps": steps, "think_ms": think_ms}
    if transport == "wanxport":
        def side(sender: bool) -> dict[str, Any]:
            return {"cc": cc, "fec": fec, "seed": seed, "size": size, "shards": shards, "pki": pki,
                    "names": {"sender": direction.sender, "receiver": direction.receiver}, **stepping,
                    "paths": [{"name": p.name, "mtu": mtu, "device": p.ifname,
                               "port": WANXPORT_PORT_BASE + direction.port + k,
                               "local": direction.src(p) if sender else direction.dst(p),
                               "remote": direction.dst(p) if sender else direction.src(p)}
                              for k, p in enumerate(paths)]}

        return Launch("emulation.baselines.wanxport_app", side(False), side(True))
    if transport == "aioquic":
        path = paths[best]
        common = {"port": direction.port, "window": buffer, "datagram": mtu - QUIC_HEADROOM,
                  "cc": cc}
        return Launch("emulation.baselines.quic_app",
                      {**common, "cert_prefix": f"/tmp/wx-baseline-{direction.port}"},
                      {**common, "dst": direction.dst(path), "seed": seed, "size": size})
    used = paths_used(transport, best, len(paths))
    if transport == "tcp-parallel":
        conn_paths = used
        slices = payload.split(size, len(used))
    else:
        conn_paths, slices = [best], [(0, size)]
    proto = "mptcp" if transport == "mptcp" else "tcp"
    conns = [{"src": direction.src(paths[k]), "dst": direction.dst(paths[k]),
              "port": direction.port, "offset": off, "length": length}
             for k, (off, length) in zip(conn_paths, slices, strict=True)]
    return Launch("emulation.baselines.tcp_app",
                  {"proto": proto, "port": direction.port, "connections": len(conns),
                   "size": size, "cc": cc, "rcvbuf": buffer, **stepping},
                  {"proto": proto, "cc": cc, "sndbuf": buffer, "rcvbuf": None, "seed": seed,
                   "conns": conns, **stepping})


@dataclass
class PathStats:
    """What one direction of a baseline carried on one path."""

    payload_bytes: int = 0
    retransmitted_bytes: int = 0
    repair_bytes: int = 0  # wanxport's erasure-code repair symbols
    srtt_s: float | None = None
    used: bool = False
    state: str | None = None  # the transport's own path state, when it has one
    active_s: float = 0.0  # seconds the path's connection had payload not yet acknowledged


def path_stats(transport: str, paths: list[PathInfo], best: int, direction: Direction,
               sent: dict[str, Any], received: dict[str, Any]) -> list[PathStats]:
    """Per-path numbers from the sender's and receiver's final reports."""
    stats = [PathStats() for _ in paths]
    if transport == "wanxport":
        for stat, p in zip(stats, sent.get("paths", []), strict=False):
            stat.used, stat.state, stat.srtt_s = True, p["state"], p["srtt_s"]
            stat.payload_bytes, stat.retransmitted_bytes = p["payload_bytes"], p["retransmitted_bytes"]
            stat.repair_bytes = p.get("repair_bytes", 0)
        return stats
    by_src = {direction.src(p): k for k, p in enumerate(paths)}
    if transport == "mptcp" and sent.get("subflows"):
        # A subflow has data only when MPTCP's scheduler gives it some: while the one
        # connection waits on its slower subflows (its send buffer full of data in flight
        # there), a clean fast subflow sits empty. Charging it the connection's whole
        # active time would blame the path for the scheduler's choice, so each subflow is
        # judged over its own tcpi_busy_time (the connection's time where the kernel has none).
        active = float(sent["slices"][0].get("active_s", 0.0)) if sent.get("slices") else 0.0
        for sub in sent["subflows"]:
            k = by_src.get(sub.get("local") or "")
            if k is not None:
                busy_us = sub.get("busy_time_us")
                _fill(stats[k], sub.get("bytes_acked", 0), sub, busy_us / 1e6 if busy_us else active)
        return stats
    # "carried": every step's bytes on that connection (one step's without it).
    received_by_offset = {s["offset"]: s.get("carried", s["received"]) for s in received.get("slices", [])}
    for s in sent.get("slices", []):
        k = by_src.get(s.get("src") or "", best)
        info = s.get("info", {})
        # The kernel's own clock of the time the connection had data queued or in flight
        # (tcpi_busy_time); the sender's count, to the receiver's byte, where it has none.
        busy_us = info.get("busy_time_us")
        _fill(stats[k], received_by_offset.get(s["offset"], 0), info,
              busy_us / 1e6 if busy_us else float(s.get("active_s", 0.0)))
    return stats


def _fill(stat: PathStats, carried: int, info: dict[str, Any], active_s: float) -> None:
    stat.used = True
    stat.active_s = max(stat.active_s, active_s)
    stat.payload_bytes += int(carried)
    stat.retransmitted_bytes += int(info.get("bytes_retrans", info.get("lost_bytes", 0)))
    if info.get("rtt_us"):
        stat.srtt_s = info["rtt_us"] / 1e6
