"""Shared helpers of the gateway tests: free ports, PKI, CLI processes, one shard's transfer."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from wanxport.control import ControlProtocolError, Hello, ShardAnnounce, messages
from wanxport.core.digest import shard_digest_hex
from wanxport.gateway import handshake
from wanxport.gateway.session import GatewaySession
from wanxport.wire import native
from wanxport.wire.frames import PaddingFrame, encode_frames
from wanxport.wire.header import encode_header

ROOT = Path(__file__).resolve().parent.parent


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_PORTS = random.Random(os.getpid())  # distinct sequences for concurrent test runs


def _worker_slice(low: int, high: int) -> tuple[int, int]:
    """This test worker's share of [low, high): with the suite in several processes
    (pytest-xdist) each draws from its own slice, so two workers never pick the same
    ports between one's check and its gateway's bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if not worker.startswith("gw") or not worker[2:].isdigit() or count < 2:
        return low, high
    share = (high - low) // count
    index = int(worker[2:]) % count
    return low + index * share, low + (index + 1) * share


def free_path_ports(count: int) -> list[int]:
    """``count`` consecutive path ports (PORT, PORT+1, ...), all free right now.

    Consecutive on purpose: each path is one UDP port for data and control, so
    neighbouring ports must work as separate paths. Drawn below the kernel's
    ephemeral range, so no socket bound to port 0 (in this process, a gateway
    subprocess or anything else on the host) can take one between this check
    and the gateway binding it.
    """
    low, high = _worker_slice(10_000, _ephemeral_low() - count)
    while True:
        first = _PORTS.randrange(low, high)
        ports = list(range(first, first + count))
        socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in ports]
        try:
            for sock, port in zip(socks, ports, strict=True):
                sock.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        return ports


def cli(*args: str, prefix: tuple[str, ...] = ()) -> list[str]:
    return [*prefix, sys.executable, "-m", "wanxport", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def start(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    return subprocess.Popen(cli(*args, prefix=prefix), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env())


def run(*args: str, timeout: float = 60, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli(*args, prefix=prefix), capture_output=True, text=True, timeout=timeout,
                          env=env())


def stop(proc: subprocess.Popen[str], timeout: float = 10) -> tuple[str, str]:
    if proc.poll() is None:
        proc.terminate()
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def wait_listening(proc: subprocess.Popen[str], port: int, timeout: float = 20) -> None:
    """Until the receiver's path port is bound (the port cannot be bound by us)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"receiver exited: {proc.communicate()}")
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                return
        time.sleep(0.02)
    raise TimeoutError("receiver did not start listening")


async def transfer(sender: GatewaySession, receiver: GatewaySession, shard_id: int, data: bytes) -> bool:
    """Send ``data`` as one shard and receive it; True when both ends agree it is intact."""
    return await transfer_all(sender, receiver, {shard_id: data})


async def transfer_all(sender: GatewaySession, receiver: GatewaySession, shards: dict[int, bytes]) -> bool:
    """Send the shards concurrently and receive them in whatever order they complete.

    True when every shard was acknowledged as verified and arrived byte for byte.
    """
    async def receive() -> bool:
        intact = True
        for _ in shards:
            got = await receiver.receive()
            await receiver.complete(got.shard_id, "verified" if got.ok else "integrity-failure")
            intact = intact and got.ok and bytes(got.data) == shards.get(got.shard_id)
        return intact

    sends = [sender.send_shard(shard_id, data, ShardAnnounce(shard_id, len(data), shard_digest_hex(data), 0))
             for shard_id, data in shards.items()]
    *sent, received = await asyncio.gather(*sends, receive())
    return all(sent) and received


def throw_hostile_datagrams(sender: GatewaySession, rng: random.Random) -> int:
    """61 bad datagrams at the receiver from the sender's own addresses (past the
    kernel's connected-socket filter): 40 garbage, 20 well-formed headers with a
    forged tag, and one replay of packet number 0 sealed with the real key.

    Returns how many of the garbage ones look like QUIC (first byte & 0x40): on
    the receiver's shared port those go to aioquic, which drops and counts them
    (``reason="quic"``); the data path counts the rest."""
    socks = sender.endpoint.sockets
    quic = 0
    for i in range(40):
        garbage = rng.randbytes(rng.randrange(1, 1500))
        quic += bool(garbage[0] & 0x40)
        socks[i % 2].send(garbage)
    conn = sender.endpoint.config.remote_conn_id
    for i in range(20):
        socks[0].send(encode_header(0, conn, 10_000_000 + i) + rng.randbytes(200))
    keys = sender.keys.current
    replay = native.Protector(keys.cipher, keys.key, keys.iv)
    socks[1].send(replay.seal(encode_header(1, conn, 0), encode_frames([PaddingFrame(64)])))
    return quic


def speak_3_only(monkeypatch: pytest.MonkeyPatch, side: str) -> list[int]:
    """Make one side of the in-process pair behave as a protocol 3 gateway: as initiator it
    offers 3; as responder it refuses any other Hello as version 3 did. Both decoders then
    refuse protocol 4's fields, as a protocol 3 gateway's would (so a field sent to it
    fails the session). Returns the versions the responder was offered."""
    offered: list[int] = []
    real_answer, real_decode = handshake.answer_hello, messages.message_from_dict

    def answer_as_3(hello: Hello, **kwargs: Any) -> Any:
        offered.append(hello.version)
        if side == "responder" and hello.version != 3:  # protocol 3's answer_hello, word for word
            raise ControlProtocolError(f"hello.version: {hello.version} is not supported; "
                                       "this gateway speaks 3")
        return real_answer(hello, **kwargs)

    def decode_as_3(obj: Any) -> Any:
        newer = set(messages.SINCE_VERSION_4.get(obj.get("type"), ())) & set(obj)
        if newer:
            raise ControlProtocolError(f"{obj['type']}: unknown field(s) {sorted(newer)}")
        return real_decode(obj)

    monkeypatch.setattr(handshake, "answer_hello", answer_as_3)
    monkeypatch.setattr(messages, "message_from_dict", decode_as_3)
    if side == "initiator":
        monkeypatch.setattr(handshake, "PROTOCOL_VERSION", 3)
    return offered


@contextmanager
def loopback_netns(prefix: str) -> Iterator[str]:
    """A new network namespace with only ``lo`` up, named ``<prefix>-<random>``; removed,
    with every process still in it, however the test ends. Skips the test (with the
    reason) without root, iproute2 or nftables."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    if shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs iproute2 and nftables")
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split()
        for pid in pids:
            subprocess.run(["kill", "-9", pid], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
