"""The file side of a transfer, two ways: windowed maps (what the gateway does) or pread/pwrite.

Both ends of a file transfer hold only a window of the file. Each piece can reach
the data plane either through its own mapping of the file (``MappedRange``: the
sender hashes and seals straight from the file's pages, the receiver's data plane
places datagrams straight into them) or through a pooled buffer that is filled
with ``preadv`` / written out with ``pwrite``. This measures the CPU per GB of the
part that differs, on a 1 GiB file, both ways in the same run (rounds
alternate): the sender reads and hashes each piece, then drops it from the page
cache; the receiver places each piece (one memcpy, standing for the native
placement), hashes it (its verification), makes it durable (fsync) and drops it.
The transport itself (sealing, sending) is the same either way and not included.
CPU is user + system time of this process (``getrusage``). Usage:

    .venv/bin/python benchmarks/file_io.py [--size 1GiB] [--piece 64MiB] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from wanxport.gateway.files import MappedRange, drop_cached
from wanxport.units import parse_size


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def send_mapped(path: Path, size: int, piece: int, _buf: np.ndarray) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, piece):
            mapped = MappedRange(path, offset, min(piece, size - offset))
            hashlib.sha256(mapped.array).digest()
            mapped.evict()
            drop_cached(fd, offset, min(piece, size - offset))
    finally:
        os.close(fd)


def send_pread(path: Path, size: int, piece: int, buf: np.ndarray) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset in range(0, size, piece):
            n = os.preadv(fd, [memoryview(buf)[: min(piece, size - offset)]], offset)
            hashlib.sha256(memoryview(buf)[:n]).digest()
            drop_cached(fd, offset, n)
    finally:
        os.close(fd)


def receive_mapped(path: Path, size: int, piece: int, data: np.ndarray) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            mapped = MappedRange(path, offset, n, writable=True)
            mapped.array[:] = data[:n]
            hashlib.sha256(mapped.array).digest()
            mapped.evict()
            os.fsync(fd)
            drop_cached(fd, offset, n)
    finally:
        os.close(fd)


def receive_pwrite(path: Path, size: int, piece: int, data: np.ndarray) -> None:
    buf = np.empty_like(data)  # the pool's buffer, touched once (a pool reuses it)
    buf[:] = 0
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        for offset in range(0, size, piece):
            n = min(piece, size - offset)
            buf[:n] = data[:n]
            hashlib.sha256(memoryview(buf)[:n]).digest()
            written = 0
            while written < n:
                written += os.pwrite(fd, memoryview(buf)[written:n], offset + written)
            os.fsync(fd)
            drop_cached(fd, offset, n)
    finally:
        os.close(fd)


Step = Callable[[Path, int, int, np.ndarray], None]
WAYS: dict[str, tuple[Step, Step]] = {"mapped": (send_mapped, receive_mapped),
                                      "pread/pwrite": (send_pread, receive_pwrite)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="1GiB")
    parser.add_argument("--piece", default="64MiB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    size, piece = parse_size(args.size), parse_size(args.piece)
    data = np.random.default_rng(1).integers(0, 256, piece, dtype=np.uint8)
    buf = np.zeros(piece, dtype=np.uint8)
    rows: dict[str, dict[str, list[float]]] = {w: {"send": [], "receive": []} for w in WAYS}
    with tempfile.TemporaryDirectory(prefix="wanxport-fileio-", dir=args.dir) as tmp:
        source, dest = Path(tmp) / "source.bin", Path(tmp) / "dest.bin"
        receive_pwrite(source, size, piece, data)  # the source: written, synced, not cached
        for _ in range(args.rounds):
            for way, (send, receive) in WAYS.items():
                for side, step, path in (("send", send, source), ("receive", receive, dest)):
                    c0, t0 = cpu_s(), time.perf_counter()
                    step(path, size, piece, buf if side == "send" else data)
                    cpu, wall = cpu_s() - c0, time.perf_counter() - t0
                    rows[way][side].append(cpu / (size / 1e9))
                    print(f"{way:13s} {side:8s} {cpu / (size / 1e9):.3f} CPU s/GB ({wall:.2f} s wall)",
                          file=sys.stderr)
    result = {"benchmark": "file_io", "size_bytes": size, "piece_bytes": piece, "rounds": args.rounds,
              "cpu_s_per_gb_median": {w: {s: round(statistics.median(v), 3) for s, v in sides.items()}
                                      for w, sides in rows.items()},
              "cpu_s_per_gb": {w: {s: [round(x, 3) for x in v] for s, v in sides.items()}
                               for w, sides in rows.items()}}
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
