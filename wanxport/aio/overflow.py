"""Kernel drops for a full socket receive buffer (``SO_RXQ_OVFL``), counted once per socket.

Why here: a datagram the kernel drops because the socket's receive queue is
full never reaches wanxport's parsers, so no reject counter sees it; under a
flood it is the largest loss there is. With ``SO_RXQ_OVFL`` on, every received
message carries the socket's cumulative drop count (a wrapping 32-bit counter
that starts at zero with the socket). Several readers take turns on one socket
(the listener's port between sessions, a session's data path during one), so
the last value seen is kept per socket, not per reader: whichever reader meets
a message adds the delta since the previous one, and no drop is counted twice
or lost between readers. Drops after the last message are seen with the next.
"""

from __future__ import annotations

import socket
import struct
import weakref

SO_RXQ_OVFL = getattr(socket, "SO_RXQ_OVFL", 40)
#: ancillary space recvmsg needs for the counter (Python receive loops)
CMSG_BYTES = socket.CMSG_SPACE(4)
REASON = "kernel_overflow"

_last: weakref.WeakKeyDictionary[socket.socket, int] = weakref.WeakKeyDictionary()


def enable(sock: socket.socket) -> None:
    """Ask the kernel to attach the drop count to each message (idempotent)."""
    if sock not in _last:
        sock.setsockopt(socket.SOL_SOCKET, SO_RXQ_OVFL, 1)
        _last[sock] = 0  # the kernel's counter starts at zero with the socket


def delta(sock: socket.socket, value: int) -> int:
    """Drops since the last value any reader saw on ``sock``; ``value`` < 0 means none seen."""
    if value < 0:
        return 0
    before = _last.get(sock, 0)
    _last[sock] = value
    return (value - before) & 0xFFFFFFFF


def from_ancillary(ancdata: list[tuple[int, int, bytes]]) -> int:
    """The drop count in ``recvmsg``'s ancillary data, -1 when absent."""
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == SO_RXQ_OVFL and len(data) >= 4:
            return int(struct.unpack("=I", data[:4])[0])
    return -1
