"""One end of the native data path at a time, against a C source or sink, with N workers.

    flock /tmp/wanxport-tests.lock .venv/bin/python benchmarks/workers.py series --runs 3 --json

Why one end: both ends of a loopback transfer share this 2-core host, so a
second worker at one end would take its core from the other end. Here the
measured end runs alone in this process; the other end is a C program in a
child process (``wanxport_lab._limits``) that costs ~0.15 CPU-s/GB:

* ``send``: the data path's sending half (``NativeDatapath.send``: seal in C,
  pacer ring, the pacer's GSO sendmmsg) is fed 64-datagram data plans over all
  paths, unpaced (the rate is set far above the host's), as the core hands
  them out; the sink is ``udp_blast_sink``, one thread per path;
* ``recv``: the receiving half (recvmmsg, open, replay check, placement into
  pre-touched shard buffers, runs folded, handed to the loop) takes sealed DATA
  that the child sealed before the clock started and now sends once with GSO
  (``udp_replay_send``), one thread per path, as fast as loopback takes it.

What is NOT in it: the core (``Session``: per core packet and per ACK Python,
on the loop's thread whatever the worker count) and the shard digest. Those
are the serial fraction; the loopback bench combines both.
CPU is this process's getrusage (all threads) over the transfer; GB = 10**9
payload bytes. ``series`` runs the variants in turn (A B A B ...).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np

from wanxport.aio.config import DirectionKey
from wanxport.aio.datapath import Received
from wanxport.aio.native_path import NativeDatapath
from wanxport.aio.plan import DataPlan, Plan
from wanxport.aio.sockets import set_buffers
from wanxport.core.config import PathConfig, datagram_payload
from wanxport.wire import native

GB = 1e9
KEY = DirectionKey("aes-256-gcm", bytes(range(32)), bytes(range(12)))
CONN = 7
UNPACED_BYTES_PER_S = 100e9  # far above anything this host sends: the ring and sockets decide
PLANS_PER_CALL = 8  # what one core poll hands out at a few Gb/s
RECV_BUFFER = 64 << 20


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _segment(mtu: int) -> int:
    """DATA bytes per full datagram at this MTU (the core's own rule)."""
    return datagram_payload(PathConfig("p", mtu), 16)


def _child(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, role, *args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)


# -- the C ends (child processes) --------------------------------------------


def sink_main(paths: int, timeout_s: float) -> None:
    """Bind one socket per path, print the ports, drain them in C until idle; print totals."""
    from wanxport_lab import _limits  # type: ignore[attr-defined]

    socks = []
    for _ in range(paths):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_buffers(sock, RECV_BUFFER)
        sock.bind(("127.0.0.1", 0))
        socks.append(sock)
    print(json.dumps([s.getsockname()[1] for s in socks]), flush=True)
    results: list[Any] = [None] * paths

    def drain(i: int) -> None:
        results[i] = _limits.udp_blast_sink(socks[i].fileno(), 1.0, timeout_s)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"bytes": sum(r[1] for r in results), "cpu_s": sum(r[2] for r in results)}),
          flush=True)


