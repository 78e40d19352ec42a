"""A pair of UDP sockets on loopback, for the tests of the native receive and send paths."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


@contextlib.contextmanager
def loopback_pair(rcvbuf: int | None = None, tx_blocking: bool = True
                  ) -> Iterator[tuple[socket.socket, socket.socket]]:
    """(non-blocking receiver bound on 127.0.0.1, sender connected to it); both closed after.
    ``rcvbuf``: the receiver's buffer, for bursts larger than the default holds."""
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        rx.bind(("127.0.0.1", 0))
        if rcvbuf is not None:
            rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        rx.setblocking(False)
        tx.connect(rx.getsockname())
        tx.setblocking(tx_blocking)
        yield rx, tx
    finally:
        rx.close()
        tx.close()
