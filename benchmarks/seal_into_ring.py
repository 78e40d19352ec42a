"""Handing a data plan to the pacer: sealed into a burst buffer then copied, or queued unsealed.

    flock /tmp/wanxport-tests.lock .venv/bin/python benchmarks/seal_into_ring.py --rounds 3

One process, one path to a C sink over loopback (``udp_blast_sink``), 64-datagram
plans of a resident 1 GiB buffer, unpaced. ``burst`` is what the send lane did
before: ``build_data_datagrams`` (a fresh buffer per plan) then
``Pacer.enqueue`` (a copy into the ring slots); ``release`` is ``Pacer.enqueue_data``
(queued as a data run; the pacer's release thread seals each datagram into its
own scratch just before the send). Reported per variant and round: the
calling thread's CPU per GB (where the two differ) and the whole process's
(pacer thread and sink included). Variants alternate, so load drift hits both.
"""

from __future__ import annotations

import argparse
import json
import resource
import socket
import threading
import time
from typing import Any

import numpy as np

from wanxport.aio import native_io
from wanxport.core.config import PathConfig, datagram_payload
from wanxport.wire import native

GB = 1e9


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run(variant: str, view: memoryview, segments: int) -> dict[str, Any]:
    from wanxport_lab import _limits  # type: ignore[attr-defined]

    size = len(view)
    segment = datagram_payload(PathConfig("p", 1500), 16)
    chunk = segment * segments
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 20)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    tx.setblocking(False)
    sunk: list[Any] = []
    sink = threading.Thread(target=lambda: sunk.append(_limits.udp_blast_sink(rx.fileno(), 1.0, 120.0)))
    sink.start()
    seal = native.Protector("aes-256-gcm", bytes(range(32)), bytes(12))
    pacer = native_io.Pacer(1, capacity=8192, slot_size=2048, spin_ns=0, burst_ns=500_000)
    pacer.set_path(0, tx)
    pacer.set_rate(0, 100e9)
    cpu0, thread0, pn = _cpu_s(), time.thread_time(), 0
    for offset in range(0, size, chunk):
        length = min(chunk, size - offset)
        if variant == "burst":
            burst = native.build_data_datagrams(seal, 7, 0, pn, 0, 1, view, offset, length, segment)
            rest = memoryview(burst.buffer)
            while len(rest):
                rest = rest[pacer.enqueue(0, rest, stride=burst.stride) * burst.stride:]
                if len(rest):
                    pacer.wait_idle(0.001)
            pn += burst.count
        else:
            done = 0
            while done < length:
                n = pacer.enqueue_data(0, seal, 7, pn, 0, 1, view, offset + done, length - done, segment)
                pn += n
                done += n * segment
                if done < length:
                    pacer.wait_idle(0.001)
    thread_cpu = time.thread_time() - thread0
    pacer.wait_idle(60.0)
    pacer.close()
    sink.join()
    cpu = _cpu_s() - cpu0
    tx.close()
    rx.close()
    return {"variant": variant, "bytes": size, "sink_bytes": sunk[0][1],
            "caller_cpu_s_per_gb": round(thread_cpu / (size / GB), 3),
            "process_cpu_s_per_gb": round(cpu / (size / GB), 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--segments", type=int, default=64)
    parser.add_argument("--size-mib", type=int, default=1024)
    args = parser.parse_args()
    data = np.empty(args.size_mib << 20, dtype=np.uint8)
    data.fill(1)
    view = memoryview(data)  # type: ignore[arg-type]
    for _ in range(args.rounds):
        for variant in ("burst", "release"):
            print(json.dumps(run(variant, view, args.segments), separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
