"""``wanxport_lab._limits.udp_flood_send``: the flood tests/test_flood_netns.py sends at one core's rate."""

from __future__ import annotations

import socket

import pytest

_limits = pytest.importorskip("wanxport_lab._limits")


def test_flood_cycles_the_pool_in_order_and_counts_what_it_sent() -> None:
    pool = [b"a" * 10, b"b" * 3000, b"c"]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        rx.bind(("127.0.0.1", 0))
        rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        tx.connect(rx.getsockname())
        sent, sent_bytes, cpu_s, wall_s, _ = _limits.udp_flood_send(
            tx.fileno(), 0.05, b"".join(pool), [len(d) for d in pool])
        rx.setblocking(False)
        first = [rx.recv(65535) for _ in range(3)]
    assert first == pool
    assert sent >= 3 and wall_s >= 0.05 and cpu_s >= 0
    whole, rest = divmod(sent, len(pool))
    assert sent_bytes == whole * sum(map(len, pool)) + sum(len(d) for d in pool[:rest])


@pytest.mark.parametrize(("pool", "lengths"), [(b"x", [2]), (b"x", [0]), (b"x", []), (b"xy", [1, 70000])])
def test_flood_refuses_lengths_outside_the_pool(pool: bytes, lengths: list[int]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
        tx.connect(("127.0.0.1", 9))
        with pytest.raises(ValueError):
            _limits.udp_flood_send(tx.fileno(), 0.01, pool, lengths)
