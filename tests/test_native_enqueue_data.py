"""Pacer.enqueue_data: a data plan queued in the pacer and sealed as it leaves is exactly
the datagrams build_data_datagrams makes, and a full ring takes a prefix (backpressure)."""

from __future__ import annotations

import socket

import pytest

from wanxport.aio import native_io
from wanxport.wire import native

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

KEY, IV = bytes(range(32)), bytes(range(12))
SEGMENT = 1200


def test_sealed_into_the_ring_equals_the_burst_and_a_full_ring_takes_a_prefix() -> None:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        rx.settimeout(5.0)
        tx.connect(rx.getsockname())
        data = bytes(range(256)) * 40  # 10240 bytes: 8 full datagrams and a short one
        seal = native.Protector("aes-256-gcm", KEY, IV)
        burst = native.build_data_datagrams(seal, 9, 1, 100, 1, 5, data, 0, len(data), SEGMENT)
        expected = [bytes(burst.datagram(i)) for i in range(burst.count)]
        with native_io.Pacer(2, capacity=4, slot_size=2048, spin_ns=0) as pacer:
            # no socket yet: the ring fills and nothing leaves
            first = pacer.enqueue_data(1, seal, 9, 100, 1, 5, data, 0, len(data), SEGMENT)
            assert first == 4
            assert pacer.enqueue_data(1, seal, 9, 104, 1, 5, data, 4 * SEGMENT, len(data) - 4 * SEGMENT,
                                      SEGMENT) == 0
            pacer.set_path(1, tx)
            got = [rx.recv(65535) for _ in range(4)]
            assert pacer.wait_idle(5.0)
            rest = pacer.enqueue_data(1, seal, 9, 104, 1, 5, data, 4 * SEGMENT, len(data) - 4 * SEGMENT,
                                      SEGMENT)
            assert rest == 4
            got += [rx.recv(65535) for _ in range(4)]
            assert pacer.wait_idle(5.0)
            assert pacer.enqueue_data(1, seal, 9, 108, 1, 5, data, 8 * SEGMENT, len(data) - 8 * SEGMENT,
                                      SEGMENT) == 1
            got.append(rx.recv(65535))
        assert got == expected
        with native_io.Pacer(1, capacity=4, slot_size=1024, spin_ns=0) as small, \
                pytest.raises(ValueError, match="max_payload"):
            small.enqueue_data(0, seal, 9, 0, 0, 5, data, 0, len(data), SEGMENT)  # > a slot
    finally:
        tx.close()
        rx.close()
