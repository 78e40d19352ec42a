"""Receiver.drain: one native call per socket drain does what recv_batch + process + fold_runs
did per batch, datagram for datagram, and says when it stopped with the socket not dry."""

from __future__ import annotations

import random
import socket
import struct
from collections.abc import Iterator

import pytest
from udp_helpers import loopback_pair

from wanxport.aio import native_io
from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY = bytes(range(32))
IV = bytes(12)
CONN = 0x10203040
SHARD = 7
SIZE = 6000
SLOT = 2048


def protector() -> native.Protector:
    return native.Protector("aes-256-gcm", KEY, IV)


def data(path_id: int, first_pn: int, offset: int, length: int, payload: bytes) -> list[bytes]:
    burst = native.build_data_datagrams(protector(), CONN, path_id, first_pn, 0, SHARD, payload, offset,
                                        length, 100)
    return [bytes(burst.datagram(i)) for i in range(burst.count)]


def stream(seed: int) -> list[bytes]:
    """DATA on two paths out of order, replays, a control datagram, a datagram of a shard
    nobody registered, a forged one, a short one and QUIC-looking ones, shuffled."""
    rng = random.Random(seed)
    payload = rng.randbytes(SIZE)
    half = SIZE // 2
    out = data(0, 0, 0, half, payload) + data(1, 0, half, SIZE - half, payload)
    out += rng.sample(out, 5)  # replays
    out.append(protector().seal(struct.pack(">BBHIQ", 0x21, 0, 1, CONN, 500), b"\x06" + bytes(8)))
    other = native.build_data_datagrams(protector(), CONN, 0, 600, 0, SHARD + 1, b"z" * 50, 0, 50, 100)
    out.append(bytes(other.datagram(0)))
    forged = bytearray(out[3])
    forged[-1] ^= 1
    out += [bytes(forged), b"\x21\x00", b"\x40quic-like" + bytes(20), b"\xc3initial" + bytes(30)]
    rng.shuffle(out)
    return out


@pytest.fixture
def link() -> Iterator[tuple[socket.socket, socket.socket]]:
    with loopback_pair(rcvbuf=4 << 20) as (rx, tx):
        native_io.enable_timestamps(rx)
        yield rx, tx


def receiver() -> tuple[native.Receiver, bytearray]:
    rx = native.Receiver(CONN, 2)
    rx.set_key(0, protector())
    buf = bytearray(SIZE)
    rx.add_shard(SHARD, buf)
    return rx, buf


def reference(rx: native.Receiver, sock: socket.socket, slots: int) -> tuple[list, int, list, list]:
    """What the event loop did before: a batch at a time, in Python."""
    runs: list = []
    controls: list = []
    quic: list = []
    placed = 0
    buffer = bytearray(slots * SLOT)
    while (batch := native_io.recv_batch(sock, buffer, slots, quic_addrs=True)).count:
        result = rx.process(batch)
        runs += native.fold_runs(result.records)
        placed += len(result.records)
        controls += [(c.path_id, c.packet_number, c.plaintext) for c in result.controls]
        assert batch.addrs is not None
        quic += [(datagram, batch.addrs[index]) for index, datagram in result.quic]
    return runs, placed, controls, quic


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("slots", [1, 8, 64])
def test_a_drain_equals_the_batches_it_replaces(link: tuple[socket.socket, socket.socket], seed: int,
                                                slots: int) -> None:
    sock, tx = link
    datagrams = stream(seed)
    expected_rx, expected_buf = receiver()
    for d in datagrams:
        tx.send(d)
    expected = reference(expected_rx, sock, slots)

    rx, buf = receiver()
    for d in datagrams:
        tx.send(d)
    got = native_io.drain(rx, sock, bytearray(slots * SLOT), slots, 10_000)
    assert (got.runs, got.placed, got.controls, got.quic) == expected
    assert got.placed == sum(run[2] for run in got.runs) > 0
    assert buf == expected_buf and rx.counters == expected_rx.counters
    # the forged copy is a replay when its original came first, else a failed open
    assert rx.counters["rejected_auth"] + rx.counters["rejected_replay"] == 6
    assert [q[1] for q in got.quic] == [tx.getsockname()[:2]] * 2
    assert not got.pressed and got.truncated == 0 and got.rx_ns > 0


def test_a_drain_stops_at_its_batch_budget_and_says_the_socket_is_not_dry(
        link: tuple[socket.socket, socket.socket]) -> None:
    sock, tx = link
    rx, buf = receiver()
    datagrams = data(0, 0, 0, SIZE, bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256))
    for d in datagrams:
        tx.send(d)
    first = native_io.drain(rx, sock, bytearray(8 * SLOT), 8, 2)
    assert first.pressed and first.placed == 16
    rest = native_io.drain(rx, sock, bytearray(8 * SLOT), 8, 1000)
    assert not rest.pressed and first.placed + rest.placed == len(datagrams)
    assert bytes(buf) == bytes(range(256)) * (SIZE // 256) + bytes(SIZE % 256)
    empty = native_io.drain(rx, sock, bytearray(8 * SLOT), 8, 1000)
    assert empty == native_io.Drained([], 0, [], [], False, 0, 0, -1)


def test_a_message_larger_than_a_slot_is_counted_and_the_rest_placed(
        link: tuple[socket.socket, socket.socket]) -> None:
    sock, tx = link
    rx, _ = receiver()
    datagrams = data(0, 0, 0, 300, bytes(300))
    tx.send(bytes(SLOT + 100))
    for d in datagrams:
        tx.send(d)
    got = native_io.drain(rx, sock, bytearray(4 * SLOT), 4, 100)
    assert got.truncated == 1 and got.placed == len(datagrams)


def test_bad_arguments_raise(link: tuple[socket.socket, socket.socket]) -> None:
    sock, _ = link
    rx, _ = receiver()
    with pytest.raises(ValueError, match="max_messages"):
        native_io.drain(rx, sock, bytearray(SLOT), 0, 1)
    with pytest.raises(ValueError, match="max_batches"):
        native_io.drain(rx, sock, bytearray(SLOT), 1, 0)
    with pytest.raises(ValueError, match="bytes per datagram"):
        native_io.drain(rx, sock, bytearray(8), 4, 1)
    closed = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    closed.close()
    with pytest.raises(ValueError):
        native_io.drain(rx, closed, bytearray(SLOT), 1, 1)
