"""The gateway daemon: a transfer over a warm session against the first one (cold).

Two daemons in one process over loopback paths. Each round starts both daemons
afresh, then submits the same file twice through the API, one after the other:
the first transfer pays the session setup (the warm-up dial at start may still be
under way) and the congestion controllers' Startup; the second finds the session
warm and each path's model learned. Per transfer it prints the time from
submission to done (the client's view), the daemon's own send time and goodput,
and the bytes re-sent after loss; then the medians and the ratio second/first.
Timing on a shared 2-core host is noisy: compare within a run. Usage:

    PYTHONPATH=.:tests .venv/bin/python benchmarks/daemon_warm.py [--size 256MiB] [--rounds 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from daemon_helpers import make_pki, two_sites

from wanxport.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.service import GatewayDaemon
from wanxport.units import parse_size


async def one_round(directory: Path, pki: Path, size: int, paths: int) -> list[dict[str, float]]:
    a_cfg, b_cfg = two_sites(directory, pki, n_paths=paths)
    src = directory / "payload.bin"
    with open(src, "wb") as fh:
        fh.truncate(size)  # sparse zeros: the content does not matter to the transport
    a, b = GatewayDaemon(load_config(a_cfg), signals=False), GatewayDaemon(load_config(b_cfg), signals=False)
    await b.start()
    await a.start()
    client = GatewayClient(str(a.config.api_socket))
    rows = []
    try:
        for name in ("first.bin", "second.bin"):
            started = time.monotonic()
            t = await asyncio.to_thread(client.submit, "gw-b", str(src), name)
            done = await asyncio.to_thread(client.wait, t["id"], 600, 0.01)
            wall = time.monotonic() - started
            if done["state"] != "done":
                raise RuntimeError(f"{name}: {done['state']}: {done['reason']}")
            stats = done["stats"]
            rows.append({"submit_to_done_s": round(wall, 4), "send_s": stats["elapsed_s"],
                         "goodput_gbps": round(stats["goodput_bps"] / 1e9, 3),
                         "resent_bytes": stats["resent_bytes"], "sessions_dialled": a.dialled})
    finally:
        for daemon in (a, b):
            daemon.request_stop()
            await daemon.serve()
    return rows


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    size = parse_size(args.size)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="wanxport-warm-") as tmp:
        pki = make_pki(Path(tmp) / "pki")
        for index in range(args.rounds):
            directory = Path(tmp) / f"round{index}"
            directory.mkdir()
            rows = await one_round(directory, pki, size, args.paths)
            rounds.append(rows)
            print(f"round {index}: first {rows[0]['submit_to_done_s']:.3f} s "
                  f"({rows[0]['goodput_gbps']:.2f} Gb/s sending), second {rows[1]['submit_to_done_s']:.3f} s "
                  f"({rows[1]['goodput_gbps']:.2f} Gb/s), sessions dialled {rows[1]['sessions_dialled']}",
                  file=sys.stderr)
    first = statistics.median(r[0]["submit_to_done_s"] for r in rounds)
    second = statistics.median(r[1]["submit_to_done_s"] for r in rounds)
    return {"benchmark": "daemon_warm", "size_bytes": size, "paths": args.paths, "rounds": rounds,
            "median_first_s": first, "median_second_s": second, "second_over_first": round(second / first, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--paths", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the result here (compact JSON)")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
