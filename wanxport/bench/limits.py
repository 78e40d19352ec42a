"""The machine's own ceilings, measured in the same run as the transfer they are compared with.

Why: CPU-seconds per GB and goodput only mean something next to what this
host can do at best, minutes apart (the machines are shared, so a figure from
a README is stale). Each limit is the bare work of one part of the data path:

* ``aead``: AES-256-GCM (or the run's cipher) sealing of MTU-sized datagrams
  through the same OpenSSL, in C, no I/O (``wanxport_lab._limits.aead_seal``);
* ``digest``: the end-to-end shard digest alone (BLAKE3, ``core.digest``), and
  SHA-256 through hashlib (OpenSSL) beside it, the digest it replaced;
* ``raw-udp``: a raw UDP blast over loopback with GSO/GRO in C, no crypto, no
  protocol, one thread each end (``udp_blast_send`` / ``udp_blast_sink``).

The aead and raw-udp limits are measuring instruments in C that ship with the lab
side (``pip install 'wanxport[emulation]'``), not with the transport a gateway host
installs; without it they are skipped with one line saying so (``LabMissing``).

CPU is each thread's own CPU clock (user + system), so it holds on a loaded
host where wall-clock rates do not. Costs are per GB = 10**9 payload bytes.
The aead and digest limits are timed in slices, half before the transfer and half
after (``combine_limits``), and the report keeps each slice's cost beside the total.
"""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from typing import Any

from wanxport.aio.sockets import set_buffers
from wanxport.core.digest import DIGEST_NAME, new_hasher

GB = 1e9
DIGEST_CHUNK = 64 << 20  # the bench's shard size: the digest runs over whole shards
HEADER_TAG = 32  # wanxport header (16) + AEAD tag (16): what a sealed datagram adds
# Each limit is timed in slices, half of them before the transfer and half after. Back to
# back in one quiet process, 128 MiB slices of sealing on a 2-core VM cost 0.44-0.78
# CPU-s/GB: one slow slice moves a single pass by a third, and a ratio with it.
# Slices on both sides average over the transfer's minutes.
LIMIT_SLICES = 4


LAB_LIMITS = ("aead", "raw-udp")
LAB_HINT = "install the lab side: pip install 'wanxport[emulation]'"


class LabMissing(RuntimeError):
    """A baseline needs a measuring instrument of the lab side, which is not installed."""


def _limits() -> Any:
    try:
        from wanxport_lab import _limits  # type: ignore[attr-defined]
    except ImportError as exc:
        raise LabMissing(f"the aead and raw-udp baselines need wanxport_lab._limits ({LAB_HINT})") from exc
    return _limits


def lab_installed() -> bool:
    """Whether the lab side's measuring instruments can be imported here."""
    try:
        _limits()
    except LabMissing:
        return False
    return True