def source_main(size: int, mtu: int, ports: list[int]) -> None:
    """Seal each path's share as one burst (before the clock), then on "go" send it once."""
    from wanxport_lab import _limits  # type: ignore[attr-defined]

    paths = len(ports)
    share = size // paths
    data = np.frombuffer(np.random.default_rng(1).bytes(share), dtype=np.uint8)
    seal = native.Protector(KEY.cipher, KEY.key, KEY.iv)
    bursts = [native.build_data_datagrams(seal, CONN, p, 0, 0, p, data, 0, share, _segment(mtu))
              for p in range(paths)]
    socks = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.connect(("127.0.0.1", port))
        socks.append(sock)
    print(json.dumps({"ready": True}), flush=True)
    sys.stdin.readline()
    results: list[Any] = [None] * paths

    def send(i: int) -> None:
        results[i] = _limits.udp_replay_send(socks[i].fileno(), bursts[i].buffer, bursts[i].stride)

    threads = [threading.Thread(target=send, args=(i,)) for i in range(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps({"datagrams": sum(r[0] for r in results), "cpu_s": sum(r[2] for r in results),
                      "wall_s": max(r[3] for r in results)}), flush=True)


# -- the measured end --------------------------------------------------------


async def measure_send(size: int, paths: int, workers: int, mtu: int, segments: int) -> dict[str, Any]:
    sink = _child("_sink", str(paths), "120")
    assert sink.stdout is not None
    ports = json.loads(sink.stdout.readline())
    socks = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_buffers(sock, None, 8 << 20)
        sock.connect(("127.0.0.1", port))
        sock.setblocking(False)
        socks.append(sock)
    buffer = np.empty(size, dtype=np.uint8)
    buffer.fill(1)  # resident: a training step sends from tensors it owns
    view = memoryview(buffer)  # type: ignore[arg-type]
    segment = _segment(mtu)
    chunk = segment * segments
    dp = NativeDatapath(socks, KEY, KEY, CONN, CONN, slot_size=2048, capacity=8192, spin_ns=0,
                        burst_ns=500_000, workers=workers)
    loop = asyncio.get_running_loop()
    dp.start(loop, lambda items: None)
    for p in range(paths):
        dp.attach(p)
        dp.set_rate(p, UNPACED_BYTES_PER_S)
    pns = [0] * paths
    cpu0, t0, loop0 = _cpu_s(), time.monotonic(), time.thread_time()
    offset, p = 0, 0
    while offset < size:
        if dp.backlogged:
            dp.flush()
            await asyncio.sleep(0.0002)
            continue
        plans: list[Plan] = []
        while offset < size and len(plans) < PLANS_PER_CALL:
            length = min(chunk, size - offset)
            plans.append(DataPlan(p, pns[p], p, view, offset, length, segment, 0.0))
            pns[p] += -(-length // segment)
            offset += length
            p = (p + 1) % paths
        dp.send(plans)
    while dp.backlogged:
        dp.flush()
        await asyncio.sleep(0.0002)
    shares = dp.shares
    loop_cpu = time.thread_time() - loop0
    dp.close(drain_s=120.0)
    wall, cpu = time.monotonic() - t0, _cpu_s() - cpu0
    for sock in socks:
        sock.close()
    out, _ = sink.communicate(timeout=180)
    got = json.loads(out.strip().splitlines()[-1])
    return {"end": "send", "workers": workers, "paths": paths, "mtu": mtu, "segments": segments,
            "bytes": size, "sink_bytes": got["bytes"], "wall_s": round(wall, 3),
            "goodput_gbps": round(size * 8 / wall / 1e9, 3), "cpu_s": round(cpu, 3),
            "cpu_s_per_gb": round(cpu / (size / GB), 3), "cores_busy": round(cpu / wall, 2),
            "loop_cpu_s_per_gb": round(loop_cpu / (size / GB), 3), "shares": shares,
            "loadavg": [round(x, 2) for x in os.getloadavg()]}


async def measure_recv(size: int, paths: int, workers: int, mtu: int) -> dict[str, Any]:
    socks = []
    for _ in range(paths):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        set_buffers(sock, RECV_BUFFER)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        socks.append(sock)
    source = _child("_source", str(size), str(mtu), *[str(s.getsockname()[1]) for s in socks])
    assert source.stdout is not None and source.stdin is not None
    share = size // paths
    dest = np.empty(share * paths, dtype=np.uint8)
    dest.fill(0)  # resident, as a training step's gradient buffers are
    dp = NativeDatapath(socks, KEY, KEY, CONN, CONN, slot_size=2048, capacity=8192, spin_ns=0,
                        burst_ns=500_000, workers=workers)
    for p in range(paths):
        dp.add_shard(p, memoryview(dest[p * share:(p + 1) * share]))  # type: ignore[arg-type]
    got = {"bytes": 0, "first": 0.0, "last": 0.0}
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def absorb(received: Received) -> None:
        placed = sum(run[5] for run in received.runs)
        if placed:
            now = time.monotonic()
            got["first"] = got["first"] or now
            got["last"] = now
            got["bytes"] += placed
            if got["bytes"] >= share * paths and not done.done():
                done.set_result(None)

    def drain(path_id: int) -> None:  # inline: the loop reads the socket itself
        absorb(dp.receive(path_id))

    def deliver(items: list[tuple[int, Received]]) -> None:
        for _, received in items:
            absorb(received)

    json.loads(source.stdout.readline())  # sealed and connected
    dp.start(loop, deliver)
    if not dp.threaded:
        for p, sock in enumerate(socks):
            loop.add_reader(sock.fileno(), functools.partial(drain, p))
    cpu0, loop0 = _cpu_s(), time.thread_time()
    source.stdin.write("go\n")
    source.stdin.flush()
    while not done.done():  # all placed, or idle for a second after the first byte
        await asyncio.wait([done], timeout=0.1)
        if got["last"] and time.monotonic() - got["last"] > 1.0:
            break
    cpu, loop_cpu = _cpu_s() - cpu0, time.thread_time() - loop0
    for sock in socks:
        if not dp.threaded:
            loop.remove_reader(sock.fileno())
    shares, counters = dp.shares, dp.counters
    dp.close(drain_s=0.0)
    out, _ = source.communicate(timeout=60)
    sent = json.loads(out.strip().splitlines()[-1])
    for sock in socks:
        sock.close()
    span = max(got["last"] - got["first"], 1e-9)
    placed = got["bytes"]
    return {"end": "recv", "workers": workers, "paths": paths, "mtu": mtu, "bytes": size,
            "placed_bytes": placed, "kernel_drops": counters.get("rejected_kernel_overflow", 0),
            "span_s": round(span, 3), "goodput_gbps": round(placed * 8 / span / 1e9, 3),
            "cpu_s": round(cpu, 3), "cpu_s_per_gb": round(cpu / max(placed / GB, 1e-9), 3),
            "cores_busy": round(cpu / span, 2),
            "loop_cpu_s_per_gb": round(loop_cpu / max(placed / GB, 1e-9), 3),
            "source_wall_s": round(sent["wall_s"], 3),
            "shares": shares, "loadavg": [round(x, 2) for x in os.getloadavg()]}


def run_one(end: str, size: int, paths: int, workers: int, mtu: int, segments: int) -> dict[str, Any]:
    if end == "send":
        return asyncio.run(measure_send(size, paths, workers, mtu, segments))
    return asyncio.run(measure_recv(size, paths, workers, mtu))


def _size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_sink":
        sink_main(int(sys.argv[2]), float(sys.argv[3]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "_source":
        source_main(int(sys.argv[2]), int(sys.argv[3]), [int(p) for p in sys.argv[4:]])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("end", choices=("send", "recv", "series"))
    parser.add_argument("--workers", type=int, default=1, help="send/recv: worker threads")
    parser.add_argument("--counts", default="1,2", help="series: worker counts to compare")
    parser.add_argument("--runs", type=int, default=3, help="series: rounds of every variant")
    parser.add_argument("--size", type=_size, default=1 << 30)
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--mtu", type=int, default=1500)
    parser.add_argument("--segments", type=int, default=64)
    parser.add_argument("--out", help="append every report here (JSON lines)")
    args = parser.parse_args()
    variants = ([(end, int(n)) for _ in range(args.runs) for end in ("send", "recv")
                 for n in args.counts.split(",")] if args.end == "series" else [(args.end, args.workers)])
    reports = []
    for end, n in variants:
        report = run_one(end, args.size, args.paths, n, args.mtu, args.segments)
        reports.append(report)
        line = json.dumps(report, separators=(",", ":"))
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")
    if args.end == "series":
        for end in ("send", "recv"):
            for n in sorted({n for _, n in variants}):
                rs = [r for r in reports if r["end"] == end and r["workers"] == n]
                print(f"# {end} workers={n}: goodput median "
                      f"{statistics.median(r['goodput_gbps'] for r in rs)} Gb/s, CPU-s/GB median "
                      f"{statistics.median(r['cpu_s_per_gb'] for r in rs)}, cores busy "
                      f"{statistics.median(r['cores_busy'] for r in rs)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
