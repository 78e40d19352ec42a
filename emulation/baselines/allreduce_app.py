"""One rank of ``python -m emulation allreduce``: runs in a gateway namespace.

    python -m emulation.baselines.allreduce_app wanxport '<json spec>'
    python -m emulation.baselines.allreduce_app gloo '<json spec>'
    python -m emulation.baselines.allreduce_app gloo-striped '<json spec>'

Runner protocol as the other baselines: ``{"event": "ready"}`` once set up (group
joined / process group initialised, inputs generated), "go" on stdin, then
``{"event": "done", ...}`` with each step's (start, end) on CLOCK_MONOTONIC (shared
by all namespaces), whether every step's result was correct, a digest of each
step's result (the runner checks all ranks agree) and this rank's bytes.

wanxport, R ranks per site: rank r of each site forms a wanxport group with rank r of
every other site on its own ports (``spec["sites"]`` sites, default 2; among more than
two, ``spec["paths"]`` maps each peer site to the paths of their pair, an empty list
where the pair has no direct path, and ``spec["schedule"]`` is the group's schedule).
R = 1: each step is the cross-site all-reduce alone. R > 1: each step is the DDP hook's
path for the whole array (``wanxport.torch.allreduce_tensor``): a reduce-scatter inside
the site (gloo over the namespace's loopback), an all-reduce of this rank's 1/R slice across sites over
wanxport, an all-gather inside the site, pipelined in the hook's chunks. gloo: one
flat torch.distributed world of 2R ranks (ranks contiguous per site),
``GLOO_SOCKET_IFNAME`` the best route's interface. gloo-striped: the same world once
per route (one ``ProcessGroupGloo`` on a device bound to that route's interface), the
array split over the routes by capacity and every stripe all-reduced at once.

Every rank's input is seeded by (seed, site, rank) and is the same at every step;
each rank regenerates all inputs to check its result: without compression within
float32 summation error of the float64 sum, with compression within the codec's
bound (``wanxport.collective.error_bound``) of this step and the residual carried
from the last (error feedback), i.e. ``2.02 x`` the per-site bounds, plus the former;
among N > 2 sites a site's contribution may be quantised once per hop of its part's
tree (at most N hops with the way down) and so may its residual: ``2.02 x N x``.

CHECK_AFTER_ALL: a rank checks its result only once every rank's step has ended (a barrier,
untimed). A step lasts until the last rank's ends, and on a 2-core host a check run by a rank
that finished first took CPU from another rank's tail (docs/results/s15.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import numpy as np

from emulation.baselines.tcp_app import emit
from emulation.baselines.wanxport_app import diagnostics
from wanxport.aio import threadcpu
from wanxport.aio.loop import run
from wanxport.collective import error_bound, join
from wanxport.control import counters


def inputs(seed: int, sites: int, ranks: int, count: int) -> list[list[np.ndarray]]:
    return [[np.random.default_rng([seed, s, r]).standard_normal(count, dtype=np.float32)
             for r in range(ranks)] for s in range(sites)]


class Checker:
    """This rank's expected result and tolerance, from every rank's input."""

    def __init__(self, spec: dict[str, Any]) -> None:
        ranks, count, sites = spec["ranks_per_site"], spec["count"], spec.get("sites", 2)
        xs = inputs(spec["seed"], sites, ranks, count)
        self.own = xs[spec["site"]][spec["rank"]]
        exact = np.zeros(count, dtype=np.float64)
        magnitude = np.zeros(count, dtype=np.float64)
        for site in xs:
            for x in site:
                exact += x
                magnitude += np.abs(x)
        tol = magnitude * (4 * sites * ranks * 2.0 ** -24)
        hops = 1 if sites == 2 else sites
        compress = spec.get("compress")
        if compress is not None:
            for site in xs:
                site_sum = site[0].copy()
                for x in site[1:]:
                    site_sum += x
                for piece in _codec_slices(count, ranks, spec.get("chunk_bytes")):
                    # the codec sees each rank's slice of the site's sum
                    tol[piece] += 2.02 * hops * error_bound(compress, site_sum[piece]).astype(np.float64)
        # Checked in float32 against bounds rounded outward from the float64 ones: the
        # float64 verdict (bounds never tightened, widened by under one float32 ulp) at a
        # quarter of the CPU (0.06 against 0.24 CPU-s per 16 M elements; 0.7 s of wall at
        # load 8, 32 % of a rank's py-spy samples). A rank that finished first ran it while
        # its own last bytes and the peer's tail were still on the 2 cores.
        self.lo = _rounded(exact - tol, -np.inf)
        self.hi = _rounded(exact + tol, np.inf)
        self.exact = exact.astype(np.float32)
        self.tol = np.maximum(tol, 1e-30).astype(np.float32)
        self._scratch = np.empty(count, dtype=np.float32)
        # Two ranks, no compression: the sum has one float32 addition per element, the same
        # whatever the order, so a plain numpy sum is the exact expected result, bit for bit.
        two = sites == 2 and ranks == 1 and compress is None
        self.plain = xs[0][0] + xs[1][0] if spec.get("bitwise") and two else None

    def check(self, result: np.ndarray) -> tuple[bool, float]:
        """Every element within its bound (and, where ``plain`` is set, bitwise equal to it),
        and the largest error as a fraction of the bound."""
        ok = bool(np.all(result >= self.lo) and np.all(result <= self.hi))
        if self.plain is not None:
            ok = ok and bool(np.array_equal(result.view(np.uint32), self.plain.view(np.uint32)))
        err = self._scratch
        np.subtract(result, self.exact, out=err)
        np.abs(err, out=err)
        np.divide(err, self.tol, out=err)
        return ok, float(np.max(err))

    def verdict(self, result: np.ndarray) -> tuple[bool, float, str]:
        """``check`` and the result's digest (the runner compares ranks'), in one call for a thread."""
        ok, ratio = self.check(result)
        return ok, ratio, hashlib.sha256(result.data).hexdigest()[:16]


def _codec_slices(count: int, ranks: int, chunk_bytes: int | None) -> list[slice]:
    """The pieces of the array each rank's cross-site codec encodes on its own: R = 1 the
    whole; R > 1 each rank's slice of each of the hook's chunks (``chunk_bounds``)."""
    if ranks == 1:
        return [slice(0, count)]
    from wanxport.torch.hook import DEFAULT_CHUNK_BYTES, chunk_bounds

    chunks = chunk_bounds(count, ranks, chunk_bytes or DEFAULT_CHUNK_BYTES, 4)
    return [slice(lo + r * width, min(lo + (r + 1) * width, hi))
            for lo, hi, width in chunks for r in range(ranks) if lo + r * width < hi]


def _rounded(bound: np.ndarray, direction: float) -> np.ndarray:
    """``bound`` (float64) as float32, rounded toward ``direction`` (never inward)."""
    out = bound.astype(np.float32)
    inward = out > bound if direction < 0 else out < bound
    np.nextafter(out, np.float32(direction), out=out, where=inward)
    return out


def cpu_seconds() -> float:
    """User + system CPU this rank used (setup and checks included): on a shared 2-core
    machine a CPU-bound rank shows here."""
    return round(_cpu_now(), 2)


def _cpu_now() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def session_diagnostics(endpoint: Any) -> dict[str, Any]:
    """The plain emulated transfer's diagnostics (data-path drops, pacer, per-path loss and
    window) plus the session's recovery counters: what explains a slow step."""
    stats = endpoint.stats()
    out = diagnostics(endpoint)
    out["session"] = {k: getattr(stats, k) for k in (
        "hedged_bytes", "repair_bytes", "repaired_bytes", "retransmitted_after_repair_bytes",
        "repair_blocks_rebuilt", "repair_blocks_short", "data_dropped")}
    for row, p in zip(out["paths"], stats.paths, strict=True):
        row.update(payload_bytes=p.payload_bytes, retransmitted_bytes=p.retransmitted_bytes,
                   hedged_bytes=p.hedged_bytes, repair_bytes=p.repair_bytes, bytes_sent=p.bytes_sent)
    return out


