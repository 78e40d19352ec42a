"""Gateway sessions in one process: key rotation, hostile datagrams, control failover."""

from __future__ import annotations

import asyncio
import os
import random
import socket
from pathlib import Path

import pytest
from gateway_helpers import free_path_ports, throw_hostile_datagrams, transfer

from wanxport.control import RotationLimits, ShardAnnounce
from wanxport.control.certs import make_test_pki
from wanxport.core.digest import shard_digest_hex
from wanxport.gateway import handshake, rekey
from wanxport.gateway import session as gateway_session
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession, SessionFailed

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


async def test_keys_rotate_during_a_transfer(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rekey, "MIN_PHASE_LIFETIME_S", 0.0)
    # The session checks its limits every 50 ms; 24 MiB over loopback now takes less than
    # that (8-9 Gb/s), so at that pace one rotation or two was a matter of timing.
    monkeypatch.setattr(gateway_session, "ROTATION_CHECK_S", 0.002)
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
        quic = throw_hostile_datagrams(sender, rng)  # 40 garbage, 20 forged, 1 replayed
        second = rng.randbytes(4 << 20)
        assert await transfer(sender, receiver, 1, second)
        quic_dropped = listener.port_counters.get("quic", 0)
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    counters = receiver.endpoint.datapath.counters
    assert quic > 0 and quic_dropped == quic  # the QUIC-looking garbage went to aioquic
    assert receiver.datagrams_rejected == 61 - quic
    assert counters["rejected_replay"] == 1 and counters["rejected_auth"] >= 20


def fake_initial(rng: random.Random) -> bytes:
    """A full-size QUIC v1 Initial (1200 bytes) with random ids and an undecryptable payload."""
    head = bytes([0xC3]) + (1).to_bytes(4, "big") + b"\x08" + rng.randbytes(8) + b"\x08" + rng.randbytes(8)
    body = 1200 - len(head) - 3  # token length (1 byte) + payload length (2-byte varint)
    return head + b"\x00" + (0x4000 | body).to_bytes(2, "big") + rng.randbytes(body)


@pytest.mark.parametrize("datapath", ["native", "python"])
async def test_forged_quic_on_a_shared_port_is_counted_and_dropped(pki: Path, datapath: str) -> None:
    """Two consecutive ports, each carrying a path's data and the QUIC control channel:
    QUIC-looking forgeries aimed at them during a transfer (random bytes with 0x40 set,
    fake Initials) reach aioquic through the data path's demultiplexing, are dropped and
    counted (reason "quic"), leave no connection behind, and the transfer stays exact."""
    listener, sender, receiver = await pair(pki, 2, GatewayOptions(datapath=datapath))
    rng = random.Random(17)
    assert listener.server is not None and listener.listens[1][1] == listener.listens[0][1] + 1
    connections = sum(len(server._protocols) for server in listener.server._listeners)
    forged = [bytes([rng.randrange(256) | 0x40]) + rng.randbytes(rng.randrange(0, 1400))
              for _ in range(30)] + [fake_initial(rng) for _ in range(4)]
    try:
        data = rng.randbytes(6 << 20)
        moving = asyncio.ensure_future(transfer(sender, receiver, 0, data))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as attacker:
            for i, datagram in enumerate(forged):
                attacker.sendto(datagram, listener.listens[i % 2])
            assert await moving
            # The forgeries are read before the next transfer's data (one socket per path, in order).
            assert await transfer(sender, receiver, 1, data[::-1])
        counts = listener.port_counters
        drops = dict(listener.server.quic_drops.reasons)
        after = sum(len(server._protocols) for server in listener.server._listeners)
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    # Late datagrams of a real control connection are legitimate traffic, not the forgeries:
    # after it closed (a re-dial under load) "closed_connection"; a handshake flight re-sent
    # on a busy host finds its keys discarded or its packet seen ("key_unavailable",
    # "duplicate"). A forgery cannot reach a connection's keys.
    late = sum(drops.pop(reason, 0) for reason in ("closed_connection", "key_unavailable", "duplicate"))
    assert counts.get("quic", 0) - late == len(forged) == sum(drops.values()), (counts, drops, late)
    assert drops.get("payload_decrypt_error", 0) >= 4  # the fake Initials opened nothing
    assert after == connections  # ... and left no connection state
    assert receiver.datagrams_rejected == 0  # none of it reached the data plane's opener
    assert receiver.endpoint.handoff.unclaimed == 0  # each went to its port's control side
    assert receiver.endpoint.datapath.counters["passed_quic"] >= len(forged)  # + the real control


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


