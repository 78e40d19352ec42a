"""Control channel over loopback QUIC: mutual TLS, refusals, timeouts, failover."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wanxport.control import (
    Bye,
    CertificateError,
    ControlChannel,
    ControlClosed,
    ControlConnectError,
    ControlConnectionLost,
    ControlServer,
    Hello,
    ResilientControl,
    ShardComplete,
    connect_control,
    connect_control_any,
    serve_control,
)
from wanxport.control.certs import make_expired_leaf, make_foreign_leaf, make_test_pki
from wanxport.control.framing import Attach
from wanxport.control.link import dial, make_configuration

pytestmark = pytest.mark.timeout(30)

HELLO = Hello(1, "initiator", "gw-a", ["127.0.0.1:9000", "127.0.0.1:9001"], ["aes-256-gcm"], 7)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    make_expired_leaf(directory, "gw-old")
    make_foreign_leaf(directory, "gw-evil")
    return directory


def ident(pki: Path, name: str) -> dict[str, Path]:
    return {"cert": pki / f"{name}.pem", "key": pki / f"{name}.key", "ca": pki / "ca.pem"}


class Recorder:
    """Server side of the tests: records sessions and refusals, echoes messages."""

    def __init__(self) -> None:
        self.sessions: list[ControlChannel] = []
        self.received: list[object] = []
        self.rejected: asyncio.Future[Exception] = asyncio.get_running_loop().create_future()
        self.count_reached = asyncio.Event()
        self.expect = 0
        self.ended: asyncio.Future[BaseException | None] = (
            asyncio.get_running_loop().create_future())

    async def on_session(self, channel: ControlChannel) -> None:
        self.sessions.append(channel)
        try:
            async for msg in channel:
                self.received.append(msg)
                if isinstance(msg, ShardComplete):
                    await channel.send(ShardComplete(msg.shard_id + 1000, "verified"))
                elif isinstance(msg, Hello):
                    await channel.send(Bye("welcome " + channel.peer_name))
                if len(self.received) == self.expect:
                    self.count_reached.set()
        except Exception as exc:
            self.ended.set_result(exc)
        else:
            self.ended.set_result(None)  # orderly close by the peer

    def on_reject(self, exc: Exception) -> None:
        if not self.rejected.done():
            self.rejected.set_result(exc)


@pytest.fixture
async def server(pki: Path) -> AsyncIterator[tuple[ControlServer, Recorder]]:
    rec = Recorder()
    srv = await serve_control(
        [("127.0.0.1", 0), ("127.0.0.1", 0)], **ident(pki, "gw-b"),
        on_session=rec.on_session, on_reject=rec.on_reject, idle_timeout_s=1.0,
    )
    try:
        yield srv, rec
    finally:
        srv.close()


async def test_mutual_tls_exchanges_messages_both_ways(server, pki: Path) -> None:
    srv, rec = server
    host, port = srv.addresses[0]
    channel = await connect_control(host, port, **ident(pki, "gw-a"), server_name="gw-b",
                                    timeout_s=5)
    assert channel.peer_name == "gw-b"
    await channel.send(HELLO)
    assert await channel.recv() == Bye("welcome gw-a")
    assert rec.received == [HELLO]
    assert rec.sessions[0].peer_name == "gw-a"
    await channel.aclose()
    assert await asyncio.wait_for(rec.ended, 5) is None
    assert rec.rejected.done() is False
    with pytest.raises(ControlClosed):
        await channel.recv()


async def test_plain_channel_ends_when_its_path_dies(pki: Path) -> None:
    rec = Recorder()
    srv = await serve_control("127.0.0.1", 0, **ident(pki, "gw-b"), on_session=rec.on_session,
                              idle_timeout_s=0.5, resume_window_s=0.2)
    try:
        channel = await connect_control(*srv.addresses[0], **ident(pki, "gw-a"), timeout_s=5,
                                        idle_timeout_s=0.5)
        await channel.send(HELLO)
        assert isinstance(await channel.recv(), Bye)
        srv.kill_listener(0)
        with pytest.raises(ControlConnectionLost, match="connection lost"):
            await channel.recv()
        server_end = await asyncio.wait_for(rec.ended, 5)
        assert isinstance(server_end, ControlConnectionLost)
        assert "did not reconnect within 0.2s" in str(server_end)
        assert srv.sessions == {}
    finally:
        srv.close()


@pytest.mark.parametrize("name, reason", [
    ("gw-evil", "unable to get local issuer certificate"),
    ("gw-old", "no longer valid"),
])
async def test_bad_client_certificate_is_refused(server, pki: Path, name: str, reason: str) -> None:
    srv, rec = server
    host, port = srv.addresses[0]
    with pytest.raises(CertificateError, match=f"certificate.*{reason}"):
        await connect_control(host, port, **ident(pki, name), timeout_s=5)
    server_error = await asyncio.wait_for(rec.rejected, 5)
    assert isinstance(server_error, CertificateError)
    assert f"client certificate '{name}' refused" in str(server_error)
    assert "(from 127.0.0.1:" in str(server_error), "a refusal names where it came from"
    assert rec.sessions == [] and srv.rejected_total == 1


async def test_client_without_certificate_is_refused(server, pki: Path) -> None:
    srv, rec = server
    host, port = srv.addresses[0]
    config = make_configuration(is_client=True, **ident(pki, "gw-a"), idle_timeout_s=1.0)
    config.certificate = None
    config.private_key = None
    with pytest.raises(CertificateError, match="certificate_required.*no"):
        async with asyncio.timeout(5):
            await dial(host, port, Attach("00" * 16, 0, resume=False), config=config,
                       keepalive_s=0.3)
    server_error = await asyncio.wait_for(rec.rejected, 5)
    assert "client certificate required" in str(server_error)
    assert "(from 127.0.0.1:" in str(server_error)
    assert rec.sessions == []


async def test_client_refuses_server_from_other_ca(pki: Path, tmp_path: Path) -> None:
    rec = Recorder()
    other = make_test_pki(tmp_path, ["gw-b"])
    srv = await serve_control("127.0.0.1", 0, cert=tmp_path / "gw-b.pem",
                              key=tmp_path / "gw-b.key", ca=other["ca"],
                              on_session=rec.on_session, idle_timeout_s=1.0)
    try:
        with pytest.raises(CertificateError, match="server certificate refused"):
            await connect_control(*srv.addresses[0], **ident(pki, "gw-a"), timeout_s=5)
        assert rec.sessions == []
    finally:
        srv.close()


async def test_missing_identity_file_is_one_line(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(CertificateError, match=r"certificate key: .*nothere\.key does not exist"):
        await connect_control("127.0.0.1", 9, cert=pki / "gw-a.pem", key=tmp_path / "nothere.key",
                              ca=pki / "ca.pem", timeout_s=1)


async def test_closed_port_fails_fast(pki: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    loop = asyncio.get_running_loop()
    start = loop.time()
    with pytest.raises(ControlConnectError, match=f"127.0.0.1:{port}"):
        await connect_control("127.0.0.1", port, **ident(pki, "gw-a"), timeout_s=2.0)
    assert loop.time() - start < 2.0 + 1.0


async def test_silent_address_times_out(pki: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:  # bound, never answers
        silent.bind(("127.0.0.1", 0))
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(ControlConnectError, match=r"127\.0\.0\.1:\d+: no handshake within 0\.5s"):
            await connect_control(*silent.getsockname(), **ident(pki, "gw-a"), timeout_s=0.5)
        assert loop.time() - start < 0.5 + 1.0


async def test_connect_any_skips_dead_first_address(server, pki: Path) -> None:
    srv, rec = server
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent:
        silent.bind(("127.0.0.1", 0))
        channel = await connect_control_any([silent.getsockname(), srv.addresses[1]],
                                            **ident(pki, "gw-a"), timeout_s=5, stagger_s=0.1)
    assert channel.via == f"control connection to 127.0.0.1:{srv.addresses[1][1]}"
    await channel.send(HELLO)
    assert await channel.recv() == Bye("welcome gw-a")
    channel.close()


async def test_resilient_channel_survives_losing_its_path(server, pki: Path) -> None:
    srv, rec = server
    rec.expect = 20
    channel = await ResilientControl.connect(
        srv.addresses, **ident(pki, "gw-a"), timeout_s=3, idle_timeout_s=0.5, stagger_s=0.25,
    )
    first, second = (f"control connection to 127.0.0.1:{port}" for _, port in srv.addresses)
    assert channel.via == first
    for shard in range(10):
        await channel.send(ShardComplete(shard, "verified"))
    replies = [await channel.recv() for _ in range(10)]

    srv.kill_listener(0)  # path 0 goes dark: no close, no error, just silence
    for shard in range(10, 20):  # sent into the dead path, must arrive anyway
        await channel.send(ShardComplete(shard, "verified"))
    replies += [await channel.recv() for _ in range(10)]
    await asyncio.wait_for(rec.count_reached.wait(), 10)

    assert channel.reconnects_total == 1 and channel.via == second
    assert [m.shard_id for m in rec.received] == list(range(20))  # type: ignore[attr-defined]
    assert [m.shard_id for m in replies] == list(range(1000, 1020))  # type: ignore[attr-defined]
    assert len(rec.sessions) == 1
    channel.close()


def test_configuration_demands_certificates(pki: Path) -> None:
    config = make_configuration(is_client=False, **ident(pki, "gw-b"), idle_timeout_s=1.0)
    assert config.verify_mode == ssl.CERT_REQUIRED and config.alpn_protocols == ["wanxport/1"]


async def test_abandoning_the_links_address_redials_at_once_and_loses_nothing(server, pki: Path) -> None:
    """The data plane failed path 0: the link over it is dropped without waiting out the
    (here 30 s) idle timeout, messages queued meanwhile arrive once, in order."""
    srv, rec = server
    rec.expect = 10
    channel = await ResilientControl.connect(
        srv.addresses, **ident(pki, "gw-a"), timeout_s=3, idle_timeout_s=30.0, stagger_s=0.25,
    )
    first, second = srv.addresses
    assert channel.abandon_link(second) is False  # not the link's address: nothing happens
    for shard in range(5):
        await channel.send(ShardComplete(shard, "verified"))
    replies = [await channel.recv() for _ in range(5)]

    srv.kill_listener(0)  # path 0 goes dark; only the data plane would notice soon
    started = asyncio.get_running_loop().time()
    assert channel.abandon_link(first) is True
    assert channel.abandon_link(first) is False  # already re-dialling
    for shard in range(5, 10):
        await channel.send(ShardComplete(shard, "verified"))
    replies += [await channel.recv() for _ in range(5)]
    await asyncio.wait_for(rec.count_reached.wait(), 10)

    assert asyncio.get_running_loop().time() - started < 5.0  # not the 30 s idle timeout
    assert channel.reconnects_total == 1 and channel.via == f"control connection to 127.0.0.1:{second[1]}"
    assert [m.shard_id for m in rec.received] == list(range(10))  # type: ignore[attr-defined]
    assert [m.shard_id for m in replies] == list(range(1000, 1010))  # type: ignore[attr-defined]
    assert len(rec.sessions) == 1
    channel.close()
