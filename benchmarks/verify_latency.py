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

from loopback_pair import endpoints, move_shards, pair_overrides, positive_size

from wanxport.core.events import ShardFilled


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
    await move_shards(a, b, (random.Random(i).randbytes(size) for i in range(shards)))
    return waits


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64MiB", help="bytes per shard (default 64MiB)")
    parser.add_argument("--shards", type=int, default=4, help="shards to move (default 4)")
    args = parser.parse_args()
    size = positive_size(parser, args.size, args.shards, "--shards")
    waits = asyncio.run(measure(size, args.shards))
    blob = random.Random(0).randbytes(size)
    hashes = []
    for _ in range(args.shards):
        start = time.perf_counter()
        hashlib.sha256(blob).digest()
        hashes.append(time.perf_counter() - start)
    print(f"session: the gateway preset with {pair_overrides()}")
    print(f"{args.shards} shards of {size} bytes over loopback")
    print(f"  last byte -> verdict (incremental hashing): median {statistics.median(waits) * 1e3:.1f} ms, "
          f"max {max(waits) * 1e3:.1f} ms")
    print("  SHA-256 of a whole shard (hashing once complete): "
          f"median {statistics.median(hashes) * 1e3:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
