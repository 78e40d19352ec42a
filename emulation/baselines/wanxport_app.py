"""Sender and receiver of ``--transport wanxport``: the Python API users run, in each gateway.

    python -m emulation.baselines.wanxport_app recv '<json spec>'   # in gateway b
    python -m emulation.baselines.wanxport_app send '<json spec>'   # in gateway a

Same runner protocol as ``tcp_app``. The receiver listens with ``wanxport.api.listen``
on each path's address and port, the sender ``connect``s to them: mutual TLS over the
QUIC control channel with the run's certificates (``spec["pki"]``, made by the runner),
keys from that channel, every shard's digest announced there and verified at the
receiver before its verdict comes back. The session's tuning is the gateway preset
(``wanxport.presets.GATEWAY``); what a run changes (the scenario's MTU and congestion
control, a larger credit for shards over half of it, ``--fec off``) is reported as
``preset_overrides``.

The sender generates the payload and sets the session up before "go" (a training
job's session persists across steps); the clock of each step starts at its
``send`` calls, so the digests the API computes are inside it. The sender samples
every path's payload counter every ``SAMPLE_S`` for the report's ``timeline``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import resource
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from emulation.baselines import payload
from emulation.baselines.tcp_app import emit, run_async_role
from wanxport.aio import threadcpu
from wanxport.aio.endpoint import Endpoint
from wanxport.aio.loop import run
from wanxport.api import GatewayOptions, Peer, ShardFailed, connect, listen
from wanxport.gateway.session import digest_hex_async
from wanxport.presets import GATEWAY, Preset, overrides

SAMPLE_S = 0.1
CLOSE_WAIT_S = 5.0
CONTROL = "quic"  # how the session was set up and keyed: the API's only way


def run_preset(spec: dict[str, Any]) -> Preset:
    """The gateway preset with what this run must change: the paths' MTU, the chosen
    congestion control and erasure-code mode, and a credit holding two of the largest
    shards (the sender may keep that many in flight)."""
    largest = max(length for _, length in payload.split(spec["size"], spec["shards"]))
    return dataclasses.replace(
        GATEWAY, mtu=min(int(p["mtu"]) for p in spec["paths"]),
        congestion_control=spec.get("cc") or GATEWAY.congestion_control,
        fec=spec.get("fec") or GATEWAY.fec, credit_bytes=max(GATEWAY.credit_bytes, 2 * largest))


def gateway_options(spec: dict[str, Any]) -> GatewayOptions:
    return GatewayOptions.from_preset(run_preset(spec))


def identity(spec: dict[str, Any], sender: bool) -> tuple[str, str]:
    """This side's certificate prefix and the CA, from the runner's PKI directory."""
    pki = Path(spec["pki"])
    return str(pki / spec["names"]["sender" if sender else "receiver"]), str(pki / "ca.pem")


# -- receiver ----------------------------------------------------------------


async def receive(spec: dict[str, Any]) -> None:
    """Every step's shard i lands in shard i's slice of one resident array.

    A training job receives into gradient buffers that are already resident and
    reused every step; a fresh array would have the kernel zero 1 GiB of pages
    during the transfer (5 % of this 2-core machine's CPU in perf). The TCP
    baselines stream into one reused buffer, so they never pay it either.
    """
    slices = payload.split(spec["size"], spec["shards"])
    steps = int(spec.get("steps", 1))
    data = np.empty(spec["size"], dtype=np.uint8)
    data.fill(0)
    me, ca = identity(spec, sender=False)
    listens = [(p["local"], int(p["port"])) for p in spec["paths"]]
    total = len(slices) * steps
    got: dict[int, tuple[bool, float, int]] = {}  # shard id -> (ok, verified_at, bytes)
    cpu: dict[str, float] | None = None  # CPU-s per thread role over the transfer (aio.threadcpu)
    async with listen(me, ca, listens, gateway_options(spec)) as server:
        for step in range(steps):
            for i, (offset, length) in enumerate(slices):
                server.expect(step * len(slices) + i, data[offset:offset + length])
        emit({"event": "listening"})
        peer: Peer | None = None
        try:
            try:
                peer = await server.accept()
                cpu_start = threadcpu.snapshot()  # the session is set up: the transfer's CPU from here
                while len(got) < total:
                    shard = await peer.receive()
                    got[shard.shard_id] = (shard.ok, shard.verified_at, shard.array.nbytes)
                cpu = threadcpu.roles_between(cpu_start, threadcpu.snapshot())
            except asyncio.CancelledError:
                pass
            complete = len(got) == total and all(ok for ok, _, _ in got.values())
            endpoint = peer.session.endpoint if peer is not None else None
            emit({"event": "done", "complete": complete, "control": CONTROL,
                  "cpu": threadcpu.rounded(cpu) if cpu is not None else None,
                  # the sender's certificate name, as mutual TLS verified it
                  "peer": peer.peer_name if peer is not None else None,
                  "diag": diagnostics(endpoint) if endpoint is not None else None,
                  "t_end": max(at for _, at, _ in got.values()) if complete else None,
                  "bytes": sum(n for ok, _, n in got.values() if ok),
                  # Every shard's verification time (the host's monotonic clock, as the sender's).
                  "verified": [[i, at] for i, (ok, at, _) in sorted(got.items()) if ok],
                  # The buffers hold the last step (each step overwrites them): its bytes are checked.
                  "slices": [{"peer": None, "offset": o, "length": n, "received": n,
                              "sha256": hashlib.sha256(data[o:o + n].data).hexdigest()}
                             for o, n in slices] if complete else []})
            if complete and peer is not None:
                try:  # stay until the sender has our verdicts (it closes then)
                    await asyncio.wait_for(peer.session.wait_ended(), CLOSE_WAIT_S)
                except TimeoutError:
                    pass
        finally:
            if peer is not None:
                await _close(peer)


# -- sender ------------------------------------------------------------------


async def send(spec: dict[str, Any]) -> None:
    size = spec["size"]
    data = np.empty(size, dtype=np.uint8)
    pos = 0
    for chunk in payload.chunks(spec["seed"], 0, size):
        data[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        pos += len(chunk)
    slices = payload.split(size, spec["shards"])
    # The harness's own check, as every app's (the session verifies its digests itself).
    checks = [hashlib.sha256(data[o:o + n].data).hexdigest() for o, n in slices]
    me, ca = identity(spec, sender=True)
    remotes = [(p["remote"], int(p["port"])) for p in spec["paths"]]
    setup_start = time.monotonic()
    peer = await connect(me, ca, remotes, gateway_options(spec))
    setup_s = time.monotonic() - setup_start
    endpoint = peer.session.endpoint
    emit({"event": "ready", "paths_agreed": len(endpoint.stats().paths)})
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = time.monotonic()
    cpu_start = threadcpu.snapshot()
    sampler = Sampler(endpoint, t0, [p["name"] for p in spec["paths"]])
    sampling = asyncio.create_task(sampler.run())
    verdicts: list[bool] = []
    steps = int(spec.get("steps", 1))
    think_s = float(spec.get("think_ms", 0.0)) / 1000.0
    submitted: list[float] = []
    verdict_at: list[float] = []
    try:
        for step in range(steps):
            # Step k+1 goes think_ms after this sender learns step k verified (docs/design.md section 4).
            if step and think_s > 0:
                await asyncio.sleep(think_s)
            submitted.append(time.monotonic())
            base = step * len(slices)
            results = await asyncio.gather(
                *(peer.send(data[o:o + n], shard_id=base + i, step=step) for i, (o, n) in enumerate(slices)),
                return_exceptions=True)
            verdict_at.append(time.monotonic())
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, ShardFailed):
                    raise result
                verdicts.append(not isinstance(result, BaseException))
    except asyncio.CancelledError:
        pass
    finally:
        sampling.cancel()
    # Before the digests are timed again below and the close stops the release threads.
    cpu = threadcpu.roles_between(cpu_start, threadcpu.snapshot())
    sampler.record()
    finished = len(verdicts) == len(slices) * steps
    emit({"event": "done", "t0": t0, "finished": finished, "control": CONTROL, "cpu": threadcpu.rounded(cpu),
          "verdicts": verdicts, "submitted": submitted, "verdict_at": verdict_at,
          "setup_s": round(setup_s, 6), "digest_s": await digest_seconds(data, slices) if finished else None,
          "preset": GATEWAY.name, "preset_overrides": overrides(GATEWAY, run_preset(spec)),
          "slices": [{"src": None, "offset": o, "length": n, "sha256": check}
                     for (o, n), check in zip(slices, checks, strict=True)],
          "paths": [{"name": name, "payload_bytes": p.payload_bytes,
                     "retransmitted_bytes": p.retransmitted_bytes, "srtt_s": p.srtt_s,
                     "state": p.state, "packets_lost": p.packets_lost, "hedged_bytes": p.hedged_bytes,
                     "repair_bytes": p.repair_bytes}
                    for name, p in zip(sampler.names, endpoint.stats().paths, strict=True)],
          "timeline": sampler.timeline, "diag": diagnostics(endpoint)})
    await _close(peer)


async def digest_seconds(data: np.ndarray[Any, Any], slices: list[tuple[int, int]]) -> float:
    """One step's shard digests, computed as ``send`` computes them (each in a thread, all
    at once), timed alone after the transfer: what hashing costs a step's clock at most
    (``send`` hashes while the shards flow, with a peer of protocol 5)."""
    start = time.monotonic()
    await asyncio.gather(*(digest_hex_async(data[o:o + n]) for o, n in slices))
    return round(time.monotonic() - start, 6)


async def _close(peer: Peer) -> None:
    try:
        await asyncio.wait_for(peer.close(), CLOSE_WAIT_S)
    except TimeoutError:
        peer.session.endpoint.abort()


def peak_rss_bytes() -> int:
    """This process's own peak resident set (``VmHWM``), not ``ru_maxrss``.

    Linux carries the peak of the image a process replaced across ``exec``
    into ``ru_maxrss``: a gateway spawned by a 1.3 GB pytest reported 1.3 GB
    though it never held more than 100 MiB. ``VmHWM`` belongs to the address
    space, which ``exec`` starts afresh.
    """
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def diagnostics(endpoint: Endpoint) -> dict[str, Any]:
    """Counters that explain a slow run: data-path drops, pacer backpressure, kernel UDP drops."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out: dict[str, Any] = {"udp": udp_counters(), "data_runs": endpoint.intake.data_runs,
                           "data_records": endpoint.intake.data_records,
                           "receive_passes": endpoint.receive_passes,
                           "holdoff_yields": endpoint.holdoff_yields,
                           "loop_events": endpoint.loop_events(),
                           # what this gateway cost: its peak memory next to its receive budget
                           "max_rss_bytes": peak_rss_bytes(), "cpu_s": usage.ru_utime + usage.ru_stime,
                           "receive_budget_bytes": endpoint.config.session.receive_budget_bytes}
    counters = getattr(endpoint.datapath, "counters", None)
    if counters is not None:
        out["receiver"] = dict(counters)
    pacer = getattr(endpoint.datapath, "pacer", None)
    if pacer is not None and not pacer.closed:
        out["pacer"] = [dataclasses.asdict(stats) for stats in pacer.stats()]
    out["paths"] = [{"packets_sent": p.packets_sent, "packets_lost": p.packets_lost,
                     "spurious_losses": p.spurious_losses, "failures": p.failures,
                     "reorder_threshold": p.reorder_threshold, "time_threshold": p.time_threshold,
                     "min_rtt_s": p.min_rtt_s, "bandwidth_bps": p.bandwidth_bps,
                     "pacing_rate_bps": p.pacing_rate_bps, "cwnd_bytes": p.cwnd_bytes,
                     "cc_state": p.cc_state, "srtt_s": p.srtt_s, "late_wakes": p.late_wakes,
                     **_rate_model(p.cc_metrics)}
                    for p in endpoint.stats().paths]
    return out


