"""Data-path workers (aio.workers): paths spread over threads still deliver byte-exact, and
each worker carries its own paths' traffic in both directions."""

from __future__ import annotations

import asyncio
import hashlib
import random
import socket
from collections.abc import AsyncIterator

import pytest

from wanxport.aio.config import DirectionKey, EndpointConfig, PathSocket
from wanxport.aio.endpoint import Endpoint
from wanxport.aio.port import PathPort
from wanxport.aio.workers import owned_paths
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.presets import offload_chunk_bytes
from wanxport.wire import native
from wanxport.wire.header import encode_header

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

WAIT_S = 30.0
A_TO_B = DirectionKey("aes-256-gcm", bytes(range(32)), bytes(12))
B_TO_A = DirectionKey("aes-256-gcm", bytes(range(1, 33)), bytes(range(12)))


def endpoint_pair(n_paths: int, workers: int) -> tuple[Endpoint, Endpoint]:
    paths = tuple(PathConfig(f"p{i}", 1500) for i in range(n_paths))
    session = SessionConfig(paths=paths, chunk_bytes=offload_chunk_bytes(paths, 16), max_ack_delay_s=0.001)
    sockets = tuple(PathSocket(("127.0.0.1", 0)) for _ in paths)
    a = Endpoint(EndpointConfig(session, sockets, A_TO_B, B_TO_A, 11, 22, datapath="native",
                                workers=workers))
    try:
        b = Endpoint(EndpointConfig(session, sockets, B_TO_A, A_TO_B, 22, 11, datapath="native",
                                    workers=workers))
    except BaseException:
        a.abort()
        raise
    a.connect(b.local_addresses)
    b.connect(a.local_addresses)
    return a, b


@pytest.fixture
async def pair() -> AsyncIterator[tuple[Endpoint, Endpoint]]:
    a, b = endpoint_pair(4, 2)
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_two_workers_deliver_byte_exact_and_share_the_traffic(
        pair: tuple[Endpoint, Endpoint]) -> None:
    a, b = pair
    payloads = [random.Random(seed).randbytes(size) for seed, size in ((1, 6 << 20), (2, (1 << 20) + 7))]
    acked = [a.submit(i, p) for i, p in enumerate(payloads)]
    got = {}
    while len(got) < len(payloads):
        shard = await asyncio.wait_for(b.receive_shard(), WAIT_S)
        got[shard.shard_id] = shard
    assert await asyncio.wait_for(asyncio.gather(*acked), WAIT_S) == [True, True]
    for i, data in enumerate(payloads):
        assert got[i].ok
        assert hashlib.sha256(got[i].data).digest() == hashlib.sha256(data).digest()
    assert b.datagrams_rejected == 0
    sender, receiver = a.datapath.shares, b.datapath.shares  # type: ignore[attr-defined]
    assert len(sender) == len(receiver) == 2
    # each worker sealed plans and placed DATA: both carried traffic (4 paths, 2 each)
    assert all(s["plans_sent"] > 0 for s in sender), sender
    assert all(r["datagrams_placed"] > 0 for r in receiver), receiver
    # the receiver's workers acknowledged over their own paths: the sender placed nothing
    assert all(s["datagrams_placed"] == 0 for s in sender)


def test_paths_go_round_robin_to_workers() -> None:
    assert [owned_paths(i, 3, 8) for i in range(3)] == [[0, 3, 6], [1, 4, 7], [2, 5]]


def test_worker_count_is_validated() -> None:
    paths = (PathConfig("p0", 1500),)
    session = SessionConfig(paths=paths)
    sockets = (PathSocket(("127.0.0.1", 0)),)
    for bad in (0, 65):
        with pytest.raises(ValueError, match="workers must be"):
            EndpointConfig(session, sockets, A_TO_B, B_TO_A, workers=bad)
    with pytest.raises(ValueError, match="native data path"):
        EndpointConfig(session, sockets, A_TO_B, B_TO_A, datapath="python", workers=2)


