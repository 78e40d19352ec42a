"""Loopback transfer benchmark: a sender and a receiver process, K paths, AEAD on.

The sender (this process) and the receiver (a spawned child) each run one
``Endpoint`` on uvloop with one UDP socket per path on 127.0.0.1. The payload
is random; the receiver hashes what it got and the sender compares with the
hash of what it sent. The session is the gateway preset's (``wanxport.presets``)
unless the spec sets other values; the report names those (``preset_overrides``).

Completion runs from the moment the sender starts the shard digests — hashed while the
shards are sent, as the API's ``send`` does with a peer of protocol 5, or all before the
first datagram with ``digest_first`` — to the last shard verified at the receiver (both
processes read CLOCK_MONOTONIC); ``verdict_s`` is when the sender holds every verdict,
``digest_s`` when its last digest was known.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import os
import select
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import IO, Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from wanxport.aio import threadcpu
from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket
from wanxport.aio.endpoint import Allocator, Endpoint, ReceivedShard
from wanxport.aio.loop import run
from wanxport.aio.native_path import NativeDatapath
from wanxport.bench.child import module_command
from wanxport.core.config import SessionConfig
from wanxport.core.digest import shard_digest
from wanxport.presets import GATEWAY, Preset, overrides
from wanxport.presets import session_config as preset_session_config
from wanxport.report import PathReport, build_report

SENDER_CONN_ID, RECEIVER_CONN_ID = 1, 2
CHILD_START_TIMEOUT_S = 30.0  # interpreter start, imports, sockets
CHILD_TOUCH_S_PER_GIB = 8.0  # a warm receiver zeroes its buffers before it reports its ports
CLOSE_WAIT_S = 5.0


@dataclass(frozen=True)
class TransferSpec:
    paths: int
    size: int
    mtu: int
    cipher: str
    datapath: str  # "native" | "python"
    segments: int  # datagrams per core packet
    shards: int
    seed: int
    timeout_s: float
    # The endpoint's own pacer defaults (aio.config), which the gateway runs: a burst
    # window of 0.5 ms lets a path at ~1 Gb/s and above leave in full 64 KB GSO sends.
    pacer_spin_ns: int = 0
    pacer_burst_ns: int = 500_000
    fresh_buffers: bool = False  # never-touched receive buffers and pacer rings (warm_allocator)
    fec: str = GATEWAY.fec  # the erasure-coded tail (SessionConfig.fec)
    workers: int = 1  # data-path worker threads at each end (EndpointConfig.workers)
    ack_every: int | None = None  # the receiver's ack_threshold (None: the preset's)
    ack_delay_s: float = GATEWAY.ack_delay_s  # its max_ack_delay_s
    # Hash every shard before the first datagram leaves; False: the shards open unhashed and
    # each digest follows once hashed (core.late_digest), as the API sends to a peer of 5.
    digest_first: bool = False


def shard_sizes(size: int, shards: int) -> list[int]:
    count = max(1, min(shards, size))
    base, extra = divmod(size, count)
    return [base + (1 if i < extra else 0) for i in range(count)]


def random_payload(size: int, seed: int) -> bytes:
    """Seeded pseudo-random bytes at GB/s: the AES-CTR keystream of a key derived from the seed."""
    key = hashlib.sha256(f"wanxport-bench:{seed}".encode()).digest()
    encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
    return encryptor.update(bytes(size)) + encryptor.finalize()


def spec_preset(spec: TransferSpec) -> Preset:
    """The gateway preset with what the spec sets; the receive budget grows to hold
    two of the largest shards when they exceed the preset's credit."""
    budget = max(GATEWAY.credit_bytes, 2 * max(shard_sizes(spec.size, spec.shards)))
    return dataclasses.replace(GATEWAY, mtu=spec.mtu, segments=spec.segments, credit_bytes=budget,
                               ack_delay_s=spec.ack_delay_s, fec=spec.fec)


def session_config(spec: TransferSpec) -> SessionConfig:
    config = preset_session_config([f"lo{i}" for i in range(spec.paths)], spec_preset(spec))
    if spec.ack_every is not None:
        config = dataclasses.replace(config, ack_threshold=spec.ack_every)
    return config


def preset_overrides(spec: TransferSpec) -> dict[str, Any]:
    """What this run changed from the gateway preset users run (empty: nothing)."""
    changed = overrides(GATEWAY, spec_preset(spec))
    if spec.ack_every is not None:
        changed["ack_threshold"] = spec.ack_every
    return changed


