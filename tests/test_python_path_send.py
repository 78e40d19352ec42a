"""The pure-Python data path's sends: every datagram is counted as sent or refused, and a send
the kernel refuses (here EPERM, as a local firewall's drop returns) is a lost datagram, never
an exception out of the session's send."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from wanxport.aio.config import DirectionKey
from wanxport.aio.plan import ControlPlan
from wanxport.aio.python_path import PythonDatapath
from wanxport.wire.frames import AckFrame

KEY = DirectionKey("aes-256-gcm", bytes(range(32)), bytes(12))
ACK = ControlPlan(0, 0, [AckFrame(0, 0, ((0, 0),))], 0.0)


class _Refusing(socket.socket):
    """A socket whose every send meets a firewall's drop."""

    def send(self, data: object, flags: int = 0) -> int:  # type: ignore[override]
        raise PermissionError(1, "Operation not permitted")


@pytest.fixture
def receiver() -> Iterator[socket.socket]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.bind(("127.0.0.1", 0))
    rx.settimeout(5.0)
    yield rx
    rx.close()


def _datapath(sock: socket.socket, rx: socket.socket) -> PythonDatapath:
    sock.bind(("127.0.0.1", 0))
    sock.connect(rx.getsockname())
    datapath = PythonDatapath([sock], KEY, KEY, 7, 7)
    datapath.attach(0)
    return datapath


def test_a_datagram_that_left_is_counted_sent(receiver: socket.socket) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        datapath = _datapath(sock, receiver)
        datapath.send([ACK, ACK])
        assert len(receiver.recv(2048)) > 0 and len(receiver.recv(2048)) > 0
        assert (datapath.datagrams_sent, datapath.datagrams_refused) == (2, 0)


def test_a_send_the_kernel_refuses_is_counted_not_raised(receiver: socket.socket) -> None:
    with _Refusing(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        datapath = _datapath(sock, receiver)
        datapath.send([ACK, ACK])
        assert (datapath.datagrams_sent, datapath.datagrams_refused) == (0, 2)
