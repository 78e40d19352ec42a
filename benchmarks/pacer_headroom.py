"""Does the native pacer keep up with the core? Its ring depth, with and without headroom.

    .venv/bin/python benchmarks/pacer_headroom.py [--size 8MiB] [--runs 3]

The core paces core packets; the native pacer spreads each one's datagrams at
the endpoint's rate, PACER_HEADROOM (1.25) times the core's. Were it at the
core's rate or below, its stalls would leave datagrams in its ring, a standing
queue that inflates every RTT sample the congestion controller sees. Each run
moves one shard over two loopback paths and records the sender's ring depth
of a path each time the core hands that path more datagrams; the baseline,
in the same run, is the same transfer with the pacer at 0.8x the core's rate.
(This replaced a test that checked the configured ratio, which held by
construction; the depth depends on the load of the machine, so it is a
benchmark, not an assert.)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys

from loopback_pair import SEGMENTS, endpoints, move_shards, pair_overrides, positive_size

import wanxport.aio.endpoint as endpoint_module


async def ring_depths(size: int, headroom: float) -> list[int]:
    endpoint_module.PACER_HEADROOM = headroom  # read when an endpoint is built
    a, b = endpoints()
    pacer = a.datapath.pacer
    depths: list[int] = []
    set_rate = a.datapath.set_rate

    def recording(path_id: int, rate_bytes_per_s: float) -> None:
        depths.append(pacer.stats()[path_id].queue_depth)  # before this round's datagrams
        set_rate(path_id, rate_bytes_per_s)

    a.datapath.set_rate = recording
    await move_shards(a, b, [random.Random(3).randbytes(size)])
    return depths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="8MiB", help="bytes per run (default 8MiB)")
    parser.add_argument("--runs", type=int, default=3, help="runs per setting (default 3)")
    args = parser.parse_args()
    size = positive_size(parser, args.size, args.runs, "--runs")
    configured = endpoint_module.PACER_HEADROOM
    print(f"session: the gateway preset with {pair_overrides()}")
    print(f"ring depth (datagrams; a core packet is {SEGMENTS}) when the core hands a path more, "
          f"{args.runs} runs of {size} bytes")
    for headroom in (configured, 0.8):
        for run in range(args.runs):
            depths = sorted(asyncio.run(ring_depths(size, headroom)))
            p90 = depths[int(0.9 * (len(depths) - 1))]
            median = statistics.median(depths)
            print(f"  pacer at {headroom:.2f}x the core, run {run + 1}: median {median:.0f}, "
                  f"p90 {p90}, max {depths[-1]} ({len(depths)} samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