def intra_group(spec: dict[str, Any]) -> Any:
    """The site's own gloo world (R ranks on the namespace's loopback), as torchrun would make."""
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = dist.TCPStore("127.0.0.1", spec["intra_port"], spec["ranks_per_site"],
                          is_master=spec["rank"] == 0, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=spec["rank"], world_size=spec["ranks_per_site"],
                            timeout=timedelta(seconds=spec["timeout"]))
    return dist


async def wanxport_rank(spec: dict[str, Any]) -> None:
    """R = 1: the cross-site all-reduce alone, ``wanxport.collective`` on this rank's loop."""
    checker = Checker(spec)
    pki, names = spec["pki"], spec["names"]
    group = await join(spec["site"], names, identity=f"{pki}/{names[spec['site']]}", ca=f"{pki}/ca.pem",
                       timeout=spec["timeout"], join_timeout=60.0, **join_paths(spec))
    work = np.empty(spec["count"], dtype=np.float32)
    emit({"event": "ready"})
    await asyncio.to_thread(sys.stdin.readline)
    record = StepRecord(control=lambda: control_totals(group))
    try:
        for _ in range(spec["steps"]):
            await asyncio.to_thread(np.copyto, work, checker.own)
            await group.barrier()
            with record.step():
                await group.all_reduce(work, compress=spec["compress"], name="grad")
            await group.barrier()  # every rank's step has ended before any rank checks (CHECK_AFTER_ALL)
            # Off the loop: a second of numpy here starved the transport's acknowledgements
            # and pacing while the peer still waited for this rank's bytes.
            record.verdict(*await asyncio.to_thread(checker.verdict, work))
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        record.failed(exc)
    done = await group_report(group)
    await group.close()
    emit({**done, **record.report()})


