"""Gateway sessions in one process: key rotation, hostile datagrams, control failover."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from gateway_helpers import free_path_ports

from wanxport.control import RotationLimits, ShardAnnounce
from wanxport.control.certs import make_test_pki
from wanxport.gateway import rekey
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession, sha256_hex
from wanxport.wire import native
from wanxport.wire.frames import PaddingFrame, encode_frames
from wanxport.wire.header import encode_header

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


async def pair(pki: Path, n_paths: int, options: GatewayOptions
               ) -> tuple[GatewayListener, GatewaySession, GatewaySession]:
    listens = [("127.0.0.1", p) for p in free_path_ports(n_paths)]
    listener = GatewayListener(listens, pki / "gw-b", pki / "ca.pem", options)
    await listener.start()
    sender = await initiate(listens, pki / "gw-a", pki / "ca.pem", options)
    receiver = await listener.accept()
    return listener, sender, receiver


async def transfer(sender: GatewaySession, receiver: GatewaySession, shard_id: int, data: bytes) -> bool:
    announce = ShardAnnounce(shard_id, len(data), sha256_hex(data), 0)

    async def receive() -> bool:
        got = await receiver.receive()
        await receiver.complete(got.shard_id, "verified" if got.ok else "integrity-failure")
        return got.ok and bytes(got.data) == data

    sent, received = await asyncio.gather(sender.send_shard(shard_id, data, announce), receive())
    return sent and received


async def test_keys_rotate_during_a_transfer(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rekey, "MIN_PHASE_LIFETIME_S", 0.0)
    options = GatewayOptions(rotation=RotationLimits(bytes=2 << 20))
    listener, sender, receiver = await pair(pki, 2, options)
    try:
        data = random.Random(3).randbytes(24 << 20)
        for shard_id in range(3):
            assert await transfer(sender, receiver, shard_id, data[shard_id * (8 << 20):][:8 << 20])
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    assert sender.keys.rotations >= 2
    assert receiver.keys.peer_phase == sender.keys.rotations
    counters = receiver.endpoint.datapath.counters
    assert counters["opened_phase0"] > 0 and counters["opened_phase1"] > 0


async def test_hostile_datagrams_are_counted_and_transfer_stays_exact(pki: Path) -> None:
    listener, sender, receiver = await pair(pki, 2, GatewayOptions())
    rng = random.Random(11)
    try:
        first = rng.randbytes(4 << 20)
        assert await transfer(sender, receiver, 0, first)
        socks = sender.endpoint.sockets  # the sender's own addresses: past the kernel's filter
        for i in range(40):
            socks[i % 2].send(rng.randbytes(rng.randrange(1, 1500)))
        conn = sender.endpoint.config.remote_conn_id
        for i in range(20):  # well-formed header, forged tag
            socks[0].send(encode_header(0, conn, 10_000_000 + i) + rng.randbytes(200))
        keys = sender.keys.current
        replay = native.Protector(keys.cipher, keys.key, keys.iv)
        socks[1].send(replay.seal(encode_header(1, conn, 0), encode_frames([PaddingFrame(64)])))
        second = rng.randbytes(4 << 20)
        assert await transfer(sender, receiver, 1, second)
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    counters = receiver.endpoint.datapath.counters
    assert receiver.datagrams_rejected == 61
    assert counters["rejected_replay"] == 1 and counters["rejected_auth"] >= 20


async def test_control_moves_to_another_path_when_its_path_dies(pki: Path) -> None:
    options = GatewayOptions(control_timeout_s=0.5)
    listener, sender, receiver = await pair(pki, 2, options)
    try:
        assert listener.server is not None
        listener.server.kill_listener(0)  # the control path goes dark; the data paths stay
        data = os.urandom(8 << 20)
        assert await transfer(sender, receiver, 0, data)
        assert await transfer(sender, receiver, 1, data[::-1])
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    assert sender.channel.reconnects_total >= 1  # type: ignore[attr-defined]
