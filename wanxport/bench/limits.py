"""The machine's own ceilings, measured in the same run as the transfer they are compared with.

Why: CPU-seconds per GB and goodput only mean something next to what this
host can do at best, minutes apart (the machines are shared, so a figure from
a README is stale). Each limit is the bare work of one part of the data path:

* ``aead``: AES-256-GCM (or the run's cipher) sealing of MTU-sized datagrams
  through the same OpenSSL, in C, no I/O (``wanxport._limits.aead_seal``);
* ``digest``: the end-to-end shard digest alone (BLAKE3, ``core.digest``), and
  SHA-256 through hashlib (OpenSSL) beside it, the digest it replaced;
* ``raw-udp``: a raw UDP blast over loopback with GSO/GRO in C, no crypto, no
  protocol, one thread each end (``udp_blast_send`` / ``udp_blast_sink``).

CPU is each thread's own CPU clock (user + system), so it holds on a loaded
host where wall-clock rates do not. Costs are per GB = 10**9 payload bytes.
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


def _limits() -> Any:
    from wanxport import _limits  # type: ignore[attr-defined]

    return _limits


def aead_limit(cipher: str = "aes-256-gcm", datagram_bytes: int = 1472,
               total_bytes: int = 512 << 20) -> dict[str, float]:
    """Seal ``total_bytes`` of payload in datagrams of ``datagram_bytes`` (header and tag included)."""
    body = datagram_bytes - HEADER_TAG
    count = max(1, total_bytes // body)
    _limits().aead_seal(cipher, datagram_bytes, min(count, 1000))  # warm-up
    cpu_s, wall_s, sealed = _limits().aead_seal(cipher, datagram_bytes, count)
    return {"cpu_s_per_gb": round(cpu_s / sealed * GB, 4), "gbytes_per_s": round(sealed / cpu_s / GB, 3),
            "datagram_bytes": datagram_bytes}


def digest_limit(total_bytes: int = 512 << 20, algorithm: str = "blake3") -> dict[str, float]:
    """The digest over ``total_bytes`` in shard-sized updates, on this thread (both hashes
    release the GIL and run in C): ``blake3``, the shard digest, or ``sha256``."""
    chunk = memoryview(bytes(range(256)) * (DIGEST_CHUNK // 256))
    hashers: dict[str, Any] = {"blake3": new_hasher, "sha256": hashlib.sha256}
    if algorithm not in hashers:
        raise ValueError(f"digest_limit: algorithm must be one of {sorted(hashers)}, got {algorithm!r}")
    hasher = hashers[algorithm]
    warm = hasher()
    warm.update(chunk[: 1 << 20])  # warm-up
    warm.digest()
    rounds = max(1, total_bytes // DIGEST_CHUNK)
    t0 = time.thread_time()
    digest = hasher()
    for _ in range(rounds):
        digest.update(chunk)
    digest.digest()
    cpu_s = time.thread_time() - t0
    done = rounds * DIGEST_CHUNK
    return {"cpu_s_per_gb": round(cpu_s / done * GB, 4), "gbytes_per_s": round(done / cpu_s / GB, 3)}


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


def expand_baselines(chosen: list[str] | None) -> list[str]:
    """``--baseline`` values (repeatable; ``all`` for every one) in a fixed order, no repeats."""
    names = set(chosen or ())
    if "all" in names:
        names = set(BASELINES)
    return [name for name in BASELINES if name in names]


def measure_limits(names: list[str], cipher: str, mtu: int) -> dict[str, Any]:
    """The limits (not iperf3, which has its own fields) ``names`` asks for, for ``mtu``."""
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
    """Add the ratios the issue asks for: each end's CPU per GB against AEAD + digest,
    goodput against the raw UDP blast. Only what both sides of a ratio were measured for."""
    report["limits"] = limits
    cpu = report.get("cpu_s_per_gb")
    if cpu and "aead" in limits and "digest" in limits:
        floor = limits["aead"]["cpu_s_per_gb"] + limits["digest"]["cpu_s_per_gb"]
        report["cpu_limit_s_per_gb"] = round(floor, 4)
        report["cpu_vs_limit"] = {end: round(value / floor, 2) for end, value in cpu.items()}
    if "raw_udp" in limits and "goodput_bps" in report and limits["raw_udp"]["goodput_bps"]:
        report["goodput_vs_raw_udp"] = round(report["goodput_bps"] / limits["raw_udp"]["goodput_bps"], 4)