def hook_rank(spec: dict[str, Any]) -> None:
    """R > 1: the DDP hook's own path (``wanxport.torch.allreduce_tensor``): the site's gloo
    world on the namespace's loopback reduce-scatters, this rank's wanxport group carries its
    slice across sites, gloo all-gathers, pipelined in the hook's chunks."""
    from wanxport.collective import join_sync
    from wanxport.torch import HookState, allreduce_tensor

    checker = Checker(spec)
    dist = intra_group(spec)
    pki, names = spec["pki"], spec["names"]
    group = join_sync(spec["site"], names, identity=f"{pki}/{names[spec['site']]}", ca=f"{pki}/ca.pem",
                      timeout=spec["timeout"], join_timeout=60.0, **join_paths(spec))
    options = {"chunk_bytes": spec["chunk_bytes"]} if spec.get("chunk_bytes") else {}
    state = HookState(group, timeout=spec["timeout"], compress=spec["compress"], **options)
    work, work_t, record = ready_for_go(spec["count"], control=functools.partial(sync_control_totals, group))
    try:
        for _ in range(spec["steps"]):
            np.copyto(work, checker.own)
            group.barrier()
            dist.barrier()
            with record.step():
                allreduce_tensor(state, work_t, name="grad").wait()
            group.barrier()  # CHECK_AFTER_ALL: the peer site's same-index rank is done,
            dist.barrier()  # and so is every rank of this site (each waited for its own peer)
            record.verdict(*checker.verdict(work))
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        record.failed(exc)
    done = asyncio.run_coroutine_threadsafe(group_report(group.group), group.loop).result()
    state.close()
    group.close()
    emit({**done, **record.report(), "chunk_bytes": state.chunk_bytes})


def join_paths(spec: dict[str, Any]) -> dict[str, Any]:
    """``join``'s paths from the spec: one list (two sites), or {peer index: [...]} (JSON keys
    are strings), and the schedule where the spec names one."""
    paths = spec["paths"]
    if isinstance(paths, dict):
        paths = {int(peer): given for peer, given in paths.items()}
    return {"paths": paths, **({"schedule": spec["schedule"]} if spec.get("schedule") else {})}


