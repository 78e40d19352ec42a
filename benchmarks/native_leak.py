"""Native memory per shard: loops against the C data path with Python's allocations excluded.

``benchmarks/leak.py`` measures two whole daemons; this isolates the native parts a
long-running gateway creates and drops per session and per shard, each in its own
loop, and reports RssAnon growth per 1000 shards minus what Python's allocators hold
(tracemalloc's traced total), i.e. what C code (or glibc's arenas) kept:

- ``receiver``: per session a ``Receiver`` with its key; per shard ``add_shard``, one
  batch of sealed datagrams covering it, ``remove_shard``;
- ``pacer``: per session a ``Pacer`` (its thread and per-path rings) on a loopback
  socket; per shard its datagrams enqueued and released, ``wait_idle``; ``close``;
- ``fec``: per shard a Reed-Solomon block encoded and decoded with symbols missing.

    .venv/bin/python benchmarks/native_leak.py --sessions 50 --shards 40
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import tracemalloc
from collections.abc import Callable
from pathlib import Path

from wanxport import _fec
from wanxport.aio.native_io import Pacer
from wanxport.wire import native

KEY, IV, CONN = bytes(range(32)), bytes(12), 0x10203040
SHARD_BYTES, PAYLOAD = 64 << 10, 1200


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def python_kib() -> float:
    """What Python's allocators hold, plus tracemalloc's own tables (not the C code's)."""
    return (tracemalloc.get_traced_memory()[0] + tracemalloc.get_tracemalloc_memory()) / 1024


def receiver_session(shards: int, first: int) -> None:
    protector = native.Protector("aes-256-gcm", KEY, IV)
    rx = native.Receiver(CONN, 2)
    rx.set_key(0, protector)
    data = os.urandom(SHARD_BYTES)
    for k in range(shards):
        shard_id = first + k
        buf = bytearray(SHARD_BYTES)
        rx.add_shard(shard_id, buf)
        burst = native.build_data_datagrams(protector, CONN, k % 2, k * 64, 0, shard_id, data, 0,
                                            SHARD_BYTES, PAYLOAD)
        rx.process(native.DatagramBatch.from_datagrams([burst.datagram(i) for i in range(burst.count)]))
        if not rx.is_complete(shard_id) or buf != data:
            raise RuntimeError(f"shard {shard_id} not placed whole")
        rx.remove_shard(shard_id)


def pacer_session(shards: int, first: int) -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    out.connect(sink.getsockname())
    sink.setblocking(False)
    protector = native.Protector("aes-256-gcm", KEY, IV)
    data = os.urandom(SHARD_BYTES)
    pacer = Pacer(1, capacity=256)
    try:
        pacer.set_path(0, out)
        pacer.set_rate(0, 1e10)
        for k in range(shards):
            burst = native.build_data_datagrams(protector, CONN, 0, k * 64, 0, first + k, data, 0,
                                                SHARD_BYTES, PAYLOAD)
            sent = 0
            while sent < burst.count:
                sent += pacer.enqueue_burst(0, burst, sent)
                pacer.wait_idle(1.0)
                _drain(sink)
    finally:
        pacer.close()
        out.close()
        sink.close()


def _drain(sock: socket.socket) -> None:
    try:
        while True:
            sock.recv(4096)
    except BlockingIOError:
        pass


def fec_session(shards: int, first: int) -> None:
    k, m, symbol = 32, 4, PAYLOAD
    for _ in range(shards):
        data = os.urandom(k * symbol)
        repair = _fec.encode(data, k, m, symbol)
        present = bytearray([1] * k)
        for lost in (3, 17):  # two data symbols lost, rebuilt from the first two repair symbols
            present[lost] = 0
        damaged = bytearray(data)
        for lost in (3, 17):
            damaged[lost * symbol:(lost + 1) * symbol] = bytes(symbol)
        rebuilt = _fec.decode(bytes(damaged), k, m, symbol, bytes(present), repair[:2 * symbol],
                              bytes([0, 1]))
        if rebuilt != data[3 * symbol:4 * symbol] + data[17 * symbol:18 * symbol]:
            raise RuntimeError("FEC did not rebuild the block")


LOOPS: dict[str, Callable[[int, int], None]] = {"receiver": receiver_session, "pacer": pacer_session,
                                                "fec": fec_session}


def measure(name: str, sessions: int, shards: int, warmup: int) -> None:
    loop = LOOPS[name]
    for s in range(warmup):
        loop(shards, s * shards)
    gc.collect()
    traced0, rss0 = python_kib(), rss_anon_kib()
    for s in range(warmup, warmup + sessions):
        loop(shards, s * shards)
    gc.collect()
    traced, rss = python_kib() - traced0, rss_anon_kib() - rss0
    per = 1000 / (sessions * shards)
    print(f"{name:8s} {sessions} sessions x {shards} shards: RssAnon {rss:+d} KiB, "
          f"traced {traced:+.1f} KiB; native {(rss - traced) * per:+.2f} KiB per 1000 shards")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--shards", type=int, default=40, help="per session")
    parser.add_argument("--warmup", type=int, default=5, help="sessions before measuring")
    parser.add_argument("--only", choices=sorted(LOOPS), action="append")
    args = parser.parse_args()
    tracemalloc.start()
    for name in args.only or list(LOOPS):
        measure(name, args.sessions, args.shards, args.warmup)


if __name__ == "__main__":
    main()
