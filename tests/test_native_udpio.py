"""recv_batch: recvmmsg with kernel timestamps, GRO splitting, and the path into Receiver."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from udp_helpers import loopback_pair

from wanxport.aio import native_io
from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

SOL_UDP = 17
UDP_SEGMENT = 103


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    with loopback_pair() as sockets:
        yield sockets


def test_empty_socket_returns_empty_batch(pair: tuple[socket.socket, socket.socket]) -> None:
    rx, _ = pair
    batch = native_io.recv_batch(rx, bytearray(4096), 2)
    assert (batch.count, batch.descriptors, batch.truncated) == (0, b"", 0)


def test_lengths_contents_addresses_and_timestamps(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    rx, tx = pair
    native_io.enable_timestamps(rx)
    before = time.time_ns()
    sent = [bytes([i]) * (20 + 37 * i) for i in range(10)]
    for d in sent:
        tx.send(d)
    batch = native_io.recv_batch(rx, bytearray(10 * 512), 10, want_addrs=True)
    after = time.time_ns()
    assert batch.count == 10
    assert [bytes(batch.datagram(i)) for i in range(10)] == sent
    assert batch.addrs == [tx.getsockname()] * 10
    stamps = batch.table["rx_time_ns"].tolist()
    assert stamps == sorted(stamps) and before <= stamps[0] and stamps[-1] <= after


def test_partial_batches_and_truncation(pair: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = pair
    for i in range(5):
        tx.send(bytes([i]) * (100 if i != 2 else 300))
    first = native_io.recv_batch(rx, bytearray(3 * 200), 3)  # slots of 200 bytes
    assert (first.count, first.truncated) == (2, 1)  # the 300-byte datagram does not fit
    second = native_io.recv_batch(rx, bytearray(3 * 200), 3)
    assert second.count == 2 and bytes(second.datagram(1)) == bytes([4]) * 100


def test_gro_coalesced_messages_are_split(pair: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = pair
    if not native_io.enable_gro(rx):
        pytest.skip("kernel without UDP GRO")
    payload = b"".join(struct.pack(">I", i) + bytes(996) for i in range(8)) + b"tail"
    try:
        tx.sendmsg([payload], [(SOL_UDP, UDP_SEGMENT, struct.pack("=H", 1000))])
    except OSError as exc:
        pytest.skip(f"kernel without UDP GSO: {exc}")
    batch = native_io.recv_batch(rx, bytearray(2 * 65536), 2)
    assert batch.count == 9
    assert batch.table["length"].tolist() == [1000] * 8 + [4]
    assert [struct.unpack_from(">I", batch.datagram(i))[0] for i in range(8)] == list(range(8))


def test_received_batch_feeds_the_receiver(pair: tuple[socket.socket, socket.socket]) -> None:
    rx_sock, tx = pair
    native_io.enable_timestamps(rx_sock)
    key = native.Protector("chacha20-poly1305", bytes(range(32)), bytes(12))
    data = bytes(range(256)) * 16
    burst = native.build_data_datagrams(key, 5, 0, 0, 0, 3, data, 0, len(data), 512)
    for i in range(burst.count):
        tx.send(burst.datagram(i))
    receiver = native.Receiver(5, 1)
    receiver.set_key(0, key)
    dest = bytearray(len(data))
    receiver.add_shard(3, dest)
    batch = native_io.recv_batch(rx_sock, bytearray(16 * 2048), 16)
    result = receiver.process(batch)
    assert bytes(dest) == data and len(result.records) == burst.count
    assert result.records["rx_time_ns"].tolist() == batch.table["rx_time_ns"].tolist()


def test_bad_arguments_raise(pair: tuple[socket.socket, socket.socket]) -> None:
    rx, _ = pair
    with pytest.raises(ValueError, match="max_datagrams"):
        native_io.recv_batch(rx, bytearray(100), 0)
    with pytest.raises(ValueError, match="buffer"):
        native_io.recv_batch(rx, bytearray(100), 10)
    with pytest.raises(TypeError):
        native_io.recv_batch(rx, b"read-only" * 100, 1)  # type: ignore[arg-type]
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    fd = closed.fileno()
    closed.close()
    with pytest.raises(OSError):
        native_io.recv_batch(fd, bytearray(4096), 1)
    with pytest.raises(OSError):
        native_io.enable_timestamps(fd)
    with pytest.raises(ValueError):
        native_io.enable_gro(-1)


def test_quic_addrs_names_only_the_senders_of_quic_looking_datagrams(
        pair: tuple[socket.socket, socket.socket]) -> None:
    rx, tx = pair
    for first in (0x21, 0x41, 0xC3, 0x80):
        tx.send(bytes([first]) + bytes(30))
    batch = native_io.recv_batch(rx, bytearray(8 * 200), 8, quic_addrs=True)
    sender = tx.getsockname()[:2]
    assert batch.count == 4 and batch.addrs == [None, sender, sender, None]