def endpoint_config(spec: TransferSpec, send: DirectionKey, recv: DirectionKey, local: int,
                    remote: int) -> EndpointConfig:
    sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in range(spec.paths))
    return EndpointConfig(session_config(spec), sockets, send, recv, local_conn_id=local,
                          remote_conn_id=remote, datapath=spec.datapath,
                          receive_holdoff_s=spec_preset(spec).receive_holdoff_s,
                          pacer_spin_ns=spec.pacer_spin_ns, pacer_burst_ns=spec.pacer_burst_ns,
                          workers=spec.workers)


# -- receiver process ----------------------------------------------------------


def receiver_main() -> None:
    """Child process entry (this module as ``__main__``): one JSON line in, lines out.

    In: the spec, both keys and the sender's addresses. Out: ``["ports", addrs]``,
    then ``["ok", result]`` or ``["error", text]``. A plain subprocess instead of
    multiprocessing: it does not re-import the caller's ``__main__``.
    """
    try:
        job = json.loads(sys.stdin.readline())
        spec = TransferSpec(**job["spec"])
        send, recv = (DirectionKey(k["cipher"], bytes.fromhex(k["key"]), bytes.fromhex(k["iv"]))
                      for k in (job["send"], job["recv"]))
        addrs = [(str(h), int(p)) for h, p in job["sender"]]
        _emit("ok", run(_receive(spec, send, recv, addrs)))
    except BaseException as exc:  # the parent reports it; nothing may escape silently
        _emit("error", f"receiver: {type(exc).__name__}: {exc}")


def child_start_timeout_s(spec: TransferSpec) -> float:
    """How long the receiver may take to report its ports.

    Why it grows with the size: ``warm_allocator`` touches every destination page first,
    which took over 20 s for 8 GiB on a 2-core VM; a fixed limit failed such runs.
    """
    touched = 0 if spec.fresh_buffers else spec.size
    return CHILD_START_TIMEOUT_S + CHILD_TOUCH_S_PER_GIB * touched / 2**30


def _emit(kind: str, value: Any) -> None:
    sys.stdout.write(json.dumps([kind, value]) + "\n")
    sys.stdout.flush()


def warm_allocator(spec: TransferSpec) -> Allocator:
    """Destination buffers allocated and touched before the clock starts, as a training step
    receives into tensors it already owns (the same every step).

    Why: the first write to a fresh page makes the kernel zero it, and on these VMs
    that cost the receiver about as much CPU as everything else it does per GB (half
    its samples were ``clear_page_erms``). That is the cost of new memory, paid once
    per buffer, not of moving bytes; ``fresh_buffers`` measures it, for a first step.
    """
    pool: dict[int, np.ndarray[Any, Any]] = {}
    for shard_id, size in enumerate(shard_sizes(spec.size, spec.shards)):
        pool[shard_id] = np.empty(size, dtype=np.uint8)
        pool[shard_id].fill(0)

    def allocate(shard_id: int, size: int, meta: bytes) -> np.ndarray[Any, Any]:
        buffer = pool.pop(shard_id, None)
        return buffer if buffer is not None and len(buffer) == size else np.empty(size, dtype=np.uint8)

    return allocate


async def _receive(spec: TransferSpec, send: DirectionKey, recv: DirectionKey,
                   sender_addrs: list[tuple[str, int]]) -> dict[str, Any]:
    allocator = None if spec.fresh_buffers else warm_allocator(spec)
    endpoint = Endpoint(endpoint_config(spec, send, recv, RECEIVER_CONN_ID, SENDER_CONN_ID), allocator)
    try:
        endpoint.connect(sender_addrs)
        _emit("ports", endpoint.local_addresses)
        cpu_start = threadcpu.snapshot()
        endpoint.start()
        expected = len(shard_sizes(spec.size, spec.shards))
        got: dict[int, ReceivedShard] = {}
        while len(got) < expected:
            shard = await asyncio.wait_for(endpoint.receive_shard(), spec.timeout_s)
            got[shard.shard_id] = shard
        cpu = threadcpu.roles_between(cpu_start, threadcpu.snapshot())
        done_at = max(s.at for s in got.values())
        digest = hashlib.sha256()
        for shard_id in sorted(got):
            digest.update(got[shard_id].data)
        try:  # stay until the sender has our SHARD_DONEs (it closes then)
            await asyncio.wait_for(endpoint.wait_closed(), CLOSE_WAIT_S)
        except TimeoutError:
            pass
        return {"done_at": done_at, "sha256": digest.hexdigest(), "ok": all(s.ok for s in got.values()),
                "bytes": sum(len(s.data) for s in got.values()),
                "rejected": endpoint.datagrams_rejected, "counters": dict(endpoint.datapath.counters),
                "data_runs": endpoint.intake.data_runs, "data_records": endpoint.intake.data_records,
                "cpu": cpu}
    finally:
        await endpoint.close()


