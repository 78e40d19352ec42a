"""Point-to-point message latency between two sites over an emulated scenario.

    sudo .venv/bin/python benchmarks/p2p_latency.py [--scenario clean-2path] \\
        [--sizes 64KiB,1MiB,16MiB] [--messages 200] [--out results/p2p-latency.json]

Brings the scenario up (network namespaces and the impairment engine, as
``python -m emulation run`` does), starts one site in each gateway namespace
(``python -m benchmarks.p2p_latency site '<spec>'``), joins them as a two-site
``wanxport.collective`` group over every path and sends MESSAGES messages of each
size from site a to site b with ``group.send`` / ``group.recv``, one after the
other (each send returns once the receiver has the message and answered).

A message's latency is the receiver's ``recv`` returning minus the sender's
``send`` call, on CLOCK_MONOTONIC (one kernel, so shared by the namespaces): the
clock starts at the user's call. The bound it is held against is the scenario's
a->b ideal for that size (``wanxport.scenario.ideal_time_s``): the one-way delay of
the paths plus size / their capacity, i.e. what the best possible transport
could do. Reports, per size, the median and p99 latency, the bound, and
median / bound; the first and last message of each size are checked byte for byte
at the receiver (the others carry the first one's bytes: generating 200 random 16 MiB
arrays would load the sender between messages).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

PORT = 7790
SETUP_TIMEOUT_S = 120.0


def parse_size(text: str) -> int:
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def payload(size: int, index: int) -> np.ndarray:
    return np.random.default_rng([size, index]).integers(0, 256, size, dtype=np.uint8)


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def site_main(spec: dict[str, Any]) -> None:
    from wanxport.collective import join

    identity = os.path.join(spec["pki"], spec["names"][spec["site"]])
    group = await join(spec["site"], spec["names"], identity=identity,
                       ca=os.path.join(spec["pki"], "ca.pem"), paths=spec["paths"], timeout=120.0,
                       join_timeout=SETUP_TIMEOUT_S)
    await group.barrier()
    emit({"event": "ready"})
    await asyncio.to_thread(sys.stdin.readline)  # "go"
    times: dict[str, list[float]] = {}
    intact = True
    for tag, size in enumerate(spec["sizes"]):
        stamps = times[str(size)] = []
        box = np.zeros(size, np.uint8)
        for i in range(spec["messages"]):
            if spec["site"] == 0:
                data = payload(size, i) if i in (0, spec["messages"] - 1) else payload(size, 0)
                stamps.append(time.monotonic())
                await group.send(data, dst=1, tag=tag)
            else:
                await group.recv(box, src=0, tag=tag)
                stamps.append(time.monotonic())
                if i in (0, spec["messages"] - 1):
                    intact = intact and box.tobytes() == payload(size, i).tobytes()
        await group.barrier()
    emit({"event": "done", "times": times, "intact": intact,
          "paths": {name: [s.srtt_s for s in stats] for name, stats in group.path_stats().items()}})
    await group.close()


def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    from emulation.api import Emulation
    from emulation.baselines.programs import Program
    from emulation.bundled import resolve_scenario
    from wanxport.control.certs import make_test_pki
    from wanxport.scenario import ideal_time_s

    scenario = resolve_scenario(args.scenario)
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    emu = Emulation(scenario)
    emu.up()
    programs: list[Program] = []
    try:
        with tempfile.TemporaryDirectory(prefix="wx-p2p-") as pki:
            names = ["a", "b"]
            make_test_pki(pki, names)
            os.chmod(pki, 0o755)
            paths = [f"{p.b_addr}:{PORT}" for p in emu.paths]
            for site, side in enumerate(("a", "b")):
                spec = {"site": site, "names": names, "pki": pki, "paths": paths, "sizes": sizes,
                        "messages": args.messages}
                programs.append(Program(emu, side, "benchmarks.p2p_latency", "site", spec, stdin=True))
            for program in programs:
                if program.expect("ready", SETUP_TIMEOUT_S) is None:
                    raise SystemExit(f"{program.label}: not ready within {SETUP_TIMEOUT_S:.0f} s")
            emu.start_events()
            for program in programs:
                program.tell("go")
            done = [program.expect("done", args.deadline) for program in programs]
            if any(d is None for d in done):
                raise SystemExit(f"no result within the {args.deadline:.0f} s deadline")
    finally:
        for program in programs:
            program.close()
        emu.down()
    sent, received = done[0]["times"], done[1]["times"]  # type: ignore[index]
    results = []
    for size in sizes:
        latencies = sorted(r - s for s, r in zip(sent[str(size)], received[str(size)], strict=True))
        bound = ideal_time_s(scenario, size, "a->b")
        median = statistics.median(latencies)
        p99 = latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))]
        results.append({"size_bytes": size, "messages": len(latencies), "median_s": median, "p99_s": p99,
                        "min_s": latencies[0], "max_s": latencies[-1], "bound_s": bound,
                        "median_over_bound": median / bound, "p99_over_bound": p99 / bound})
    return {"benchmark": "p2p_latency", "scenario": scenario.name, "results": results,
            "intact": bool(done[1]["intact"]), "srtt_s": done[0]["paths"],  # type: ignore[index]
            "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                                     check=False).stdout.strip(),
            "host": os.uname().nodename, "cpus": os.cpu_count(), "load_after": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["site"]:
        from wanxport.aio.loop import run

        run(site_main(json.loads(argv[1])))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="clean-2path")
    parser.add_argument("--sizes", default="64KiB,1MiB,16MiB")
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--deadline", type=float, default=900.0)
    parser.add_argument("--out", help="write the report here (JSON)")
    args = parser.parse_args(argv)
    report = run_benchmark(args)
    for r in report["results"]:
        print(f"{r['size_bytes']:>10} B: median {r['median_s'] * 1e3:8.2f} ms, "
              f"p99 {r['p99_s'] * 1e3:8.2f} ms, bound {r['bound_s'] * 1e3:8.2f} ms, "
              f"median/bound {r['median_over_bound']:.2f}")
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
