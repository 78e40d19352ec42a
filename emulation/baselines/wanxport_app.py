"""Sender and receiver of ``--transport wanxport``: the asyncio ``Endpoint`` in each gateway.

    python -m emulation.baselines.wanxport_app recv '<json spec>'   # in gateway b
    python -m emulation.baselines.wanxport_app send '<json spec>'   # in gateway a

Same runner protocol as ``tcp_app``. One UDP socket per path on each side,
bound to that path's address and pinned to its interface (SO_BINDTODEVICE),
connected to the peer's address on the same path. The AEAD keys of the two
directions are pre-shared: the runner draws them at random per run and passes
them in the spec (the control channel's job in a deployment; not measured here).

The sender generates the payload before "go" (it must be in memory for the
session to send from), gives each shard's digest (BLAKE3) to the session so the
receiver verifies it, and samples every path's payload counter every
``SAMPLE_S`` for the report's ``timeline`` (per-path goodput over time).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import resource
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from emulation.baselines import payload
from emulation.baselines.tcp_app import emit, run_async_role
from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket, offload_chunk_bytes
from wanxport.aio.endpoint import Endpoint, ReceivedShard
from wanxport.aio.loop import run
from wanxport.core.cc import cc_config
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.digest import shard_digest

SENDER_CONN_ID, RECEIVER_CONN_ID = 1, 2
# Datagrams per core packet: the core decides per core packet, the native data
# path segments it (a lost datagram re-sends only its own bytes, and the ones
# that arrived still count as delivered for BBR). Python's cost is per core
# packet, and this 2-core VM runs sender, receiver and engine at once:
# hetero-8path took 14.1-14.7 s with 8, 13.0-13.3 s with 16, 13.2 s with 32.
SEGMENTS = 16
ACK_THRESHOLD = 2 * SEGMENTS  # datagrams between ACKs (the core also acks on gaps and after 5 ms)
SAMPLE_S = 0.1
CLOSE_WAIT_S = 5.0
PROBE_TIMEOUT_S = 5.0


def _key(raw: dict[str, str]) -> DirectionKey:
    return DirectionKey(raw["cipher"], bytes.fromhex(raw["key"]), bytes.fromhex(raw["iv"]))


def endpoint_config(spec: dict[str, Any], sender: bool) -> EndpointConfig:
    """Both sides build the same session (same paths in the same order)."""
    paths = tuple(PathConfig(p["name"], int(p["mtu"])) for p in spec["paths"])
    budget = max(1 << 30, 2 * max(length for _, length in payload.split(spec["size"],
                                                                         spec["shards"])))
    session = SessionConfig(paths=paths, congestion_control=cc_config(spec.get("cc") or "bbr"),
                            fec=spec.get("fec") or "auto",
                            chunk_bytes=offload_chunk_bytes(paths, SEGMENTS),
                            receive_budget_bytes=budget, peer_credit_bytes=budget,
                            ack_threshold=ACK_THRESHOLD)
    sockets = tuple(PathSocket((p["local"], p["port"]), (p["remote"], p["port"]), p["device"])
                    for p in spec["paths"])  # one UDP port per path, the same at both ends
    forward, backward = _key(spec["keys"]["forward"]), _key(spec["keys"]["backward"])
    return EndpointConfig(
        session, sockets, send_key=forward if sender else backward,
        recv_key=backward if sender else forward,
        local_conn_id=SENDER_CONN_ID if sender else RECEIVER_CONN_ID,
        remote_conn_id=RECEIVER_CONN_ID if sender else SENDER_CONN_ID)


# -- receiver ----------------------------------------------------------------


def resident_destination(slices: list[tuple[int, int]], steps: int = 1
                         ) -> Callable[[int, int, bytes], memoryview]:
    """Shard buffers in one array whose pages are faulted in before the transfer.

    Step k's shard i (id ``k * len(slices) + i``) lands in shard i's buffer, as a
    training job's gradient buffers are reused every step.

    A training job receives into gradient buffers that are already resident;
    a fresh array would have the kernel zero 1 GiB of pages during the
    transfer (5 % of this 2-core machine's CPU in perf). The TCP baselines
    stream into one reused buffer, so they never pay it either.
    """
    total = sum(length for _, length in slices)
    data = np.empty(total, dtype=np.uint8)
    data.fill(0)
    view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers

    def allocate(shard_id: int, size: int, meta: bytes) -> memoryview:
        if not 0 <= shard_id < len(slices) * steps:
            raise ValueError(f"shard {shard_id}: the run has shards 0..{len(slices) * steps - 1}")
        offset, length = slices[shard_id % len(slices)]  # every step reuses the same buffers
        if length != size:
            raise ValueError(f"shard {shard_id}: {size} bytes announced, {length} expected")
        return view[offset:offset + length]

    return allocate


async def receive(spec: dict[str, Any]) -> None:
    slices = payload.split(spec["size"], spec["shards"])
    steps = int(spec.get("steps", 1))
    endpoint = Endpoint(endpoint_config(spec, sender=False),
                        allocator=resident_destination(slices, steps))
    got: dict[int, ReceivedShard] = {}
    endpoint.start()
    emit({"event": "listening"})
    total = len(slices) * steps
    try:
        try:
            while len(got) < total:
                shard = await endpoint.receive_shard()
                got[shard.shard_id] = shard
        except asyncio.CancelledError:
            pass
        complete = len(got) == total and all(s.ok for s in got.values())
        last = {i - (steps - 1) * len(slices): s for i, s in got.items() if i >= (steps - 1) * len(slices)}
        emit({"event": "done", "complete": complete, "diag": diagnostics(endpoint),
              "t_end": max(s.at for s in got.values()) if complete else None,
              "bytes": sum(len(s.data) for s in got.values() if s.ok),
              # Every shard's verification time (the host's monotonic clock, as the sender's).
              "verified": [[i, s.at] for i, s in sorted(got.items()) if s.ok],
              # The buffers hold the last step (each step overwrites them): its bytes are checked.
              "slices": [{"peer": None, "offset": slices[i][0], "length": slices[i][1],
                          "received": len(s.data), "sha256": hashlib.sha256(s.data).hexdigest()}
                         for i, s in sorted(last.items())]})
        if complete:
            try:  # stay until the sender has our acknowledgements (it closes then)
                await asyncio.wait_for(endpoint.wait_closed(), CLOSE_WAIT_S)
            except TimeoutError:
                pass
    finally:
        await endpoint.close()


# -- sender ------------------------------------------------------------------


async def send(spec: dict[str, Any]) -> None:
    size = spec["size"]
    data = np.empty(size, dtype=np.uint8)
    pos = 0
    for chunk in payload.chunks(spec["seed"], 0, size):
        data[pos:pos + len(chunk)] = np.frombuffer(chunk, dtype=np.uint8)
        pos += len(chunk)
    view = memoryview(data)  # type: ignore[arg-type]  # numpy arrays are buffers
    slices = payload.split(size, spec["shards"])
    digests = [shard_digest(view[o:o + n]) for o, n in slices]  # the session's end-to-end check
    checks = [hashlib.sha256(view[o:o + n]).hexdigest() for o, n in slices]  # the harness's, as every app's
    endpoint = Endpoint(endpoint_config(spec, sender=True))
    endpoint.start()
    heard = await endpoint.probe_paths(PROBE_TIMEOUT_S)  # the receiver is listening already
    emit({"event": "ready", "paths_answered": sum(heard)})
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    t0 = endpoint.clock()
    sampler = Sampler(endpoint, t0)
    sampling = asyncio.create_task(sampler.run())
    verdicts: list[bool] = []
    steps = int(spec.get("steps", 1))
    think_s = float(spec.get("think_ms", 0.0)) / 1000.0
    submitted: list[float] = []
    try:
        for step in range(steps):
            # Step k+1 goes think_ms after this sender learns step k verified (DESIGN.md section 4).
            if step and think_s > 0:
                await asyncio.sleep(think_s)
            submitted.append(endpoint.clock())
            base = step * len(slices)
            futures = [endpoint.submit(base + i, view[o:o + n], digest=d)
                       for i, ((o, n), d) in enumerate(zip(slices, digests, strict=True))]
            verdicts.extend(await asyncio.gather(*futures))
    except asyncio.CancelledError:
        pass
    finally:
        sampling.cancel()
    sampler.record()
    emit({"event": "done", "t0": t0, "finished": len(verdicts) == len(slices) * steps,
          "verdicts": verdicts, "submitted": submitted,
          "slices": [{"src": None, "offset": o, "length": n, "sha256": check}
                     for (o, n), check in zip(slices, checks, strict=True)],
          "paths": [{"name": p.name, "payload_bytes": p.payload_bytes,
                     "retransmitted_bytes": p.retransmitted_bytes, "srtt_s": p.srtt_s,
                     "state": p.state, "packets_lost": p.packets_lost, "hedged_bytes": p.hedged_bytes,
                     "repair_bytes": p.repair_bytes}
                    for p in endpoint.session.stats().paths],
          "timeline": sampler.timeline, "diag": diagnostics(endpoint)})
    await endpoint.close()


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
    out: dict[str, Any] = {"udp": udp_counters(), "data_runs": endpoint.data_runs,
                           "data_records": endpoint.data_records, "receive_passes": endpoint.receive_passes,
                           "holdoff_yields": endpoint.holdoff_yields,
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
                    for p in endpoint.session.stats().paths]
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
    """Each path's payload bytes per ``SAMPLE_S``: the report's ``timeline``."""

    def __init__(self, endpoint: Endpoint, t0: float) -> None:
        self.endpoint = endpoint
        self.t0 = t0
        self.last = {p.name: 0 for p in endpoint.session.stats().paths}
        self.timeline: list[dict[str, Any]] = []

    async def run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.record()

    def record(self) -> None:
        now = round(self.endpoint.clock() - self.t0, 4)
        for p in self.endpoint.session.stats().paths:
            delta = p.payload_bytes - self.last[p.name]
            if delta:
                self.timeline.append({"t_s": now, "path": p.name, "bytes": delta})
                self.last[p.name] = p.payload_bytes


def main(argv: list[str]) -> int:
    return run_async_role(argv, receive, send, run)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
