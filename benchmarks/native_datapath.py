"""Microbenchmark of the native data path, each number next to a baseline from the same run.

    PYTHONPATH=. .venv/bin/python benchmarks/native_datapath.py [--pps 100000] [--seconds 2]

Prints datagrams/s for sealing (build_data_datagrams vs the pure-Python
reference sealer), for open+place (Receiver.process vs the reference opener),
and the pacer's precision at a fixed packets-per-second target over loopback:
achieved rate and the p50/p99 error of inter-arrival gaps, from kernel receive
timestamps (SO_TIMESTAMPNS) on the receiving socket.
"""

from __future__ import annotations

import argparse
import select
import socket
import struct
import time
from collections.abc import Callable

import numpy as np

from wanxport.aio import native_io
from wanxport.wire import native
from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.frames import DataFrame
from wanxport.wire.protection import AeadProtection

KEY = bytes(range(32))
IV = bytes(12)
CONN = 7
PAYLOAD = 1400


def rate(fn: Callable[[], int], min_s: float = 0.5) -> float:
    """Datagrams per second of ``fn`` (which returns how many it handled), run for >= min_s."""
    fn()  # warm-up
    done, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_s:
        done += fn()
    return done / elapsed


def bench_seal(cipher: str, shard: bytes) -> tuple[float, float]:
    key = native.Protector(cipher, KEY, IV)
    n = len(shard) // PAYLOAD
    native_rate = rate(
        lambda: native.build_data_datagrams(key, CONN, 0, 0, 0, 1, shard, 0, len(shard), PAYLOAD).count
    )
    sealer = PacketSealer(CONN, {0: AeadProtection(cipher, KEY, IV)})
    view = memoryview(shard)

    def reference() -> int:
        for i in range(n // 8):
            sealer.seal(0, i, [DataFrame(1, i * PAYLOAD, PAYLOAD, view[i * PAYLOAD : (i + 1) * PAYLOAD])])
        return n // 8

    return native_rate, rate(reference)


def bench_open(cipher: str, shard: bytes) -> tuple[float, float]:
    key = native.Protector(cipher, KEY, IV)
    burst = native.build_data_datagrams(key, CONN, 0, 0, 0, 1, shard, 0, len(shard), PAYLOAD)
    batch = native.DatagramBatch.from_datagrams([burst.datagram(i) for i in range(burst.count)])
    dest = bytearray(len(shard))

    def run_native() -> int:
        # A fresh receiver per batch: the same packet numbers would otherwise be replays.
        rx = native.Receiver(CONN, 1)
        rx.set_key(0, key)
        rx.add_shard(1, dest)
        return len(rx.process(batch).records)

    datagrams = [bytes(burst.datagram(i)) for i in range(burst.count // 8)]

    def reference() -> int:
        opener = PacketOpener(CONN, 1, {0: AeadProtection(cipher, KEY, IV)})
        for dg in datagrams:
            opened = opener.open(dg)
            assert opened is not None
            frame = opened.frames[0]
            assert isinstance(frame, DataFrame) and frame.data is not None
            dest[frame.offset : frame.offset + frame.length] = frame.data
        return len(datagrams)

    return rate(run_native), rate(reference)


def bench_pacer(pps: float, seconds: float, gso: bool, burst_ns: int) -> dict[str, float | str]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    rx.setblocking(False)
    native_io.enable_timestamps(rx)
    tx.connect(rx.getsockname())
    tx.setblocking(False)
    n = int(pps * seconds)
    size = 1200
    payload = b"".join(struct.pack(">I", i) + bytes(size - 4) for i in range(n))
    stamps: list[np.ndarray] = []
    received = 0
    buf = bytearray(256 * 2048)
    with native_io.Pacer(1, capacity=n + 1, slot_size=size, gso=gso, burst_ns=burst_ns) as pacer:
        pacer.set_path(0, tx)
        pacer.set_pps(0, pps)
        if pacer.enqueue(0, payload, stride=size) != n:
            raise RuntimeError("pacer ring too small")
        deadline = time.monotonic() + seconds * 3 + 2
        while received < n and time.monotonic() < deadline:
            select.select([rx], [], [], 0.05)
            batch = native_io.recv_batch(rx, buf, 256)
            if batch.count:
                stamps.append(batch.table["rx_time_ns"].copy())
                received += batch.count
        pacer.wait_idle(1.0)
        name = pacer.name
        stats = pacer.stats()[0]
    rx.close()
    tx.close()
    ts = np.concatenate(stamps) if stamps else np.zeros(0, dtype=np.int64)
    gaps_us = np.diff(ts) / 1e3
    err_us = np.abs(gaps_us - 1e6 / pps)
    span = (ts[-1] - ts[0]) / 1e9 if len(ts) > 1 else float("nan")
    return {
        "name": name,
        "sent": stats.sent_datagrams,
        "received": received,
        "achieved_pps": (len(ts) - 1) / span,
        "gap_p50_us": float(np.percentile(gaps_us, 50)),
        "err_p50_us": float(np.percentile(err_us, 50)),
        "err_p99_us": float(np.percentile(err_us, 99)),
        "gso_sends": stats.gso_sends,
    }


def bench_python_sendto(seconds: float) -> float:
    """Baseline: a plain Python sendto loop, unpaced, same datagram size."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.connect(rx.getsockname())
    tx.setblocking(False)
    data = bytes(1200)
    sent, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            try:
                tx.send(data)
                sent += 1
            except BlockingIOError:
                pass
    elapsed = time.perf_counter() - t0
    rx.close()
    tx.close()
    return sent / elapsed


def bench_pacer_unpaced(seconds: float, gso: bool) -> float:
    """Unpaced pacer throughput (datagrams/s) into a socket nobody reads (drops in the kernel)."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.connect(rx.getsockname())
    tx.setblocking(False)
    size = 1200
    chunk = bytes(size * 4096)
    with native_io.Pacer(1, capacity=16384, slot_size=size, gso=gso, max_batch=256) as pacer:
        pacer.set_path(0, tx)
        t0 = time.perf_counter()
        offset = 0
        while time.perf_counter() - t0 < seconds:
            accepted = pacer.enqueue(0, memoryview(chunk)[offset * size :], stride=size)
            offset = (offset + accepted) % 4096
            if accepted == 0:
                time.sleep(0.0005)
        pacer.wait_idle(5.0)
        elapsed = time.perf_counter() - t0
        sent = pacer.stats()[0].sent_datagrams
    rx.close()
    tx.close()
    return sent / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pps", type=float, default=100_000.0, help="pacer precision target")
    parser.add_argument("--seconds", type=float, default=2.0, help="pacer precision run length")
    parser.add_argument(
        "--burst-us",
        type=float,
        action="append",
        help="pacer burst window(s): datagrams due within it leave together (default: 0 and 50)",
    )
    args = parser.parse_args()
    if not native.NATIVE_AVAILABLE:
        raise SystemExit(native.import_error)
    shard = bytes(range(256)) * (PAYLOAD * 256 // 256)  # 256 datagrams of 1400 B
    print(f"payload {PAYLOAD} B per datagram; rates in datagrams/s")
    for cipher in ("aes-256-gcm", "chacha20-poly1305"):
        seal_n, seal_py = bench_seal(cipher, shard)
        open_n, open_py = bench_open(cipher, shard)
        print(
            f"{cipher:18s} seal native {seal_n:>10,.0f}  reference {seal_py:>9,.0f}  x{seal_n / seal_py:.1f}"
        )
        print(
            f"{cipher:18s} open+place native {open_n:>10,.0f}  reference {open_py:>9,.0f}"
            f"  x{open_n / open_py:.1f}"
        )
    print(f"python sendto loop (baseline, unpaced): {bench_python_sendto(1.0):,.0f}")
    for gso in (True, False):
        print(f"pacer unpaced gso={gso}: {bench_pacer_unpaced(1.0, gso):,.0f}")
    for burst_us in args.burst_us or [0.0, 50.0]:
        for gso in (True, False):
            r = bench_pacer(args.pps, args.seconds, gso, int(burst_us * 1000))
            print(
                f"pacer {r['name']} burst {burst_us:g} us, target {args.pps:,.0f} pps: "
                f"achieved {r['achieved_pps']:,.0f} pps, "
                f"received {r['received']}/{r['sent']}, gap p50 {r['gap_p50_us']:.2f} us, "
                f"|gap error| p50 {r['err_p50_us']:.2f} us p99 {r['err_p99_us']:.2f} us, "
                f"gso sends {r['gso_sends']}"
            )


if __name__ == "__main__":
    main()
