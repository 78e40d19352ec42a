"""One UDP port per path: the first byte sends QUIC to the control side, the rest to the data plane."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest
from aioquic.quic import packet as quic_packet

from wanxport.aio.port import PathPort
from wanxport.control import connect_control, serve_control
from wanxport.control.certs import make_test_pki
from wanxport.wire.frames import PaddingFrame, encode_frames
from wanxport.wire.header import encode_header

# What aioquic reports for late copies of a real connection's packets; a forgery never
# reaches a connection's keys (it cannot carry a connection id the server issued).
LATE_COPIES = ("key_unavailable", "duplicate", "closed_connection")

pytestmark = pytest.mark.timeout(30)


class Recorder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[tuple[bytes, tuple[str, int]]] = []
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.got.append((data, addr))
        self.arrived.set()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("pki")
    make_test_pki(directory, ["gw-a", "gw-b"])
    return directory


def test_aioquic_cannot_grease_the_fixed_bit() -> None:
    """RFC 9287 lets a peer that offers grease_quic_bit (0x2ab2) clear 0x40, which is what
    the shared port demultiplexes on. The installed aioquic has no such transport
    parameter (so it never offers or honours it); if an upgrade adds it, the control
    configuration must turn it off (control.link.make_configuration)."""
    names = {name for name, _ in quic_packet.PARAMS.values()}
    assert 0x2AB2 not in quic_packet.PARAMS and not any("grease" in n for n in names)
    assert quic_packet.PACKET_FIXED_BIT == 0x40


async def test_without_a_session_quic_goes_to_the_control_side_and_the_rest_is_counted() -> None:
    port = PathPort.open(("127.0.0.1", 0))
    control = Recorder()
    port.set_quic(control)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.connect(port.address)
        data_plane = encode_header(0, 7, 1) + encode_frames([PaddingFrame(16)])
        for datagram in (data_plane, b"\x80garbage", b"", b"\x40quic-ish", b"\xc3initial-ish"):
            peer.send(datagram)
        while len(control.got) < 2:
            control.arrived.clear()
            await control.arrived.wait()
        assert [d for d, _ in control.got] == [b"\x40quic-ish", b"\xc3initial-ish"]
        assert control.got[0][1] == peer.getsockname()
    assert dict(port.counters) == {"no_session": 1, "marker": 1, "short": 1}
    port.close()
    assert port.closed


async def test_control_handshake_over_a_shared_port_never_clears_the_fixed_bit(pki: Path) -> None:
    port = PathPort.open(("127.0.0.1", 0))
    sent: list[int] = []
    send = port.send_quic

    def record(data: bytes, addr: tuple[str, int]) -> None:
        sent.append(data[0])
        send(data, addr)

    port.send_quic = record  # type: ignore[method-assign]
    opened: asyncio.Queue[object] = asyncio.Queue()
    server = await serve_control(ports=[port], cert=pki / "gw-b.pem", key=pki / "gw-b.key",
                                 ca=pki / "ca.pem", on_session=opened.put_nowait)
    try:
        assert server.addresses == [port.address]
        client = await connect_control(*port.address, cert=pki / "gw-a.pem", key=pki / "gw-a.key",
                                       ca=pki / "ca.pem")
        await opened.get()
        client.close()
    finally:
        server.close()
        port.close()
    assert sent and all(first & 0x40 for first in sent)
    # A real handshake drops nothing but its own late copies: a busy host's client re-sends a
    # flight whose answer was slow, and the copy finds its keys discarded or its packet seen.
    drops = dict(server.quic_drops.reasons)
    assert not {reason for reason in drops if reason not in LATE_COPIES}, drops
