"""The QUIC hand-off on shared ports: control-channel datagrams met by the data path go back.

A session on shared ports (``aio.port.PathPort``) shares each path's socket
with its QUIC control channel; the data path drains the socket and returns the
QUIC-looking datagrams it met (``Received.quic``), which belong to the port's
control side. Without ports, such a datagram has no taker: it is counted and
dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.aio.config import Address, PathSocket
from wanxport.aio.port import PathPort


class QuicHandoff:
    """Hands each path's QUIC datagrams to its port, or counts them (``unclaimed``)."""

    def __init__(self, ports: Sequence[PathPort] | None) -> None:
        self.ports = list(ports) if ports is not None else None
        self.unclaimed = 0  # QUIC-looking datagrams on a socket no control channel shares

    def hand(self, path_id: int, quic: list[tuple[bytes, Address]]) -> None:
        if self.ports is None:
            self.unclaimed += len(quic)
            return
        port = self.ports[path_id]
        for datagram, addr in quic:
            port.quic_received(datagram, addr)


def check_ports(ports: Sequence[PathPort], sockets: Sequence[PathSocket]) -> None:
    """One free port per path, and each path's peer address known (a shared port sends by address)."""
    if len(ports) != len(sockets):
        raise ValueError(f"ports: {len(ports)} given, the session has {len(sockets)} paths")
    for i, (port, spec) in enumerate(zip(ports, sockets, strict=True)):
        if spec.remote is None:
            raise ValueError(f"sockets[{i}].remote: a shared port sends by address; give the peer's")
        if port.data_attached:
            raise OSError(f"{port.address[0]}:{port.address[1]}: port already carries a session")