def aead_limit(cipher: str = "aes-256-gcm", datagram_bytes: int = 1472,
               total_bytes: int = 256 << 20, slices: int = LIMIT_SLICES) -> dict[str, Any]:
    """Seal ``total_bytes`` of payload in datagrams of ``datagram_bytes`` (header and tag
    included), in ``slices`` equal slices, each timed on its own."""
    body = datagram_bytes - HEADER_TAG
    count = max(1, total_bytes // body // slices)
    _limits().aead_seal(cipher, datagram_bytes, min(count, 1000))  # warm-up
    samples = []
    for _ in range(slices):
        cpu_s, _wall_s, sealed = _limits().aead_seal(cipher, datagram_bytes, count)
        samples.append((cpu_s, sealed))
    return {**_summary(samples), "datagram_bytes": datagram_bytes}


def digest_limit(total_bytes: int = 256 << 20, algorithm: str = "blake3",
                 slices: int = LIMIT_SLICES) -> dict[str, Any]:
    """The digest over ``total_bytes`` in shard-sized updates, in ``slices`` slices, on this
    thread (both hashes release the GIL and run in C): ``blake3``, the shard digest, or ``sha256``."""
    chunk = memoryview(bytes(range(256)) * (DIGEST_CHUNK // 256))
    hashers: dict[str, Any] = {"blake3": new_hasher, "sha256": hashlib.sha256}
    if algorithm not in hashers:
        raise ValueError(f"digest_limit: algorithm must be one of {sorted(hashers)}, got {algorithm!r}")
    hasher = hashers[algorithm]
    warm = hasher()
    warm.update(chunk[: 1 << 20])  # warm-up
    warm.digest()
    piece = chunk[: max(1, min(DIGEST_CHUNK, total_bytes // slices))]
    rounds = max(1, total_bytes // slices // len(piece))
    samples = []
    for _ in range(slices):
        t0 = time.thread_time()
        digest = hasher()
        for _ in range(rounds):
            digest.update(piece)
        digest.digest()
        samples.append((time.thread_time() - t0, rounds * len(piece)))
    return _summary(samples)


def _summary(samples: list[tuple[float, int]]) -> dict[str, Any]:
    """One limit from its timed slices ``(cpu_s, bytes)``: the cost over all of them, and
    each slice's, which shows how much the host's speed moved meanwhile."""
    return {**_cost(sum(cpu for cpu, _ in samples), sum(count for _, count in samples)),
            "slices_cpu_s_per_gb": [round(cpu / count * GB, 4) for cpu, count in samples]}


def _cost(cpu_s: float, done: int) -> dict[str, Any]:
    """A limit's totals: ``cpu_s`` of CPU for ``done`` bytes, and the two rates they give."""
    return {"cpu_s_per_gb": round(cpu_s / done * GB, 4), "gbytes_per_s": round(done / cpu_s / GB, 3),
            "cpu_s": round(cpu_s, 6), "bytes": done}


def combine_limits(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The limits measured on both sides of a transfer, as one: each cost over every slice
    of both, so the limit spans the same minutes of a shared host as the transfer does."""
    out = dict(before)
    for name, late in after.items():
        early = before.get(name)
        if early is None or "slices_cpu_s_per_gb" not in early:
            out[name] = late
            continue
        out[name] = {**early, **_cost(early["cpu_s"] + late["cpu_s"], early["bytes"] + late["bytes"]),
                     "slices_cpu_s_per_gb": early["slices_cpu_s_per_gb"] + late["slices_cpu_s_per_gb"]}
    return out


def raw_udp_limit(seconds: float = 2.0, datagram_bytes: int = 1472, gso: bool = True) -> dict[str, Any]:
    """A C sender blasting GSO super-buffers at a C sink (GRO on) over 127.0.0.1, each in a thread.

    Goodput is what the sink counted over its span; each end's CPU is its own
    thread's, per GB of UDP payload (the kernel's work done in those threads included).
    """
    lim = _limits()
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    send = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sink.bind(("127.0.0.1", 0))
        set_buffers(sink, recv_bytes=32 << 20)
        set_buffers(send, send_bytes=8 << 20)
        send.connect(sink.getsockname())
        got: dict[str, Any] = {}

        def drain() -> None:
            got["sink"] = lim.udp_blast_sink(sink.fileno(), 0.3, seconds + 10.0)

        thread = threading.Thread(target=drain, name="udp-blast-sink")
        thread.start()
        try:
            datagrams, sent_bytes, send_cpu, send_wall, eagain = lim.udp_blast_send(
                send.fileno(), seconds, datagram_bytes, gso)
        finally:
            thread.join()
        _, received, sink_cpu, span = got["sink"]
    finally:
        sink.close()
        send.close()
    rate = received * 8 / span if span > 0 else 0.0
    return {"goodput_bps": round(rate), "sent_bps": round(sent_bytes * 8 / send_wall),
            "delivered": round(received / sent_bytes, 4) if sent_bytes else 0.0,
            "cpu_s_per_gb": {"sender": round(send_cpu / sent_bytes * GB, 4) if sent_bytes else None,
                             "receiver": round(sink_cpu / received * GB, 4) if received else None},
            "datagram_bytes": datagram_bytes, "gso": gso, "datagrams_sent": datagrams,
            "send_eagain": eagain}


BASELINES = ("iperf3", "raw-udp", "aead", "digest")
SLICED_LIMITS = ("aead", "digest")  # timed in slices, before and after the transfer


def expand_baselines(chosen: list[str] | None) -> list[str]:
    """``--baseline`` values (repeatable; ``all`` for every one) in a fixed order, no repeats."""
    names = set(chosen or ())
    if "all" in names:
        names = set(BASELINES)
    return [name for name in BASELINES if name in names]


def measure_limits(names: list[str], cipher: str, mtu: int) -> dict[str, Any]:
    """The limits (not iperf3, which has its own fields) ``names`` asks for, for ``mtu``:
    the bench measures the sliced ones (aead, digest) again after the transfer
    (``combine_limits``); raw-udp runs once, before, since it loads both cores for seconds."""
    datagram = mtu - 28  # IPv4 + UDP headers
    out: dict[str, Any] = {}
    if "aead" in names:
        out["aead"] = aead_limit(cipher, datagram)
    if "digest" in names:
        out["digest"] = {**digest_limit(), "algorithm": DIGEST_NAME}
        out["digest_sha256"] = digest_limit(algorithm="sha256")  # for reference: not in the ratios
    if "raw-udp" in names:
        out["raw_udp"] = raw_udp_limit(datagram_bytes=datagram)
    return out


def compare_with_limits(report: dict[str, Any], limits: dict[str, Any]) -> None:
    """Add the ratios against the limits: each end's CPU per GB against AEAD + digest,
    goodput against the raw UDP blast. Only what both sides of a ratio were measured for."""
    report["limits"] = limits
    cpu = report.get("cpu_s_per_gb")
    if cpu and "aead" in limits and "digest" in limits:
        floor = limits["aead"]["cpu_s_per_gb"] + limits["digest"]["cpu_s_per_gb"]
        report["cpu_limit_s_per_gb"] = round(floor, 4)
        report["cpu_vs_limit"] = {end: round(value / floor, 2) for end, value in cpu.items()}
    if "raw_udp" in limits and "goodput_bps" in report and limits["raw_udp"]["goodput_bps"]:
        report["goodput_vs_raw_udp"] = round(report["goodput_bps"] / limits["raw_udp"]["goodput_bps"], 4)
