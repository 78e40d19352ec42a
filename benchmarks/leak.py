"""Memory growth per transfer of two gateway daemons in one process.

Runs gw-a and gw-b in-process on loopback (the daemon tests' configs), sends
``--warmup`` transfers, then measures the process's RssAnon across ``--transfers``
more (each received file is deleted). ``--tracemalloc`` adds the top Python
allocation differences over the measured transfers (slow: tracing costs ~10x) and
splits the RssAnon growth into what Python's allocators hold (traced) and the rest
(native: C extensions, OpenSSL, glibc arenas). Tracing starts before the warm-up,
so a bounded table whose entries are replaced (the store's recent transfers, the
goodput timeline) shows no growth; started after it, every replacement would look
like a new allocation.

    .venv/bin/python benchmarks/leak.py --warmup 100 --transfers 200 --size-mib 1
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from daemon_helpers import make_pki, two_sites  # noqa: E402
from smaps import anon_by_mapping, by_kind, diff  # noqa: E402

from wanxport.daemon.client import GatewayClient  # noqa: E402
from wanxport.daemon.config import load_config  # noqa: E402
from wanxport.daemon.service import GatewayDaemon  # noqa: E402


def malloc_trim() -> None:
    """glibc's malloc_trim(0): hand free heap pages back to the kernel."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a_cfg, b_cfg = two_sites(root, make_pki(root / "pki"), n_paths=2)
        source = root / "source.bin"
        source.write_bytes(os.urandom(args.size_mib << 20))
        a = GatewayDaemon(load_config(a_cfg), signals=False)
        b = GatewayDaemon(load_config(b_cfg), signals=False)
        await b.start()
        await a.start()
        if args.keep_finished is not None:  # the store's bound, lowered to see what else grows
            for daemon in (a, b):
                assert daemon.store is not None
                daemon.store.keep_finished = args.keep_finished
        client = GatewayClient(str(a.config.api_socket))
        received = root / "gw-b-data" / "received" / "gw-a"

        async def send(first: int, count: int) -> None:
            for k in range(first, first + count):
                transfer = await asyncio.to_thread(client.submit, "gw-b", str(source), f"f{k}.bin")
                while transfer["state"] not in ("done", "failed", "cancelled"):
                    await asyncio.sleep(0.02)
                    transfer = await asyncio.to_thread(client.get, transfer["id"])
                if transfer["state"] != "done":
                    raise RuntimeError(f"transfer {k}: {transfer}")
                (received / f"f{k}.bin").unlink()
                if args.reload:  # as SIGHUP would (the soak sends one a minute)
                    a.reload()
                    b.reload()

        if args.tracemalloc:
            tracemalloc.start()
        await send(0, args.warmup)
        gc.collect()
        if args.tracemalloc:
            before = tracemalloc.take_snapshot()
            traced_start = tracemalloc.get_traced_memory()[0] + tracemalloc.get_tracemalloc_memory()
        if args.malloc_trim:
            malloc_trim()
        start = rss_anon_kib()
        maps_start = anon_by_mapping()
        await send(args.warmup, args.transfers)
        gc.collect()
        if args.malloc_trim:
            malloc_trim()
        end = rss_anon_kib()
        print(f"RssAnon {start} -> {end} KiB: {(end - start) / args.transfers:.1f} KiB per transfer "
              f"over {args.transfers} transfers of {args.size_mib} MiB")
        sizes: dict[str, int] = {}
        maps_end = anon_by_mapping(sizes=sizes)
        for old, new in ((by_kind(maps_start), by_kind(maps_end)), (maps_start, maps_end)):
            for delta, key in diff(old, new):
                size = f" (a {sizes[key]} KiB mapping)" if key in sizes else ""
                print(f"  smaps {delta:+6d} KiB ({delta / args.transfers:+.2f}/transfer) {key}{size}")
        if args.tracemalloc:
            # tracemalloc's own tables are native allocations too: count them as traced
            traced = (tracemalloc.get_traced_memory()[0] + tracemalloc.get_tracemalloc_memory()
                      - traced_start) / 1024
            print(f"traced (Python allocators) {traced / args.transfers:+.2f} KiB per transfer; "
                  f"the rest (native) {(end - start - traced) / args.transfers:+.2f} KiB per transfer")
            for stat in tracemalloc.take_snapshot().compare_to(before, "lineno")[:30]:
                print(stat)
        for daemon in (a, b):
            daemon.request_stop()
        await asyncio.gather(a.serve(), b.serve())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--transfers", type=int, default=200)
    parser.add_argument("--size-mib", type=int, default=1)
    parser.add_argument("--keep-finished", type=int, help="the transfer store's bound (default 1000)")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--reload", action="store_true", help="reload both daemons after each transfer")
    parser.add_argument("--malloc-trim", action="store_true",
                        help="malloc_trim(0) before each RssAnon reading: is the growth free but kept?")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
