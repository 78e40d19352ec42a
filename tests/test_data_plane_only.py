"""Shards on the data plane alone (protocol 5): no announcement and no verdict on the control
channel, the announcement in the data-plane meta, the data plane's acknowledgement the verdict;
a substituted byte still fails the shard, and an older peer gets both channels."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import free_path_ports, speak_3_only

from wanxport.control import ShardAnnounce
from wanxport.control.certs import make_test_pki
from wanxport.core.digest import shard_digest_hex
from wanxport.gateway.config import GatewayOptions
from wanxport.gateway.handshake import SetupError, initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession
from wanxport.gateway.shards import UNHASHED

pytestmark = pytest.mark.timeout(60)
PAYLOAD = bytes(range(256)) * 1000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


async def accept(listener: GatewayListener) -> GatewaySession:
    while True:  # a Hello an old responder refused is dialled again
        try:
            return await listener.accept()
        except SetupError:
            continue


async def send_one(pki: Path, announce: ShardAnnounce, data_plane_only: bool = True) -> dict[str, Any]:
    """One shard sent with ``data_plane_only`` over a fresh pair: the sender's result, what
    the receiver was handed, and what each control channel sent."""
    listens = [("127.0.0.1", p) for p in free_path_ports(1)]
    listener = GatewayListener(listens, pki / "gw-b", pki / "ca.pem", GatewayOptions())
    await listener.start()
    try:
        accepting = asyncio.create_task(accept(listener))
        sender = await initiate(listens, pki / "gw-a", pki / "ca.pem", GatewayOptions())
        receiver = await accepting
        before = (sender.channel.counters.totals(), receiver.channel.counters.totals())

        async def receive() -> Any:
            got = await receiver.receive()
            await receiver.complete(got.shard_id, "verified" if got.ok else "integrity-failure")
            return got

        receiving = asyncio.create_task(receive())
        ok = await sender.send_shard(announce.shard_id, memoryview(PAYLOAD), announce,
                                     data_plane_only=data_plane_only)
        got = await receiving
        sent = {"sender": sender.channel.counters.totals()["sent_by_type"],
                "receiver": receiver.channel.counters.totals()["sent_by_type"]}
        before_sent = {"sender": before[0]["sent_by_type"], "receiver": before[1]["sent_by_type"]}
        await sender.close()
        await receiver.close()
    finally:
        listener.close()
    during = {end: {k: n - before_sent[end].get(k, 0) for k, n in by_type.items()
                    if n - before_sent[end].get(k, 0) and k != "Bye"}
              for end, by_type in sent.items()}
    return {"ok": ok, "got": got, "control": during, "version": sender.protocol_version}


async def test_a_shard_travels_without_control_messages(pki: Path) -> None:
    announce = ShardAnnounce(0, len(PAYLOAD), shard_digest_hex(PAYLOAD), 7, name="grad")
    out = await send_one(pki, announce)
    assert out["version"] == 5
    assert out["ok"] is True and out["got"].ok is True
    assert bytes(out["got"].data) == PAYLOAD
    assert out["got"].announce == announce  # step and name came with the data
    assert out["got"].meta == {}  # the announcement is not left in the meta
    assert out["control"] == {"sender": {}, "receiver": {}}


async def test_a_substituted_byte_still_fails_the_shard(pki: Path) -> None:
    """The digest the shard opens with is not the payload's: the receiver's check fails and
    the data plane's acknowledgement says so, with no control verdict to wait for."""
    wrong = bytearray(PAYLOAD)
    wrong[12345] ^= 1
    announce = ShardAnnounce(0, len(PAYLOAD), shard_digest_hex(bytes(wrong)), 0)
    out = await send_one(pki, announce)
    assert out["ok"] is False and out["got"].ok is False
    assert out["control"] == {"sender": {}, "receiver": {}}


async def test_an_older_peer_gets_both_channels(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    speak_3_only(monkeypatch, "responder")
    announce = ShardAnnounce(0, len(PAYLOAD), shard_digest_hex(PAYLOAD), 3)
    out = await send_one(pki, announce)
    assert out["version"] == 3
    assert out["ok"] is True and out["got"].ok is True and out["got"].announce == announce
    assert out["control"] == {"sender": {"ShardAnnounce": 1}, "receiver": {"ShardComplete": 1}}


@pytest.mark.parametrize("data_plane_only", [True, False])
async def test_an_unhashed_shard_is_hashed_while_it_flows(pki: Path, data_plane_only: bool) -> None:
    """``UNHASHED``: the session hashes the shard after its first datagrams left; the receiver
    learns the same digest (on the data plane, and in the announcement when one is sent)."""
    out = await send_one(pki, ShardAnnounce(0, len(PAYLOAD), UNHASHED, 2), data_plane_only)
    assert out["ok"] is True and out["got"].ok is True and bytes(out["got"].data) == PAYLOAD
    assert out["got"].announce == ShardAnnounce(0, len(PAYLOAD), shard_digest_hex(PAYLOAD), 2)
    both = {"sender": {"ShardAnnounce": 1}, "receiver": {"ShardComplete": 1}}
    assert out["control"] == ({"sender": {}, "receiver": {}} if data_plane_only else both)


async def test_an_older_peer_gets_the_shard_hashed_first(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    speak_3_only(monkeypatch, "responder")
    out = await send_one(pki, ShardAnnounce(0, len(PAYLOAD), UNHASHED, 2))
    assert out["version"] == 3 and out["ok"] is True
    assert out["got"].announce.digest == shard_digest_hex(PAYLOAD)