def _rate_model(figures: Mapping[str, float]) -> dict[str, float | None]:
    """A rate model's unclipped estimate and its congestion cap (None: none, or no such model)."""
    return {"max_bw_bps": figures.get("max_bw_bps"), "bw_cap_bps": figures.get("bw_cap_bps")}


def udp_counters() -> dict[str, int]:
    """This namespace's UDP counters from /proc/net/snmp (RcvbufErrors = socket overflow)."""
    try:
        with open("/proc/net/snmp") as fh:
            rows = [line.split() for line in fh if line.startswith("Udp:")]
    except OSError:
        return {}
    if len(rows) < 2:
        return {}
    return {k: int(v) for k, v in zip(rows[0][1:], rows[1][1:], strict=False)}


class Sampler:
    """Each path's payload bytes per ``SAMPLE_S``: the report's ``timeline``, by the
    scenario's path names (the session numbers its paths in the same order)."""

    def __init__(self, endpoint: Endpoint, t0: float, names: list[str]) -> None:
        self.endpoint = endpoint
        self.t0 = t0
        self.names = names
        self.last = [0] * len(names)
        self.timeline: list[dict[str, Any]] = []

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.record()

    def record(self) -> None:
        now = round(self.endpoint.clock() - self.t0, 4)
        for i, p in enumerate(self.endpoint.stats().paths):
            delta = p.payload_bytes - self.last[i]
            if delta:
                self.timeline.append({"t_s": now, "path": self.names[i], "bytes": delta})
                self.last[i] = p.payload_bytes


def main(argv: list[str]) -> int:
    return run_async_role(argv, receive, send, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