def ready_for_go(count: int, control: Callable[[], dict[str, Any]] | None = None
                 ) -> tuple[np.ndarray, Any, StepRecord]:
    """The step's float32 array and its torch view; "ready" to the runner, then wait for "go"."""
    import torch

    work = np.empty(count, dtype=np.float32)
    emit({"event": "ready"})
    sys.stdin.readline()
    return work, torch.from_numpy(work), StepRecord(control)


class StepRecord:
    """Each timed step's (start, end) on CLOCK_MONOTONIC and CPU-s, and the verdicts."""

    def __init__(self, control: Callable[[], dict[str, Any]] | None = None) -> None:
        """``control``: the rank's control channels' totals now (``control_totals``)."""
        self.control = control
        self.control_steps: dict[str, Any] = {}  # the control traffic inside the timed steps, summed
        self.steps: list[list[float]] = []
        self.step_cpu: list[float] = []  # this process's CPU-s inside each timed step (all threads)
        self.roles = threadcpu.RoleMeter()  # the same CPU by thread role, summed over the steps
        self.digests: list[str] = []
        self.worst, self.correct, self.error = 0.0, True, None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        control = self.control() if self.control is not None else None
        self.roles.start()
        t0, c0 = time.monotonic(), _cpu_now()
        yield
        self.steps.append([t0, time.monotonic()])
        self.step_cpu.append(round(_cpu_now() - c0, 3))
        self.roles.stop()
        if self.control is not None and control is not None:
            counters.add(self.control_steps, counters.difference(self.control(), control))

    def verdict(self, ok: bool, ratio: float, digest: str) -> None:
        self.correct, self.worst = self.correct and ok, max(self.worst, ratio)
        self.digests.append(digest)

    def failed(self, exc: Exception) -> None:
        self.error, self.correct = f"{type(exc).__name__}: {exc}", False

    def report(self) -> dict[str, Any]:
        return {"event": "done", "steps": self.steps, "correct": self.correct,
                "worst_error_ratio": self.worst, "digests": self.digests, "error": self.error,
                "cpu_s": cpu_seconds(), "step_cpu_s": self.step_cpu,
                "cpu": threadcpu.rounded(self.roles.total),
                "control_per_step": per_step(self.control_steps, len(self.steps)) if self.control else None}


def control_totals(group: Any) -> dict[str, Any]:
    """The rank's control channels (one per peer site) counted together (``control.counters``);
    on the group's loop."""
    total: dict[str, Any] = {}
    for link in group.links.values():
        counters.add(total, link.session.channel.counters.totals())
    return total


def per_step(summed: dict[str, Any], steps: int) -> dict[str, Any]:
    """Control traffic per step: the steps' sum over their number, by type too."""
    if not steps:
        return {}
    return {key: ({k: round(n / steps, 2) for k, n in value.items()} if isinstance(value, dict)
                  else round(value / steps, 6 if key == "cpu_s" else 2))
            for key, value in summed.items()}


def sync_control_totals(group: Any) -> dict[str, Any]:
    """``control_totals`` of a ``join_sync`` group, read on its loop thread."""
    async def read() -> dict[str, Any]:
        return control_totals(group.group)
    return asyncio.run_coroutine_threadsafe(read(), group.loop).result()