def test_a_worker_receiver_refuses_other_workers_paths() -> None:
    """Each worker's receiver keeps replay windows for its own paths only: a datagram that
    names another worker's path (arriving on the wrong socket) must not be accepted here."""
    seal = native.Protector(A_TO_B.cipher, A_TO_B.key, A_TO_B.iv)
    receiver = native.Receiver(22, 4)
    receiver.set_key(0, native.Protector(A_TO_B.cipher, A_TO_B.key, A_TO_B.iv))
    receiver.own_paths([0, 2])
    datagrams = [seal.seal(encode_header(path, 22, 5, 0), b"\x00" * 8) for path in (0, 1, 2, 3)]
    result = receiver.process(native.DatagramBatch.from_datagrams(datagrams))
    assert sorted(c.path_id for c in result.controls) == [0, 2]
    assert receiver.counters["rejected_path"] == 2
    with pytest.raises(ValueError, match="path_id"):
        receiver.own_paths([4])


async def test_two_workers_switch_keys_without_losing_data(pair: tuple[Endpoint, Endpoint]) -> None:
    """A key update with workers: every worker opens the new phase, plans queued before the
    switch keep the old one, and both shards still arrive intact."""
    a, b = pair
    new = DirectionKey("aes-256-gcm", bytes(range(2, 34)), bytes(range(1, 13)))
    first, second = random.Random(3).randbytes(2 << 20), random.Random(4).randbytes(2 << 20)
    acked = [a.submit(0, first)]
    b.install_recv_key(1, new)  # the receiver learns the next key before the sender uses it
    a.use_send_key(1, new)
    acked.append(a.submit(1, second))
    got = {}
    while len(got) < 2:
        shard = await asyncio.wait_for(b.receive_shard(), WAIT_S)
        got[shard.shard_id] = shard
    assert await asyncio.wait_for(asyncio.gather(*acked), WAIT_S) == [True, True]
    assert bytes(got[0].data) == first and bytes(got[1].data) == second
    counters = b.datapath.counters
    assert counters["opened_phase1"] > 0
    assert b.datagrams_rejected == 0


class _Recorder(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: list[bytes] = []
        self.arrived = asyncio.Event()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:  # type: ignore[override]
        self.got.append(data)
        self.arrived.set()


async def test_workers_on_shared_ports_hand_quic_back_and_give_the_socket_back() -> None:
    """As a gateway's responder: the endpoint shares the listener's path ports. Its worker
    threads drain them (the loop stops watching), QUIC-looking datagrams still reach the
    control side, and after close the port reads its socket again."""
    n = 2
    ports = [PathPort.open(("127.0.0.1", 0)) for _ in range(n)]
    control = _Recorder()
    ports[0].set_quic(control)
    paths = tuple(PathConfig(f"p{i}", 1500) for i in range(n))
    session = SessionConfig(paths=paths, chunk_bytes=offload_chunk_bytes(paths, 16), max_ack_delay_s=0.001)
    a_socks = tuple(PathSocket(("127.0.0.1", 0)) for _ in paths)
    a = Endpoint(EndpointConfig(session, a_socks, A_TO_B, B_TO_A, 11, 22, datapath="native", workers=2))
    b_socks = tuple(PathSocket(port.address, addr)
                    for port, addr in zip(ports, a.local_addresses, strict=True))
    b = Endpoint(EndpointConfig(session, b_socks, B_TO_A, A_TO_B, 22, 11, datapath="native", workers=2),
                 ports=ports)
    a.connect([port.address for port in ports])
    try:
        a.start()
        b.start()
        data = random.Random(5).randbytes(3 << 20)
        acked = a.submit(0, data)
        shard = await asyncio.wait_for(b.receive_shard(), WAIT_S)
        assert await asyncio.wait_for(acked, WAIT_S)
        assert shard.ok and bytes(shard.data) == data
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
            peer.sendto(b"\x40quic-during", ports[0].address)  # a worker drains it, the loop hands it
            await asyncio.wait_for(control.arrived.wait(), WAIT_S)
            assert control.got == [b"\x40quic-during"]
            await b.close()
            control.arrived.clear()
            peer.sendto(b"\x40quic-after", ports[0].address)  # the port's own reader again
            await asyncio.wait_for(control.arrived.wait(), WAIT_S)
            assert control.got == [b"\x40quic-during", b"\x40quic-after"]
    finally:
        await a.close()
        await b.close()
        for port in ports:
            port.close()
