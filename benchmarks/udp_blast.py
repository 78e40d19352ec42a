"""A UDP load generator and sink that cost far less CPU per datagram than iperf3.

    python benchmarks/udp_blast.py sink ADDR PORT SECONDS      # prints {"datagrams", "bytes", "span_s"}
    python benchmarks/udp_blast.py send ADDR PORT SECONDS RATE_MBPS

Why: on a 2-core machine iperf3's one-system-call-per-datagram sender and
receiver take most of the CPU that the impairment engine under test needs, so
a forwarding benchmark driven by iperf3 measures iperf3. The sender here is
wanxport's native pacer (its own thread, ``sendmmsg`` batches, no GSO so every
datagram is a real 1500-byte frame on the veth), paced at ``RATE_MBPS`` of
UDP payload; the sink drains with ``recvmmsg`` and counts.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import time

import numpy as np

from wanxport.aio import native_io
from wanxport.aio.sockets import set_buffers

DATAGRAM = 1472  # a full 1500-byte IPv4 frame
RING = 16384
SLOTS = 1024


def sink(addr: str, port: int, seconds: float) -> dict[str, float]:
    """Count what arrives during ``seconds``; the span runs from the first to the last
    datagram's kernel receive time, so start-up and idle time do not dilute the rate."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((addr, port))
    set_buffers(sock, recv_bytes=32 << 20)
    sock.setblocking(False)
    native_io.enable_timestamps(sock)
    print("listening", flush=True)
    buf = bytearray(SLOTS * 2048)
    datagrams = total = 0
    first = last = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        select.select([sock], [], [], 0.05)
        while (batch := native_io.recv_batch(sock, buf, SLOTS)).count:
            table = batch.table
            datagrams += batch.count
            total += int(table["length"].sum())
            first = first or int(table["rx_time_ns"][0])
            last = int(table["rx_time_ns"][-1])
    sock.close()
    return {"datagrams": datagrams, "bytes": total, "span_s": (last - first) / 1e9 if last else 0.0}


def send(addr: str, port: int, seconds: float, rate_mbps: float) -> dict[str, float]:
    """Offer ``rate_mbps`` of UDP payload for ``seconds`` through the native pacer."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.connect((addr, port))
    set_buffers(sock, send_bytes=8 << 20)
    sock.setblocking(False)
    block = np.zeros(RING * DATAGRAM, dtype=np.uint8)
    queued = 0
    with native_io.Pacer(1, capacity=RING, gso=False) as pacer:
        pacer.set_path(0, sock)
        pacer.set_rate(0, rate_mbps * 125_000.0)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            queued += pacer.enqueue(0, block, stride=DATAGRAM)
            time.sleep(0.002)
        stats = pacer.stats()[0]
    sock.close()
    return {"queued": queued, "sent_datagrams": stats.sent_datagrams, "send_errors": stats.send_errors}


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[0] not in ("sink", "send") or (argv[0] == "send" and len(argv) != 5):
        print("usage: udp_blast.py sink ADDR PORT SECONDS | send ADDR PORT SECONDS RATE_MBPS",
              file=sys.stderr)
        return 2
    addr, port, seconds = argv[1], int(argv[2]), float(argv[3])
    result = sink(addr, port, seconds) if argv[0] == "sink" else send(addr, port, seconds, float(argv[4]))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
