"""A 2-site all_reduce over loopback, one process per site, no impairment.

    .venv/bin/python benchmarks/collective_loopback.py [--size 64MiB] [--steps 5] [--paths 4]

Two site processes (this script with ``--site 0`` / ``--site 1``) join a group over
``--paths`` loopback paths and run ``--steps`` all_reduce calls of ``--size`` float32.
Each prints one JSON line: per-step wall seconds, CPU seconds (user + system of the
whole process, so the loop, the hashing and the native data path all count; ``cpu``
splits the steps' CPU by thread role), what the control channel carried per step
(``control_per_step``: messages by type, acknowledgements, keepalives, QUIC datagrams
and bytes, its handlers' loop CPU) and
run-queue seconds (threads ready to run but not running: the loaded host's share).
The event loop's thread is also split alone: wall = its CPU + its run-queue wait +
the time it was blocked in epoll (on the peer, the network, timers, round trips or
a worker thread). With no
link to wait for, a step's time here is what the collective costs in CPU and round
trips; the emulated run adds the paths. ``--pause S`` sleeps before the steps so a
profiler (``py-spy record --pid``) can attach.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from emulation.baselines.allreduce_app import control_totals, per_step  # noqa: E402
from wanxport.aio import threadcpu  # noqa: E402
from wanxport.collective import join  # noqa: E402
from wanxport.collective.mesh import default_options  # noqa: E402
from wanxport.control import counters  # noqa: E402
from wanxport.control.certs import make_test_pki  # noqa: E402
from wanxport.report import step_summary  # noqa: E402
from wanxport.units import parse_size  # noqa: E402

NAMES = ["site-0", "site-1"]


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def runqueue_wait_s() -> float:
    """Seconds this process's threads spent runnable but not running (/proc schedstat, field 2):
    the share of a step lost to a loaded host rather than to our own work or waits."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a worker thread that just ended
    return total / 1e9


def loop_thread_s() -> tuple[float, float]:
    """(on-CPU, run-queue) seconds of the event loop's thread alone (schedstat fields 1, 2)."""
    fields = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()
    return int(fields[0]) / 1e9, int(fields[1]) / 1e9


async def site(index: int, pki: Path, paths: list[str], size: int, steps: int,
               pause: float, segments: int | None) -> dict[str, object]:
    options = default_options()
    if segments is not None:
        options = dataclasses.replace(options, segments=segments)
    group = await join(index, NAMES, identity=pki / NAMES[index], ca=pki / "ca.pem", paths=paths,
                       options=options, timeout=120.0, join_timeout=60.0)
    array = np.full(size // 4, float(index + 1), dtype=np.float32)
    await asyncio.sleep(pause)
    walls, cpus, waits, loop_cpu, loop_wait = [], [], [], [], []
    roles = threadcpu.RoleMeter()
    control: dict[str, object] = {}
    try:
        for _ in range(steps):
            array.fill(float(index + 1))  # all_reduce works in place
            before = control_totals(group)
            roles.start()
            w, c, q, (lc, lq) = time.perf_counter(), cpu_s(), runqueue_wait_s(), loop_thread_s()
            out = await group.all_reduce(array)
            roles.stop()
            counters.add(control, counters.difference(control_totals(group), before))
            walls.append(time.perf_counter() - w)
            cpus.append(cpu_s() - c)
            waits.append(runqueue_wait_s() - q)
            lc2, lq2 = loop_thread_s()
            loop_cpu.append(lc2 - lc)
            loop_wait.append(lq2 - lq)
            if not np.all(out == 3.0):
                raise SystemExit("wrong sum")
    finally:
        await group.close()
    blocked = [w - c - q for w, c, q in zip(walls, loop_cpu, loop_wait, strict=True)]

    def r(xs: list[float]) -> list[float]:
        return [round(x, 3) for x in xs]
    # first_step_s, then mean (what a job pays), p90, worst and median of steps 2..N
    figures = {k: v for k, v in step_summary(walls).items() if k != "step_s"}
    return {"site": index, "pid": os.getpid(), "step_s": r(walls), **figures, "cpu_s": r(cpus),
            "runqueue_wait_s": r(waits), "loop_cpu_s": r(loop_cpu), "loop_runqueue_s": r(loop_wait),
            "loop_blocked_s": r(blocked), "load": os.getloadavg()[0],
            "cpu": threadcpu.rounded(roles.total, 3), "control_per_step": per_step(control, steps)}


def free_ports(count: int) -> list[int]:
    """``count`` consecutive UDP ports free now (each path is one port for data and control)."""
    for first in range(21000, 29000, 16):
        try:
            socks = []
            for p in range(first, first + count):
                s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return list(range(first, first + count))
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("no free ports")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="64MiB")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--paths", type=int, default=4)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--segments", type=int, help="datagrams per core packet (the emulated "
                        "allreduce app uses 16; default: the gateway's)")
    parser.add_argument("--site", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--pki", help=argparse.SUPPRESS)
    parser.add_argument("--path-list", help=argparse.SUPPRESS)
    args = parser.parse_args()
    size = parse_size(args.size)
    if args.site is not None:
        with threadcpu.thread_role("loop"):  # asyncio.run's thread runs the group's loop
            result = asyncio.run(site(args.site, Path(args.pki), args.path_list.split(","), size,
                                      args.steps, args.pause, args.segments))
        print(json.dumps(result), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        pki = Path(tmp)
        make_test_pki(pki, NAMES)
        paths = ",".join(f"127.0.0.1:{p}" for p in free_ports(args.paths))
        procs = [subprocess.Popen([sys.executable, __file__, "--site", str(k), "--pki", str(pki),
                                   "--path-list", paths, "--size", args.size, "--steps", str(args.steps),
                                   "--pause", str(args.pause),
                                   *(["--segments", str(args.segments)] if args.segments else [])],
                                  stdout=subprocess.PIPE, text=True)
                 for k in (1, 0)]
        for p in procs:
            print(f"pid {p.pid}", file=sys.stderr, flush=True)
        outs = [p.communicate(timeout=600)[0] for p in procs]
    for out in outs:
        print(out.strip())


if __name__ == "__main__":
    main()
