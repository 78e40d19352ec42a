"""Engine forwarding benchmark: throughput through the engine and its CPU cost per Gb/s.

    sudo .venv/bin/python benchmarks/engine_forwarding.py [--seconds 5] [--json]

One path with a 10 Gb/s bottleneck (so the engine, not the emulated link, is
the limit), 1 ms RTT, 1500-byte MTU. iperf3 sends UDP (1472-byte datagrams,
full 1500-byte frames, offered at 3 Gb/s) and TCP from gateway a to b. The
rate is what the engine forwarded (its own counters, frame bytes), because on a
2-core machine the iperf3 receiver, not the engine, drops first; the engine's
CPU time comes from /proc. Both are reported with iperf3's receiver rate.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulation.api import Emulation  # noqa: E402
from wanxport.sim.scenario import parse_scenario  # noqa: E402

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


def engine_pid(emu: Emulation) -> int:
    return int(Path(f"{emu.plan.state_dir}/engine.pid").read_text())


def forwarded_bytes(emu: Emulation, pid: int) -> int:
    """The engine's a->b transmitted bytes (asks the daemon to write its counters)."""
    stats = Path(emu.stats_path())
    before = stats.stat().st_mtime_ns if stats.exists() else 0
    os.kill(pid, signal.SIGUSR2)
    while not stats.exists() or stats.stat().st_mtime_ns == before:
        time.sleep(0.01)  # a benchmark, not a test: a short poll is fine here
    return int(json.loads(stats.read_text())["fast"]["a->b"]["tx_bytes"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {"mtu": 1500}
    with Emulation(parse_scenario(SCENARIO), backend="engine") as emu:
        addr = emu.paths[0].b_addr
        pid = engine_pid(emu)
        for kind, udp in (("udp", True), ("tcp", False)):
            bytes0 = forwarded_bytes(emu, pid)
            cpu0, t0 = cpu_seconds(pid), time.monotonic()
            received_bps = iperf(emu, addr, args.seconds, udp)
            elapsed = time.monotonic() - t0
            cores = (cpu_seconds(pid) - cpu0) / elapsed
            gbps = (forwarded_bytes(emu, pid) - bytes0) * 8 / args.seconds / 1e9
            results[kind] = {
                "engine_gbps": gbps,
                "iperf3_received_gbps": received_bps / 1e9,
                "engine_cores": cores,
                "engine_cores_per_gbps": cores / gbps if gbps else None,
            }
    if args.json:
        print(json.dumps(results))
    else:
        for kind in ("udp", "tcp"):
            r = results[kind]
            print(f"{kind}: engine forwarded {r['engine_gbps']:.2f} Gb/s (iperf3 receiver "
                  f"{r['iperf3_received_gbps']:.2f} Gb/s); engine CPU {r['engine_cores']:.2f} "
                  f"cores = {r['engine_cores_per_gbps']:.2f} cores per Gb/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
