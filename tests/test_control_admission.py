"""Handshake admission on the control server: Retry under load, half-open cap, per-source rate.

The policy alone in virtual time, then on loopback against the real server:
real clients still connect through Retry, and a spray of forged Initials (built
by aioquic's client, so they decrypt) from one source and from many loopback
sources is rate limited, never holds more half-open handshakes than the limits
allow, and gets back at most 3x the bytes it sent.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import pytest
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection

from wanxport.control import AdmissionLimits, ControlServer, connect_control, serve_control
from wanxport.control.admission import Admission, Verdict
from wanxport.control.certs import make_test_pki

pytestmark = pytest.mark.timeout(60)


def test_each_source_gets_its_burst_then_its_rate() -> None:
    adm = Admission(AdmissionLimits(source_rate=20.0, source_burst=20))
    assert [adm.decide("10.0.0.1", False, 0, 0.0) for _ in range(21)][-2:] == [Verdict.ADMIT,
                                                                              Verdict.RATE_LIMITED]
    assert adm.decide("10.0.0.2", False, 0, 0.0) is Verdict.ADMIT, "another source has its own bucket"
    assert adm.decide("10.0.0.1", False, 0, 0.049) is Verdict.RATE_LIMITED
    assert adm.decide("10.0.0.1", False, 0, 0.051) is Verdict.ADMIT, "one token per 50 ms"
    admitted = sum(adm.decide("10.0.0.1", False, 0, 1.0 + i / 1000) is Verdict.ADMIT for i in range(1000))
    assert 20 <= admitted <= 41, "1 s at 1000 attempts/s: the burst back plus 20/s"


def test_retry_under_load_then_the_cap() -> None:
    adm = Admission(AdmissionLimits(max_half_open=10, retry_above=3))
    assert adm.decide("a", False, 2, 0.0) is Verdict.ADMIT
    assert adm.decide("b", False, 3, 0.0) is Verdict.RETRY
    assert adm.decide("c", True, 3, 0.0) is Verdict.ADMIT, "a token proves the address: no second Retry"
    assert adm.decide("d", True, 10, 0.0) is Verdict.HALF_OPEN_CAP
    assert adm.decide("e", False, 10, 0.0) is Verdict.HALF_OPEN_CAP
    assert Admission(AdmissionLimits(retry_above=0)).decide("a", False, 0, 0.0) is Verdict.RETRY


def test_source_table_is_bounded() -> None:
    adm = Admission(AdmissionLimits(max_sources=100))
    for i in range(10_000):
        adm.decide(f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}", False, 0, 0.0)
    assert adm.tracked_sources == 100


@pytest.mark.parametrize("limits", [{"max_half_open": 0}, {"retry_above": 65}, {"source_rate": 0},
                                    {"source_burst": 0}, {"max_sources": 0}])
def test_bad_limits_are_refused(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="valid|must be"):
        AdmissionLimits(**limits)  # type: ignore[arg-type]


# -- on loopback, against the real server -------------------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


def ident(pki: Path, name: str) -> dict[str, Path]:
    return {"cert": pki / f"{name}.pem", "key": pki / f"{name}.key", "ca": pki / "ca.pem"}


async def start(pki: Path, limits: AdmissionLimits) -> ControlServer:
    async def on_session(channel: object) -> None:
        return None

    return await serve_control("127.0.0.1", 0, **ident(pki, "gw-b"), on_session=on_session,
                               idle_timeout_s=1.0, admission=limits)


def forged_initial(i: int) -> bytes:
    """A full-size client Initial that decrypts (its keys come from its own header): what
    anyone can send from any address, without a certificate."""
    quic = QuicConnection(configuration=QuicConfiguration(is_client=True, alpn_protocols=["wanxport/1"]))
    quic.connect(("127.0.0.1", 1 + i), now=0.0)
    data, _ = quic.datagrams_to_send(now=0.0)[0]
    assert len(data) >= 1200
    return data


async def until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Yield to the server's handling (same loop) until ``condition`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        assert loop.time() < deadline, "the server did not handle the datagrams in time"
        await asyncio.sleep(0.001)


async def spray(srv: ControlServer, pairs: list[tuple[socket.socket, bytes]]) -> None:
    """Send in groups the server's default-sized socket buffer holds, each handled first."""
    for start in range(0, len(pairs), 16):
        for sock, data in pairs[start : start + 16]:
            sock.sendto(data, srv.addresses[0])
        done = min(len(pairs), start + 16)
        await until(lambda done=done: srv.admission.verdicts.total() == done)  # type: ignore[misc]


def drain(sock: socket.socket) -> int:
    received = 0
    while True:
        try:
            received += len(sock.recv(65535))
        except BlockingIOError:
            return received


async def test_a_real_client_connects_through_retry(pki: Path) -> None:
    srv = await start(pki, AdmissionLimits(retry_above=0))  # Retry always
    try:
        channel = await connect_control(*srv.addresses[0], **ident(pki, "gw-a"), timeout_s=5)
        assert channel.peer_name == "gw-b"
        assert srv.admission.verdicts[Verdict.RETRY] == 1 and srv.admission.verdicts[Verdict.ADMIT] == 1
        await channel.aclose()
    finally:
        srv.close()


async def test_spray_from_one_source_is_rate_limited(pki: Path) -> None:
    srv = await start(pki, AdmissionLimits(max_half_open=64, retry_above=8, source_rate=20.0,
                                           source_burst=20))
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.setblocking(False)
    initials = [forged_initial(i) for i in range(200)]
    try:
        await spray(srv, [(sock, data) for data in initials])
        verdicts = srv.admission.verdicts
        # Sent within well under a second: the burst of 20 plus a few refilled tokens.
        assert 20 <= len(initials) - verdicts[Verdict.RATE_LIMITED] <= 40, verdicts
        assert srv.quic_drops.reasons["rate_limited"] == verdicts[Verdict.RATE_LIMITED]
        assert verdicts[Verdict.ADMIT] == 8 and verdicts[Verdict.RETRY] >= 12, verdicts
        assert srv.half_open == 8 and srv.admission.max_half_open_seen == 8
        await until(lambda: srv.half_open == 0)  # the forged handshakes time out, state freed
        assert 0 < drain(sock) <= 3 * sum(map(len, initials))
    finally:
        sock.close()
        srv.close()


async def test_spray_from_many_sources_stays_under_the_caps_and_3x(pki: Path) -> None:
    """Each forged Initial from its own loopback address (127.0.1.x: no rate limit bites):
    half-open state stops at the Retry threshold and is freed when the forged handshakes
    time out, and no source gets back more than 3x its bytes, retransmissions included
    (a Retry is smaller than the Initial it answers)."""
    srv = await start(pki, AdmissionLimits(max_half_open=32, retry_above=8))
    socks = []
    try:
        for i in range(120):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind((f"127.0.1.{i + 1}", 0))
            s.setblocking(False)
            socks.append(s)
        initials = [forged_initial(i) for i in range(len(socks))]
        await spray(srv, list(zip(socks, initials, strict=True)))
        assert srv.admission.verdicts[Verdict.RATE_LIMITED] == 0
        assert srv.admission.verdicts[Verdict.ADMIT] == 8
        assert srv.admission.max_half_open_seen == 8 and srv.half_open == 8
        await until(lambda: srv.half_open == 0)  # after every retransmission and timeout
        received = [drain(s) for s in socks]
        sent = len(initials[0])
        assert 0 < max(received) <= 3 * sent, (max(received), sent)
        assert sum(r > 0 for r in received) == len(socks), "every source was answered (Retry or flight)"
    finally:
        for s in socks:
            s.close()
        srv.close()
