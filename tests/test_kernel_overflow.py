"""Kernel drops for a full socket buffer are counted (SO_RXQ_OVFL, reason ``kernel_overflow``).

Each test floods a socket with a tiny receive buffer on loopback while nothing
reads it, so the kernel drops most datagrams before wanxport sees them. The
count rides on the next message the socket queues, so each test ends the flood
with one marker datagram sent after the flood and drains until it arrives:
then every datagram sent is either received or counted as a kernel drop.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from wanxport.aio import overflow
from wanxport.aio.config import DirectionKey
from wanxport.aio.port import PathPort
from wanxport.aio.python_path import PythonDatapath
from wanxport.aio.sockets import set_buffers
from wanxport.wire import native

KEY = DirectionKey("aes-256-gcm", bytes(range(32)), bytes(12))
FLOOD = 2000
SIZE = 1000
MARKER = b"\x80marker"  # neither QUIC (0x40 clear) nor data plane (top bits not both clear)


def small_receiver() -> socket.socket:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a few datagrams at most
    rx.bind(("127.0.0.1", 0))
    rx.setblocking(False)
    return rx


@pytest.fixture
def sockets() -> Iterator[tuple[socket.socket, socket.socket]]:
    rx, tx = small_receiver(), socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.connect(rx.getsockname())
    try:
        yield rx, tx
    finally:
        rx.close()
        tx.close()


def flood(tx: socket.socket, payload: bytes = b"\x00" * SIZE) -> None:
    for _ in range(FLOOD):
        tx.send(payload)
    tx.send(MARKER)


def test_delta_is_per_socket_and_wraps() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        overflow.enable(sock)
        assert overflow.delta(sock, -1) == 0
        assert overflow.delta(sock, 5) == 5
        assert overflow.delta(sock, 5) == 0
        assert overflow.delta(sock, 0xFFFFFFFF) == 0xFFFFFFFA
        assert overflow.delta(sock, 3) == 4  # the kernel's 32-bit counter wrapped


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))
def test_recv_batch_reports_the_kernel_drop_count(sockets: tuple[socket.socket, socket.socket]) -> None:
    from wanxport.aio import native_io

    rx, tx = sockets
    overflow.enable(rx)
    flood(tx)
    buffer = bytearray(64 * 2048)
    received, dropped, seen_marker = 0, 0, False
    for _ in range(10_000):
        batch = native_io.recv_batch(rx, buffer, 64)
        dropped += overflow.delta(rx, batch.rxq_overflow)
        received += batch.count
        seen_marker = seen_marker or any(bytes(batch.datagram(i)) == MARKER for i in range(batch.count))
        if seen_marker:
            break
    assert seen_marker
    assert dropped > FLOOD // 2  # the buffer holds a handful of the 2000
    assert received + dropped == FLOOD + 1


@pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))
def test_native_datapath_counts_kernel_overflow(sockets: tuple[socket.socket, socket.socket]) -> None:
    from wanxport.aio.native_path import NativeDatapath

    rx, tx = sockets
    datapath = NativeDatapath([rx], KEY, KEY, 7, 7, slot_size=2048, capacity=64, spin_ns=0, burst_ns=0)
    try:
        flood(tx)
        rejected_before_marker = FLOOD + 1
        for _ in range(10_000):
            datapath.receive(0)
            if datapath.rejected >= rejected_before_marker:
                break
        counters = datapath.counters
        assert counters["rejected_kernel_overflow"] > FLOOD // 2
        # every datagram is a kernel drop or one of the receiver's own rejects
        assert datapath.rejected == FLOOD + 1
    finally:
        datapath.close(drain_s=0.0)


def test_python_datapath_counts_kernel_overflow(sockets: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = sockets
    datapath = PythonDatapath([rx], KEY, KEY, 7, 7)
    flood(tx)
    for _ in range(10_000):
        datapath.receive(0)
        if datapath.rejected >= FLOOD + 1:
            break
    assert datapath.counters["rejected_kernel_overflow"] > FLOOD // 2
    assert datapath.rejected == FLOOD + 1


def test_listener_port_counts_kernel_overflow() -> None:
    """Between sessions the port drains the socket itself: the drops land in its counters
    (and from there in ``wanxport_datagrams_rejected_total{reason="kernel_overflow"}``)."""

    async def main() -> dict[str, int]:
        port = PathPort.open(("127.0.0.1", 0), recv_buffer_bytes=4096)
        set_buffers(port.socket, 4096)  # without root, *FORCE fell back: make sure it is small
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
                tx.connect(port.address)
                flood(tx)  # the loop is not running: nothing drains meanwhile
            for _ in range(10_000):
                if sum(port.counters.values()) >= FLOOD + 1:
                    break
                await asyncio.sleep(0)
            return dict(port.counters)
        finally:
            port.close()

    counters = asyncio.run(main())
    assert counters[overflow.REASON] > FLOOD // 2
    assert counters[overflow.REASON] + counters["no_session"] + counters["marker"] == FLOOD + 1
