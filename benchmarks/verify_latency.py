"""How long a shard waits between its last byte and its verdict, over loopback.

    .venv/bin/python benchmarks/verify_latency.py [--size 64MiB] [--shards 4]

Two endpoints move ``--shards`` shards one after another over two loopback
paths. For each, the time from the session's ``ShardFilled`` (every byte in)
to the verdict is recorded: the digest is advanced over the received prefix
while the shard arrives (``wanxport.aio.verify``), so only the tail is hashed
then. The baseline, measured in the same run, is SHA-256 over a whole shard of
that size: what hashing it once complete would add.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket, offload_chunk_bytes  # noqa: E402
from wanxport.aio.endpoint import Endpoint  # noqa: E402
from wanxport.core.config import PathConfig, SessionConfig  # noqa: E402
from wanxport.core.events import ShardFilled  # noqa: E402
from wanxport.units import parse_size  # noqa: E402


def endpoints() -> tuple[Endpoint, Endpoint]:
    rng = random.Random(1)
    forward = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    backward = DirectionKey("aes-256-gcm", rng.randbytes(32), rng.randbytes(12))
    paths = (PathConfig("p0"), PathConfig("p1"))
    session = SessionConfig(paths=paths, chunk_bytes=offload_chunk_bytes(paths, 16))
    sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in paths)
    a = Endpoint(EndpointConfig(session, sockets, forward, backward, 1, 2, datapath="native"))
    b = Endpoint(EndpointConfig(session, sockets, backward, forward, 2, 1, datapath="native"))
    a.connect(b.local_addresses)
    b.connect(a.local_addresses)
    return a, b


async def measure(size: int, shards: int) -> list[float]:
    a, b = endpoints()
    filled: dict[int, float] = {}
    waits: list[float] = []
    on_event, on_verified = b._on_event, b._on_verified

    def noting_fill(event: object) -> None:
        if isinstance(event, ShardFilled):
            filled[event.shard_id] = time.perf_counter()
        on_event(event)

    def noting_verdict(shard_id: int, digest: bytes, check: asyncio.Future[bytes]) -> None:
        waits.append(time.perf_counter() - filled[shard_id])
        on_verified(shard_id, digest, check)

    b._on_event = noting_fill  # type: ignore[method-assign]
    b._on_verified = noting_verdict  # type: ignore[method-assign]
    a.start()
    b.start()
    try:
        for i in range(shards):
            data = random.Random(i).randbytes(size)
            ack = a.submit(i, data)
            got = await b.receive_shard()
            if not (got.ok and await ack):
                raise SystemExit(f"shard {i} did not verify")
    finally:
        await a.close()
        await b.close()
    return waits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64MiB", help="bytes per shard (default 64MiB)")
    parser.add_argument("--shards", type=int, default=4, help="shards to move (default 4)")
    args = parser.parse_args()
    try:
        size = parse_size(args.size)
    except ValueError as exc:
        parser.error(str(exc))
    if size <= 0 or args.shards < 1:
        parser.error("--size and --shards must be positive")
    waits = asyncio.run(measure(size, args.shards))
    blob = random.Random(0).randbytes(size)
    hashes = []
    for _ in range(args.shards):
        start = time.perf_counter()
        hashlib.sha256(blob).digest()
        hashes.append(time.perf_counter() - start)
    print(f"{args.shards} shards of {size} bytes over loopback")
    print(f"  last byte -> verdict (incremental hashing): median {statistics.median(waits) * 1e3:.1f} ms, "
          f"max {max(waits) * 1e3:.1f} ms")
    print("  SHA-256 of a whole shard (hashing once complete): "
          f"median {statistics.median(hashes) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