# -- sender (this process) -----------------------------------------------------


def run_transfer(spec: TransferSpec) -> dict[str, Any]:
    """Run one transfer; return the v1 report (``intact`` False on timeout or mismatch)."""
    wall_start = time.perf_counter()
    a_to_b = DirectionKey(spec.cipher, os.urandom(32), os.urandom(12))
    b_to_a = DirectionKey(spec.cipher, os.urandom(32), os.urandom(12))
    payload = random_payload(spec.size, spec.seed)
    sizes = shard_sizes(spec.size, spec.shards)
    bounds = np.cumsum([0, *sizes]).tolist()
    view = memoryview(payload)
    shards = [view[bounds[i]:bounds[i + 1]] for i in range(len(sizes))]
    payload_sha = hashlib.sha256(payload).hexdigest()
    endpoint = Endpoint(endpoint_config(spec, a_to_b, b_to_a, SENDER_CONN_ID, RECEIVER_CONN_ID))
    child: subprocess.Popen[bytes] | None = None
    try:
        child = subprocess.Popen(module_command("wanxport.bench.transfer"), stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, bufsize=0)
        job = {"spec": asdict(spec), "send": _key_json(b_to_a), "recv": _key_json(a_to_b),
               "sender": endpoint.local_addresses}
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps(job).encode() + b"\n")
        child.stdin.close()
        value = _expect(child.stdout, "ports", child_start_timeout_s(spec))
        endpoint.connect([(str(h), int(p)) for h, p in value])
        if not spec.fresh_buffers and isinstance(endpoint.datapath, NativeDatapath):
            # The pacer rings' pages, zeroed by the kernel on first touch, are the
            # endpoint's own memory, reused for every later step: like the receiver's
            # buffers (warm_allocator), touched before the clock starts.
            endpoint.datapath.make_rings_resident()
        cpu_start = threadcpu.snapshot()  # the shard digests are the sender's work too
        started = endpoint.clock()  # the user's call: the digests are inside the clock
        digests = None
        if spec.digest_first:
            with threadcpu.hashing():
                digests = [shard_digest(s) for s in shards]
        digests_at = endpoint.clock()
        sent = run(_send(endpoint, shards, digests, spec.timeout_s, cpu_start))
        sent["started"] = started
        sent["digest_s"] = sent.get("digests_at", digests_at) - started
        result = _expect(child.stdout, "ok", spec.timeout_s)
    finally:
        endpoint.abort()
        if child is not None:
            _reap(child)
    return _report(spec, endpoint, sent, result, payload_sha, time.perf_counter() - wall_start)


def _key_json(key: DirectionKey) -> dict[str, str]:
    return {"cipher": key.cipher, "key": key.key.hex(), "iv": key.iv.hex()}


def _expect(stream: IO[bytes], kind: str, timeout_s: float) -> Any:
    """The receiver's next message, which must be ``kind``; its error text otherwise.

    The pipe is unbuffered, so select() sees every line not yet read.
    """
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise TimeoutError(f"no word from the receiver process within {timeout_s:.0f} s")
    line = stream.readline()
    if not line:
        raise RuntimeError("the receiver process exited without a result")
    got, value = json.loads(line)
    if got != kind:
        raise RuntimeError(str(value))
    return value