async def test_control_leaves_a_path_the_data_plane_failed_without_its_idle_timeout(pki: Path) -> None:
    """Only a FAILED verdict on the control link's own path re-dials it: the initiator's
    endpoint tells its listeners, and a transfer still goes through afterwards."""
    from wanxport.core.events import PathChanged

    options = GatewayOptions(control_timeout_s=30.0)
    listener, sender, receiver = await pair(pki, 2, options)
    try:
        def tell(path_id: int, new: str) -> None:
            for notify in sender.endpoint.path_listeners:
                notify(PathChanged(path_id, f"path{path_id}", "active", new, 0.0))

        via = sender.channel.via
        tell(0, "degraded")  # suspected only: it may still answer
        tell(1, "failed")  # not the path the control link runs over
        assert sender.channel.via == via and sender.channel.reconnects_total == 0  # type: ignore[attr-defined]
        tell(0, "failed")
        data = os.urandom(4 << 20)
        assert await asyncio.wait_for(transfer(sender, receiver, 0, data), 10)
        assert sender.channel.reconnects_total == 1  # type: ignore[attr-defined]
    finally:
        await sender.close()
        await receiver.close()
        listener.close()


async def test_a_warm_session_keeps_nothing_per_answered_shard(pki: Path) -> None:
    """Announcements (receiver) and verdicts (sender, once read and forgotten) do not
    pile up over a session that carries many shards."""
    listener, sender, receiver = await pair(pki, 1, GatewayOptions())
    try:
        data = random.Random(5).randbytes(64 << 10)
        for shard_id in range(20):
            assert await transfer(sender, receiver, shard_id, data)
            assert sender.verdict(shard_id) == "verified"
            sender.forget([shard_id])
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
    assert sender.verdict(0) is None
    assert not receiver._announced and not sender._completions
    assert not sender.endpoint.session.outgoing.shards


async def test_a_send_after_the_peer_left_names_the_peers_reason(pki: Path) -> None:
    """A sender whose next shard starts after the receiver said goodbye hears why: a
    full disk's reason (ENOSPC and the file) reaches the operator, not just "ended"."""
    listener, sender, receiver = await pair(pki, 1, GatewayOptions())
    reason = "No space left on device (ENOSPC): big.bin"
    try:
        await receiver.close(reason)
        assert await asyncio.wait_for(sender.wait_ended(), 10) == reason
        data = b"x" * 1000
        with pytest.raises(SessionFailed, match=r"ENOSPC.*big\.bin"):
            await sender.send_shard(1, data, ShardAnnounce(1, len(data), shard_digest_hex(data), 0))
    finally:
        await sender.close()
        listener.close()


async def test_the_ports_a_hello_announces_are_already_ours(pki: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Another socket that binds an announced port while the Welcome is on its way (a test's
    free-port finder, another session) finds it taken: the responder sets a session up only
    for ports the initiator holds, so the initiator never fails after the responder has
    committed (which left a one-session listener refusing the initiator's every re-dial)."""
    grabbed: list[OSError | socket.socket] = []
    answer = handshake.answer_hello

    def grab_then_answer(hello, **kwargs):  # type: ignore[no-untyped-def]
        for endpoint in hello.endpoints:
            host, _, port = endpoint.rpartition(":")
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                sock.bind((host, int(port)))
                grabbed.append(sock)
            except OSError as exc:
                sock.close()
                grabbed.append(exc)
        return answer(hello, **kwargs)

    monkeypatch.setattr(handshake, "answer_hello", grab_then_answer)
    listener, sender, receiver = await pair(pki, 2, GatewayOptions())
    try:
        assert await transfer(sender, receiver, 0, random.Random(5).randbytes(1 << 20))
    finally:
        await sender.close()
        await receiver.close()
        listener.close()
        for item in grabbed:
            if isinstance(item, socket.socket):
                item.close()
    assert len(grabbed) == 2 and all(isinstance(item, OSError) for item in grabbed), grabbed
