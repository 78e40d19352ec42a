"""The gateway daemon: a cold first transfer, a warm second one, and the first after a restart.

Two daemons in one process over loopback paths. Each round starts both daemons
afresh, then submits the same file twice through the API, one after the other:
the first transfer pays the session setup (the warm-up dial at start may still be
under way) and the congestion controllers' Startup; the second finds the session
warm and each path's model learned. Then the sender is restarted (same data
directory: its path cache survives) and the file is sent a third time: the new
session's paths resume carefully from the cache (``Session.resume_path``) when the
round trip still matches, else start cold. Per transfer it prints the time from
submission to done (the client's view), the daemon's own send time and goodput,
the bytes re-sent after loss and, after the restart, how many paths resumed or
dropped their cached state; then the medians and the ratios to the first.
Timing on a shared 2-core host is noisy: compare within a run.

``--sim`` measures the same three transfers in the simulator on a long-haul path
(deterministic, virtual time), where Startup costs what it costs over a WAN: the cold
first transfer, the first after a restart resuming from the state the cold one saved,
and the warm second transfer of a session (its second step). Efficiency there is the
ideal time (size / bottleneck + one-way delay) over the transfer's time. Usage:

    PYTHONPATH=.:tests .venv/bin/python benchmarks/daemon_warm.py [--size 256MiB] [--rounds 3] [--json OUT]
    .venv/bin/python benchmarks/daemon_warm.py --sim [--json OUT]
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

from wanxport.daemon.client import GatewayClient
from wanxport.daemon.config import load_config
from wanxport.daemon.service import GatewayDaemon
from wanxport.units import parse_size


async def _transfer(a: GatewayDaemon, src: Path, name: str) -> dict[str, float]:
    client = GatewayClient(str(a.config.api_socket))
    started = time.monotonic()
    t = await asyncio.to_thread(client.submit, "gw-b", str(src), name)
    done = await asyncio.to_thread(client.wait, t["id"], 600, 0.01)
    wall = time.monotonic() - started
    if done["state"] != "done":
        raise RuntimeError(f"{name}: {done['state']}: {done['reason']}")
    stats = done["stats"]
    paths = a.sessions["gw-b"].stats().paths  # the session is still warm
    return {"submit_to_done_s": round(wall, 4), "send_s": stats["elapsed_s"],
            "goodput_gbps": round(stats["goodput_bps"] / 1e9, 3),
            "resent_bytes": stats["resent_bytes"], "sessions_dialled": a.dialled,
            "paths_resumed": sum(p.resumes for p in paths),
            "paths_resume_dropped": sum(p.resumes_dropped for p in paths)}


async def one_round(directory: Path, pki: Path, size: int, paths: int) -> list[dict[str, float]]:
    a_cfg, b_cfg = two_sites(directory, pki, n_paths=paths)
    src = directory / "payload.bin"
    with open(src, "wb") as fh:
        fh.truncate(size)  # sparse zeros: the content does not matter to the transport
    a, b = GatewayDaemon(load_config(a_cfg), signals=False), GatewayDaemon(load_config(b_cfg), signals=False)
    await b.start()
    await a.start()
    rows = []
    try:
        for name in ("first.bin", "second.bin"):
            rows.append(await _transfer(a, src, name))
        a.request_stop()
        await a.serve()
        cached = sum(len(v) for v in a.path_cache.entries.values())
        a = GatewayDaemon(load_config(a_cfg), signals=False)  # restarted: only the disk survives
        await a.start()
        rows.append({**await _transfer(a, src, "after-restart.bin"), "paths_cached": cached})
    finally:
        for daemon in (a, b):
            daemon.request_stop()
            await daemon.serve()
    return rows


SIM_SCENARIO = """
name = "restart-wan"
seed = 11
[transfer]
size = "{size}"
shards = 4
steps = {steps}
[[paths]]
name = "wan0"
rtt_ms = 80.0
bandwidth_mbps = 400.0
[[paths]]
name = "wan1"
rtt_ms = 50.0
bandwidth_mbps = 200.0
"""


def simulate(size: str) -> dict[str, object]:
    """Cold first, first after a restart (resumed from what the cold run saved), warm second."""
    from wanxport.core.warm import remember
    from wanxport.scenario import parse_scenario
    from wanxport.scenario.ideal import ideal_time_s
    from wanxport.sim.runner import SimOptions, SimRun

    options = SimOptions(payload_mode="virtual")
    one = parse_scenario(SIM_SCENARIO.format(size=size, steps=1))
    ideal = ideal_time_s(one)
    cold_run = SimRun(one, options)
    cold = cold_run.run()["completion_s"]
    end = cold_run.loop.now
    saved = [remember(p.cc, p.rtt, end) for p in cold_run.a.session.paths]
    resumed_run = SimRun(one, options)
    for index, memory in enumerate(saved):
        if memory is not None:  # what the daemon's path cache holds: saved at the end of the cold run
            resumed_run.a.session.resume_path(index, memory, 0.0)
    resumed = resumed_run.run()["completion_s"]
    warm = SimRun(parse_scenario(SIM_SCENARIO.format(size=size, steps=2)), options).run()["step_s"][1]
    rows = {"cold_first_s": cold, "after_restart_s": resumed, "warm_second_s": warm}
    return {"benchmark": "daemon_warm_sim", "size": size, "ideal_s": round(ideal, 4),
            "paths_saved": sum(m is not None for m in saved),
            "paths_resumed": sum(p.resumes for p in resumed_run.a.session.paths),
            **{k: round(v, 4) for k, v in rows.items()},
            **{k[:-2] + "_efficiency": round(ideal / v, 3) for k, v in rows.items()}}


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
                  f"({rows[1]['goodput_gbps']:.2f} Gb/s), sessions dialled {rows[1]['sessions_dialled']}; "
                  f"after restart {rows[2]['submit_to_done_s']:.3f} s ({rows[2]['goodput_gbps']:.2f} Gb/s), "
                  f"paths cached {rows[2]['paths_cached']}, resumed {rows[2]['paths_resumed']}, "
                  f"dropped {rows[2]['paths_resume_dropped']}", file=sys.stderr)
    first = statistics.median(r[0]["submit_to_done_s"] for r in rounds)
    second = statistics.median(r[1]["submit_to_done_s"] for r in rounds)
    restart = statistics.median(r[2]["submit_to_done_s"] for r in rounds)
    return {"benchmark": "daemon_warm", "size_bytes": size, "paths": args.paths, "rounds": rounds,
            "median_first_s": first, "median_second_s": second, "median_after_restart_s": restart,
            "second_over_first": round(second / first, 3), "restart_over_first": round(restart / first, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--paths", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the result here (compact JSON)")
    parser.add_argument("--sim", action="store_true", help="the three transfers in the simulator (WAN paths)")
    args = parser.parse_args()
    result = simulate(args.size) if args.sim else asyncio.run(main_async(args))
    print(json.dumps(result))
    if args.json is not None:
        args.json.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
