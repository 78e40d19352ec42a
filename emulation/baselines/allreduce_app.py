"""One rank of ``python -m emulation allreduce``: runs in a gateway namespace.

    python -m emulation.baselines.allreduce_app wanxport '<json spec>'
    python -m emulation.baselines.allreduce_app gloo '<json spec>'

Runner protocol as the other baselines: ``{"event": "ready"}`` once set up (group
joined / process group initialised, inputs generated), "go" on stdin, then
``{"event": "done", ...}`` with each step's (start, end) on CLOCK_MONOTONIC (shared
by all namespaces), whether every step's result was correct, a digest of each
step's result (the runner checks all ranks agree) and this rank's bytes.

wanxport, R ranks per site: rank r of each site forms a two-site wanxport group with
rank r of the other site on its own ports. Each step: a reduce-scatter inside the
site (gloo over the namespace's loopback), an all-reduce of this rank's 1/R slice
across sites over wanxport, an all-gather inside the site. With R = 1 only the
cross-site all-reduce. gloo: one flat torch.distributed world of 2R ranks (ranks
contiguous per site), ``GLOO_SOCKET_IFNAME`` the best route's interface.

Every rank's input is seeded by (seed, site, rank) and is the same at every step;
each rank regenerates all inputs to check its result: without compression within
float32 summation error of the float64 sum, with compression within the codec's
bound (``wanxport.collective.error_bound``) of this step and the residual carried
from the last (error feedback), i.e. ``2.02 x`` the per-site bounds, plus the former.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import resource
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

from emulation.baselines.tcp_app import emit
from emulation.baselines.wanxport_app import diagnostics
from wanxport.aio.loop import run
from wanxport.collective import error_bound, join


def inputs(seed: int, sites: int, ranks: int, count: int) -> list[list[np.ndarray]]:
    return [[np.random.default_rng([seed, s, r]).standard_normal(count, dtype=np.float32)
             for r in range(ranks)] for s in range(sites)]


class Checker:
    """This rank's expected result and tolerance, from every rank's input."""

    def __init__(self, spec: dict[str, Any]) -> None:
        ranks, count = spec["ranks_per_site"], spec["count"]
        xs = inputs(spec["seed"], 2, ranks, count)
        self.own = xs[spec["site"]][spec["rank"]]
        exact = np.zeros(count, dtype=np.float64)
        magnitude = np.zeros(count, dtype=np.float64)
        for site in xs:
            for x in site:
                exact += x
                magnitude += np.abs(x)
        tol = magnitude * (4 * 2 * ranks * 2.0 ** -24)
        compress = spec.get("compress")
        if compress is not None:
            part = count // ranks
            for site in xs:
                site_sum = site[0].copy()
                for x in site[1:]:
                    site_sum += x
                for r in range(ranks):  # the codec sees each rank's slice of the site's sum
                    piece = slice(r * part, (r + 1) * part)
                    tol[piece] += 2.02 * error_bound(compress, site_sum[piece]).astype(np.float64)
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

    def check(self, result: np.ndarray) -> tuple[bool, float]:
        """Every element within its bound, and the largest error as a fraction of the bound."""
        ok = bool(np.all(result >= self.lo) and np.all(result <= self.hi))
        err = self._scratch
        np.subtract(result, self.exact, out=err)
        np.abs(err, out=err)
        np.divide(err, self.tol, out=err)
        return ok, float(np.max(err))

    def verdict(self, result: np.ndarray) -> tuple[bool, float, str]:
        """``check`` and the result's digest (the runner compares ranks'), in one call for a thread."""
        ok, ratio = self.check(result)
        return ok, ratio, hashlib.sha256(result.data).hexdigest()[:16]


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
    stats = endpoint.session.stats()
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
    checker = Checker(spec)
    ranks, count = spec["ranks_per_site"], spec["count"]
    dist = intra_group(spec) if ranks > 1 else None
    pki = spec["pki"]
    names = spec["names"]
    group = await join(spec["site"], names, identity=f"{pki}/{names[spec['site']]}", ca=f"{pki}/ca.pem",
                       paths=spec["paths"], timeout=spec["timeout"], join_timeout=60.0)
    work = np.empty(count, dtype=np.float32)
    part = count // ranks
    piece = np.empty(part, dtype=np.float32)
    if dist is not None:
        import torch

        work_t, piece_t = torch.from_numpy(work), torch.from_numpy(piece)
    emit({"event": "ready"})
    await asyncio.to_thread(sys.stdin.readline)
    steps, digests, worst, correct, error = [], [], 0.0, True, None
    step_cpu: list[float] = []  # this process's CPU-s inside each timed step (all threads)
    try:
        for _ in range(spec["steps"]):
            await asyncio.to_thread(np.copyto, work, checker.own)
            await group.barrier()
            if dist is not None:
                await asyncio.to_thread(dist.barrier)
            t0, c0 = time.monotonic(), _cpu_now()
            if dist is None:
                await group.all_reduce(work, compress=spec["compress"], name="grad")
            else:
                await asyncio.to_thread(dist.reduce_scatter_tensor, piece_t, work_t)
                await group.all_reduce(piece, compress=spec["compress"], name="grad")
                await asyncio.to_thread(dist.all_gather_into_tensor, work_t, piece_t)
            t1 = time.monotonic()
            steps.append([t0, t1])
            step_cpu.append(round(_cpu_now() - c0, 3))
            # Off the loop: a second of numpy here starved the transport's acknowledgements
            # and pacing while the peer still waited for this rank's bytes.
            ok, ratio, digest = await asyncio.to_thread(checker.verdict, work)
            correct, worst = correct and ok, max(worst, ratio)
            digests.append(digest)
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        error, correct = f"{type(exc).__name__}: {exc}", False
    paths = [[p.payload_bytes, p.retransmitted_bytes, p.srtt_s, p.state]
             for stats in group.path_stats().values() for p in stats]
    sent = sum(s.sent_bytes for s in group.stats() if s.op == "all_reduce")
    diag = {link.name: session_diagnostics(link.session.endpoint) for link in group.links.values()}
    await group.close()
    emit({"event": "done", "steps": steps, "correct": correct, "worst_error_ratio": worst,
          "digests": digests, "paths": paths, "collective_bytes_sent": sent, "error": error,
          "cpu_s": cpu_seconds(), "step_cpu_s": step_cpu, "diag": diag})


def gloo_rank(spec: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    checker = Checker(spec)
    os.environ["GLOO_SOCKET_IFNAME"] = spec["ifname"]
    ranks = spec["ranks_per_site"]
    dist.init_process_group("gloo", init_method=f"tcp://{spec['master']}:{spec['master_port']}",
                            rank=spec["site"] * ranks + spec["rank"], world_size=2 * ranks,
                            timeout=timedelta(seconds=spec["timeout"]))
    work = np.empty(spec["count"], dtype=np.float32)
    work_t = torch.from_numpy(work)
    emit({"event": "ready"})
    sys.stdin.readline()
    steps, digests, worst, correct, error = [], [], 0.0, True, None
    try:
        for _ in range(spec["steps"]):
            work[:] = checker.own
            dist.barrier()
            t0 = time.monotonic()
            dist.all_reduce(work_t)
            t1 = time.monotonic()
            steps.append([t0, t1])
            ok, ratio = checker.check(work)
            correct, worst = correct and ok, max(worst, ratio)
            digests.append(hashlib.sha256(work.data).hexdigest()[:16])
    except Exception as exc:  # noqa: BLE001 - reported to the runner, which fails the run
        error, correct = f"{type(exc).__name__}: {exc}", False
    dist.destroy_process_group()
    emit({"event": "done", "steps": steps, "correct": correct, "worst_error_ratio": worst,
          "digests": digests, "paths": [], "collective_bytes_sent": None, "error": error,
          "cpu_s": cpu_seconds()})


def main(argv: list[str]) -> int:
    comm, spec = argv[0], json.loads(argv[1])
    if comm == "wanxport":
        run(wanxport_rank(spec))
    elif comm == "gloo":
        gloo_rank(spec)
    else:
        raise SystemExit(f"unknown comm {comm!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
