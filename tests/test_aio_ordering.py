"""The native data path's send order: what may overtake queued data, and what may not.

An ack-eliciting control packet (here a PROBE) has a higher packet number than
the data queued before it in the pacer; if it overtook that data, the peer's
ACK for it would make the core declare the queued data lost. ACK-only packets
carry nothing the peer records, so they leave at once.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator

import pytest

from wanxport.aio.config import DirectionKey
from wanxport.aio.plan import ControlPlan, DataPlan
from wanxport.wire import native
from wanxport.wire.frames import AckFrame, ProbeFrame

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY = DirectionKey("aes-256-gcm", bytes(range(32)), bytes(12))
SEGMENT = 1200
DATAGRAMS = 4
SLOW_BYTES_PER_S = 60_000.0  # ~20 ms between data datagrams: the ring holds them back


@pytest.fixture
def link() -> Iterator[tuple[object, socket.socket]]:
    from wanxport.aio.native_path import NativeDatapath

    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    tx.bind(("127.0.0.1", 0))
    tx.connect(rx.getsockname())
    tx.setblocking(False)
    rx.settimeout(5.0)
    datapath = NativeDatapath([tx], KEY, KEY, 7, 7, slot_size=2048, capacity=64, spin_ns=0,
                              burst_ns=0)
    try:
        datapath.attach(0)
        datapath.set_rate(0, SLOW_BYTES_PER_S)
        yield datapath, rx
    finally:
        datapath.close(drain_s=0.0)
        tx.close()
        rx.close()


def packet_numbers(rx: socket.socket, count: int) -> list[int]:
    """Arrival order by header packet number (bytes 8..16 of every datagram)."""
    return [struct.unpack(">Q", rx.recv(65535)[8:16])[0] for _ in range(count)]


def test_probe_queues_behind_data_and_ack_overtakes(link: tuple[object, socket.socket]) -> None:
    datapath, rx = link
    buffer = memoryview(bytes(SEGMENT * DATAGRAMS))
    datapath.send([  # type: ignore[attr-defined]
        DataPlan(0, 0, 1, buffer, 0, len(buffer), SEGMENT, 0.0),
        ControlPlan(0, DATAGRAMS, [ProbeFrame(1)], 0.0),
        ControlPlan(0, DATAGRAMS + 1, [AckFrame(0, 0, ((0, 0),))], 0.0),
    ])
    order = packet_numbers(rx, DATAGRAMS + 2)
    assert order.index(DATAGRAMS) == DATAGRAMS + 1  # the probe: after every data datagram
    assert order.index(DATAGRAMS + 1) < order.index(DATAGRAMS - 1)  # the ACK: ahead of queued data


def test_the_data_path_counts_the_datagrams_that_left(link: tuple[object, socket.socket]) -> None:
    """Data through the pacer and an ACK sent past it both count once they left the socket."""
    datapath, rx = link
    buffer = memoryview(bytes(SEGMENT * DATAGRAMS))
    assert datapath.datagrams_sent == 0 and datapath.datagrams_refused == 0  # type: ignore[attr-defined]
    datapath.send([  # type: ignore[attr-defined]
        DataPlan(0, 0, 1, buffer, 0, len(buffer), SEGMENT, 0.0),
        ControlPlan(0, DATAGRAMS, [AckFrame(0, 0, ((0, 0),))], 0.0),
    ])
    packet_numbers(rx, DATAGRAMS + 1)
    datapath.close(drain_s=5.0)  # type: ignore[attr-defined]  # its release thread has stopped counting
    assert datapath.datagrams_sent == DATAGRAMS + 1  # type: ignore[attr-defined]
    assert datapath.datagrams_refused == 0  # type: ignore[attr-defined]
