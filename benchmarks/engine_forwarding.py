"""Engine forwarding benchmark: throughput through the engine and its CPU cost per Gb/s.

    sudo .venv/bin/python benchmarks/engine_forwarding.py [--seconds 5] [--json]

One path with a 10 Gb/s bottleneck (so the engine, not the emulated link, is
the limit), 1 ms RTT, 1500-byte MTU. Three loads from gateway a to b:
``udp-native`` (benchmarks/udp_blast.py: wanxport's native pacer sending
1472-byte datagrams with sendmmsg at --offer Mb/s, a recvmmsg sink: little CPU
per datagram, so the engine gets a core), then iperf3 UDP (offered at 3 Gb/s)
and iperf3 TCP for reference. The rate is what the engine forwarded (its own
counters, frame bytes, over the load's duration) with what the receiver got;
the engine's CPU time comes from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulation.api import Emulation  # noqa: E402
from wanxport.scenario import parse_scenario  # noqa: E402

SCENARIO = """
name = "bench-engine"
[[paths]]
name = "fast"
rtt_ms = 1.0
bandwidth_mbps = 10000.0
queue_ms = 5.0
"""
CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` and all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def iperf(emu: Emulation, addr: str, seconds: float, udp: bool) -> float:
    """Receiver-side bits per second of one iperf3 run a -> b."""
    server = emu.popen("b", ["iperf3", "-s", "-1", "--forceflush", "-B", addr],
                       stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        for _ in range(2):
            if "listening" in server.stdout.readline().lower():
                break
        argv = ["iperf3", "-c", addr, "-t", str(seconds), "--json"]
        if udp:
            argv += ["-u", "-b", "3000M", "-l", "1472"]
        out = emu.run("a", argv, timeout=seconds + 30).stdout
    finally:
        server.wait(timeout=10)
    return float(json.loads(out)["end"]["sum_received"]["bits_per_second"])


def blast(emu: Emulation, addr: str, seconds: float, offer_mbps: float) -> float:
    """Receiver-side bits per second of one udp_blast run a -> b."""
    script = str(Path(__file__).resolve().parent / "udp_blast.py")
    sink = emu.popen("b", [sys.executable, script, "sink", addr, "5201", str(seconds + 3)],
                     stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout is not None
        sink.stdout.readline()  # "listening"
        emu.run("a", [sys.executable, script, "send", addr, "5201", str(seconds), str(offer_mbps)],
                timeout=seconds + 30)
        result = json.loads(sink.stdout.readline())
    finally:
        sink.wait(timeout=30)
    return result["bytes"] * 8 / result["span_s"] if result["span_s"] > 0 else 0.0


def engine_pid(emu: Emulation) -> int:
    return int(Path(f"{emu.plan.state_dir}/engine.pid").read_text())


def forwarded_bytes(emu: Emulation) -> int:
    """The engine's a->b transmitted bytes."""
    return int(emu.counters()["fast"]["a->b"]["tx_bytes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--offer", type=float, default=2000.0,
                        help="Mb/s of UDP payload the native load offers (default 2000)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"mtu": 1500}
    with Emulation(parse_scenario(SCENARIO), backend="engine") as emu:
        addr = emu.paths[0].b_addr
        pid = engine_pid(emu)
        loads = {"udp-native": lambda: blast(emu, addr, args.seconds, args.offer),
                 "udp": lambda: iperf(emu, addr, args.seconds, True),
                 "tcp": lambda: iperf(emu, addr, args.seconds, False)}
        for kind, load in loads.items():
            bytes0 = forwarded_bytes(emu)
            cpu0 = cpu_seconds(pid)
            received_bps = load()
            gbit = (forwarded_bytes(emu) - bytes0) * 8 / 1e9
            cpu_s = cpu_seconds(pid) - cpu0
            # CPU seconds per Gbit forwarded = cores per Gb/s, whatever idle time the
            # load's start-up and wind-down add around the timed window.
            per_gbps = cpu_s / gbit if gbit else None
            gbps = gbit / args.seconds
            results[kind] = {
                "engine_gbps": gbps,
                "received_gbps": received_bps / 1e9,
                "engine_cores_per_gbps": per_gbps,
                "engine_cores": per_gbps * gbps if per_gbps else 0.0,
            }
    if args.json:
        print(json.dumps(results))
    else:
        for kind in ("udp-native", "udp", "tcp"):
            r = results[kind]
            print(f"{kind}: engine forwarded {r['engine_gbps']:.2f} Gb/s (receiver "
                  f"{r['received_gbps']:.2f} Gb/s); engine CPU {r['engine_cores']:.2f} "
                  f"cores = {r['engine_cores_per_gbps']:.2f} cores per Gb/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