async def group_report(group: Any) -> dict[str, Any]:
    """This rank's per-path bytes, collective bytes and session diagnostics (on the group's loop)."""
    paths = [[p.payload_bytes, p.retransmitted_bytes, p.srtt_s, p.state]
             for stats in group.path_stats().values() for p in stats]
    reduces = [s for s in group.stats() if s.op == "all_reduce"]
    sent = sum(s.sent_bytes for s in reduces)
    received = sum(s.received_bytes for s in reduces)
    diag = {link.name: session_diagnostics(link.session.endpoint) for link in group.links.values()}
    chosen = [[s.schedule, s.predicted_s, len(s.plan.relayed()) if s.plan else 0] for s in reduces]
    planner = getattr(group, "planner", None)
    plan = planner.covering(reduces[-1].seq) if planner is not None and reduces else None
    mesh = {"rate_Bps": [[round(r) for r in row] for row in plan.mesh.rate],
            "delay_s": [[round(d, 4) for d in row] for row in plan.mesh.delay]} if plan else None
    return {"paths": paths, "collective_bytes_sent": sent, "collective_bytes_received": received,
            "diag": diag, "schedules": chosen, "mesh": mesh}


def gloo_world(spec: dict[str, Any]) -> Any:
    """The flat gloo world of both sites' ranks (contiguous per site), its device bound to the
    best route's interface; returns ``torch.distributed``."""
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    ranks = spec["ranks_per_site"]
    dist.init_process_group("gloo", init_method=f"tcp://{spec['master']}:{spec['master_port']}",
                            rank=spec["site"] * ranks + spec["rank"], world_size=spec.get("sites", 2) * ranks,
                            timeout=timedelta(seconds=spec["timeout"]))
    return dist


def gloo_rank(spec: dict[str, Any]) -> None:
    checker = Checker(spec)
    dist = gloo_world(spec)
    work, work_t, record = ready_for_go(spec["count"])
    try:
        for _ in range(spec["steps"]):
            work[:] = checker.own
            dist.barrier()
            with record.step():
                dist.all_reduce(work_t)
            dist.barrier()  # CHECK_AFTER_ALL
            record.verdict(*checker.verdict(work))
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        record.failed(exc)
    dist.destroy_process_group()
    emit({**record.report(), "paths": [], "collective_bytes_sent": None})


def gloo_striped_rank(spec: dict[str, Any]) -> None:
    """One gloo process group per route, each on a device bound to that route's interface;
    every step all-reduces each route's stripe of the array (``spec["stripes"]``, split by
    capacity) on its route's group, all stripes in flight together, then waits for all."""
    import torch.distributed as dist
    from torch.distributed import ProcessGroupGloo

    checker = Checker(spec)
    ranks = spec["ranks_per_site"]
    rank, world = spec["site"] * ranks + spec["rank"], 2 * ranks
    timeout = timedelta(seconds=spec["timeout"])
    store = dist.TCPStore(spec["master"], spec["master_port"], world, is_master=rank == 0, timeout=timeout)
    groups = []
    for k, route in enumerate(spec["routes"]):
        options = ProcessGroupGloo._Options()
        options._devices = [ProcessGroupGloo.create_device(interface=route["ifname"])]
        options._timeout = timeout
        groups.append(ProcessGroupGloo(dist.PrefixStore(f"route{k}", store), rank, world, options))
    work, work_t, record = ready_for_go(spec["count"])
    stripes = [(groups[k], work_t[offset:offset + length])
               for k, (offset, length) in enumerate(spec["stripes"]) if length]
    barrier = groups[spec["best"]]
    try:
        for _ in range(spec["steps"]):
            work[:] = checker.own
            barrier.barrier().wait()
            with record.step():
                pending = [group.allreduce([stripe]) for group, stripe in stripes]
                for handle in pending:
                    handle.wait()
            barrier.barrier().wait()  # CHECK_AFTER_ALL
            record.verdict(*checker.verdict(work))
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        record.failed(exc)
    emit({**record.report(), "paths": [], "collective_bytes_sent": None})


def main(argv: list[str]) -> int:
    comm, spec = argv[0], json.loads(argv[1])
    if comm == "wanxport" and spec["ranks_per_site"] > 1:
        hook_rank(spec)
    elif comm == "wanxport":
        run(wanxport_rank(spec))
    elif comm == "gloo":
        gloo_rank(spec)
    elif comm == "gloo-striped":
        gloo_striped_rank(spec)
    else:
        raise SystemExit(f"unknown comm {comm!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