def _reap(child: subprocess.Popen[bytes]) -> None:
    try:
        child.wait(CLOSE_WAIT_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
    finally:
        if child.stdout is not None:
            child.stdout.close()


async def _send(endpoint: Endpoint, shards: list[memoryview], digests: list[bytes] | None,
                timeout_s: float, cpu_start: threadcpu.CpuSnapshot) -> dict[str, Any]:
    """Send and wait for every verdict; the CPU is read before the close stops the release
    threads (an ended thread's clock can no longer be read by its role).

    ``digests`` None: every shard leaves unhashed and one worker thread hashes them in the
    order they are sent, each digest handed to the session as soon as it is known."""
    endpoint.start()
    out: dict[str, Any] = {}
    try:
        if digests is None:
            futures = [endpoint.submit(i, s, digest_later=True) for i, s in enumerate(shards)]
            loop = asyncio.get_running_loop()

            def hash_all() -> None:
                for i, shard in enumerate(shards):
                    with threadcpu.hashing():
                        digest = shard_digest(shard)
                    # Read here, not when the thread is joined: the receiver may verify the
                    # last shard before the loop gets round to the join.
                    out["digests_at"] = endpoint.clock()
                    loop.call_soon_threadsafe(endpoint.set_digest, i, digest)

            await asyncio.to_thread(hash_all)
        else:
            futures = [endpoint.submit(i, s, digest=d) for i, (s, d) in enumerate(zip(shards, digests,
                                                                                     strict=True))]
        verdicts = await asyncio.wait_for(asyncio.gather(*futures), timeout_s)
        return {**out, "acked_at": endpoint.clock(), "verdicts": verdicts,
                "cpu": threadcpu.roles_between(cpu_start, threadcpu.snapshot())}
    finally:
        await endpoint.close()


def _report(spec: TransferSpec, endpoint: Endpoint, sent: dict[str, Any], received: dict[str, Any],
            payload_sha: str, wall_s: float) -> dict[str, Any]:
    intact = (received["sha256"] == payload_sha and received["ok"] and all(sent["verdicts"])
              and received["bytes"] == spec.size)
    pacer_stats = endpoint.datapath.pacer.stats() if spec.datapath == "native" else None
    paths = []
    for i, path in enumerate(endpoint.stats().paths):
        extra: dict[str, Any] = {"packets_lost": path.packets_lost,
                                 "spurious_losses": path.spurious_losses,
                                 "pacing_rate_bps": round(path.pacing_rate_bps),
                                 "cwnd_bytes": path.cwnd_bytes, "packet_bytes": path.packet_bytes,
                                 "packets_sent": path.packets_sent,
                                 "bandwidth_bps": round(path.bandwidth_bps), "min_rtt_s": path.min_rtt_s,
                                 "cc_state": path.cc_state, "repair_bytes": path.repair_bytes}
        if pacer_stats is not None:
            extra.update(datagrams_sent=pacer_stats[i].sent_datagrams, gso_sends=pacer_stats[i].gso_sends,
                         send_eagain=pacer_stats[i].eagain)
        paths.append(PathReport(path.name, path.payload_bytes, path.retransmitted_bytes, path.srtt_s,
                                path.state, extra))
    return build_report(
        scenario=f"loopback-{spec.paths}x{spec.mtu}", mode="loopback", transport="wanxport",
        payload_bytes=spec.size, completion_s=received["done_at"] - sent["started"], ideal_s=None,
        intact=intact, wall_s=wall_s, paths=paths,
        delivered_bytes=received["bytes"] if intact else 0,
        verdict_s=round(sent["acked_at"] - sent["started"], 6), digest_s=round(sent["digest_s"], 6),
        preset=GATEWAY.name, preset_overrides=preset_overrides(spec),
        pacer=endpoint.datapath.pacer.name if spec.datapath == "native" else None,
        cipher=spec.cipher, datapath=spec.datapath, digest_first=spec.digest_first,
        datagrams_rejected=received["rejected"] + endpoint.datagrams_rejected,
        segments_per_packet=spec.segments, shards=len(shard_sizes(spec.size, spec.shards)),
        mtu=spec.mtu, fresh_buffers=spec.fresh_buffers, workers=spec.workers,
        receiver_counters=received["counters"], fec=spec.fec,
        repair_bytes=endpoint.stats().repair_bytes,
        receiver_data_runs=received["data_runs"], receiver_data_records=received["data_records"],
        cpu={"sender": threadcpu.rounded(sent["cpu"]), "receiver": threadcpu.rounded(received["cpu"])},
        cpu_s_per_gb={"sender": threadcpu.cpu_s_per_gb(sent["cpu"], spec.size),
                      "receiver": threadcpu.cpu_s_per_gb(received["cpu"], spec.size)},
        loop_cpu_s_per_gb={"sender": round(sent["cpu"]["loop"] / spec.size * 1e9, 4),
                           "receiver": round(received["cpu"]["loop"] / spec.size * 1e9, 4)},
        **_sender_breakdown(spec, endpoint, sent),
    )


def _sender_breakdown(spec: TransferSpec, endpoint: Endpoint, sent: dict[str, Any]) -> dict[str, Any]:
    """What the sender's threads did per GB (their CPU is ``cpu``): the release threads'
    wake-ups per GB tell a pacer that sleeps per datagram from one that sleeps per burst;
    the loop's events per GB (ACKs decoded, services, plans, timer wake-ups) turn its CPU into
    CPU per event."""
    if not isinstance(endpoint.datapath, NativeDatapath):
        return {}
    pacer = endpoint.datapath.pacer_thread_stats()
    per_gb = 1e9 / spec.size
    events = endpoint.loop_events()
    return {"sender_loop_events_per_gb": {k: round(v * per_gb) for k, v in events.items()},
            "pacer_sleeps_per_gb": round(pacer.sleeps * per_gb),
            "pacer_send_rounds_per_gb": round(pacer.send_rounds * per_gb)}


if __name__ == "__main__":
    receiver_main()
