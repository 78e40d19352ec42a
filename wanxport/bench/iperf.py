"""The baseline measured in the same run: ``iperf3 -u`` over loopback.

Loopback numbers swing with whatever else the machine does, so a goodput
only means something next to a baseline taken minutes apart, not a number
from a README.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from dataclasses import dataclass

DATAGRAM_BYTES = 1472  # 1500-byte MTU minus IPv4 and UDP headers
WINDOW = "4M"  # socket buffers as large as net.core.rmem_max allows here, as ours are large


@dataclass(frozen=True)
class IperfResult:
    received_bps: float  # what reached the iperf3 server: the comparable number
    sent_bps: float
    lost_percent: float


def iperf3_available() -> bool:
    return shutil.which("iperf3") is not None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_iperf3_udp(duration_s: float = 3.0, length: int = DATAGRAM_BYTES) -> IperfResult:
    """One unthrottled UDP test (``-b 0``) against a one-shot server on 127.0.0.1."""
    port = _free_port()
    server = subprocess.Popen(["iperf3", "-s", "-1", "--forceflush", "-p", str(port), "-B", "127.0.0.1"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        for line in server.stdout:  # start the client once the server says it listens
            if "listening" in line:
                break
        else:
            raise RuntimeError("iperf3 server exited before listening")
        proc = subprocess.run(
            ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-u", "-b", "0", "-l", str(length),
             "-t", str(duration_s), "-w", WINDOW, "-J"],
            capture_output=True, text=True, timeout=duration_s + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"iperf3 failed: {(proc.stderr or proc.stdout).strip()[:200]}")
        end = json.loads(proc.stdout)["end"]
        received = end.get("sum_received", {}).get("bits_per_second")
        total = end["sum"]
        return IperfResult(float(received if received is not None else total["bits_per_second"]),
                           float(end.get("sum_sent", total)["bits_per_second"]),
                           float(total.get("lost_percent", 0.0)))
    finally:
        server.kill()
        server.wait()
