"""One UDP port per path, shared by the data plane and the QUIC control channel.

A gateway listens on one ``HOST:PORT`` per path, so a firewall needs one hole
per path and consecutive ports can be separate paths. Both protocols arrive on
that socket and the first byte tells them apart: QUIC always sets the fixed bit
0x40 (the control side never greases it, RFC 9287), the data plane's marker has
both top bits clear (``wire.header.is_data_plane``).

``PathPort`` owns the socket for as long as the gateway listens, before, during
and after any data session:

* the control side plugs in any ``asyncio.DatagramProtocol`` (aioquic's
  ``QuicServer``) with ``set_quic``; its ``connection_made`` gets a
  ``DatagramTransport`` whose ``sendto`` writes on the shared socket, exactly
  as if it had bound its own;
* while a data session runs, its endpoint registers ``attach_data`` and drains
  the socket itself (batched, in C for the native path); QUIC-looking datagrams
  it meets come back through ``quic_received``;
* with no session, the port drains the socket: QUIC goes to the control side,
  data-plane datagrams are counted (``no_session``) and dropped, anything else
  is counted as ``marker``.

The aio layer knows nothing of aioquic: the control layer above hands it a protocol.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

from wanxport.aio import overflow
from wanxport.aio.config import Address, PathSocket
from wanxport.aio.sockets import open_path_socket
from wanxport.wire.header import is_data_plane, is_quic

log = logging.getLogger(__name__)

MAX_DATAGRAM = 65535
MAX_DATAGRAMS_PER_WAKE = 256


class PortTransport(asyncio.DatagramTransport):
    """What the control side's protocol sees: sends go out on the shared socket.

    Closing it detaches the protocol only; the socket stays with the port (the
    data plane may still be using it). A send the socket cannot take now, or
    that the kernel refuses, is a lost datagram as on the wire: QUIC repairs it.
    """

    def __init__(self, port: PathPort) -> None:
        super().__init__()
        self._port = port
        self._closing = False

    def sendto(self, data: Any, addr: Any = None) -> None:
        if self._closing:
            return
        self._port.send_quic(bytes(data), addr)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._port.address if name == "sockname" else default

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            self._port.detach_quic(self)

    def abort(self) -> None:
        self.close()


class PathPort:
    """The UDP socket of one path, its reader, and the demultiplexing by first byte."""

    def __init__(self, sock: socket.socket) -> None:
        self.socket = sock
        # Datagrams dropped by reason: no_session, marker, short, quic (no control side),
        # kernel_overflow (the kernel's, for a full socket buffer: aio.overflow).
        self.counters: Counter[str] = Counter()
        self._quic: asyncio.DatagramProtocol | None = None
        self._transport: PortTransport | None = None
        self._data: Callable[[], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def open(cls, local: Address, *, device: str | None = None, recv_buffer_bytes: int = 32 << 20,
             send_buffer_bytes: int = 8 << 20, dscp: int | None = None) -> PathPort:
        """Bind ``local`` (unconnected: the control side hears any peer) and start reading."""
        port = cls(open_path_socket(PathSocket(local, None, device, dscp), recv_buffer_bytes,
                                    send_buffer_bytes))
        try:
            port.start()
        except BaseException:
            port.socket.close()
            raise
        return port

    @property
    def address(self) -> Address:
        host, port = self.socket.getsockname()[:2]
        return str(host), int(port)

    @property
    def closed(self) -> bool:
        return self.socket.fileno() < 0

    def start(self) -> None:
        """Read the socket from the running loop."""
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self.socket.fileno(), self._on_readable)

    def close(self) -> None:
        """Stop reading and release the socket; the control side is told the port is gone."""
        if self.closed:
            return
        if self._transport is not None:
            self._transport.close()
        if self._loop is not None:
            self._loop.remove_reader(self.socket.fileno())
        self.socket.close()

    # -- control side --------------------------------------------------------

    def set_quic(self, protocol: asyncio.DatagramProtocol) -> PortTransport:
        """Hand QUIC datagrams to ``protocol`` from now on (``connection_made`` is called)."""
        if self._transport is not None:
            raise RuntimeError(f"port {self.address[0]}:{self.address[1]} already serves control")
        self._quic = protocol
        self._transport = PortTransport(self)
        protocol.connection_made(self._transport)
        return self._transport

    def detach_quic(self, transport: PortTransport) -> None:
        if transport is self._transport:
            protocol, self._quic, self._transport = self._quic, None, None
            assert protocol is not None
            protocol.connection_lost(None)

    def send_quic(self, data: bytes, addr: Address) -> None:
        try:
            self.socket.sendto(data, addr)
        except OSError as exc:  # full buffer, ICMP error, a closed port: a lost datagram
            log.debug("control datagram to %s not sent (%s)", addr, exc)

    def quic_received(self, data: bytes, addr: Address) -> None:
        """A QUIC-looking datagram (from the port's drain or the data path's batch)."""
        if self._quic is None:
            self.counters["quic"] += 1  # no control side to hand it to
            return
        self._quic.datagram_received(data, addr)

    # -- data side -----------------------------------------------------------

    def attach_data(self, on_readable: Callable[[], None]) -> None:
        """While a data session runs, it drains the socket (and hands QUIC back)."""
        if self._data is not None:
            raise RuntimeError(f"port {self.address[0]}:{self.address[1]} already carries a session")
        self._data = on_readable

    def detach_data(self, on_readable: Callable[[], None]) -> None:
        """The session ended; only its own registration is removed (a later one stays)."""
        if self._data == on_readable:
            self._data = None

    def pause_reading(self) -> None:
        """The attached session's own threads drain the socket (``aio.workers``): the loop
        must not watch it meanwhile (it would wake for every datagram they are about to take)."""
        if self._loop is not None and not self.closed:
            self._loop.remove_reader(self.socket.fileno())

    def resume_reading(self) -> None:
        """Watch the socket from the loop again (after ``pause_reading``; idempotent)."""
        if self._loop is not None and not self.closed:
            self._loop.add_reader(self.socket.fileno(), self._on_readable)

    @property
    def data_attached(self) -> bool:
        return self._data is not None

    def _on_readable(self) -> None:
        if self._data is not None:
            self._data()
            return
        for _ in range(MAX_DATAGRAMS_PER_WAKE):
            try:
                data, ancdata, _, addr = self.socket.recvmsg(MAX_DATAGRAM, overflow.CMSG_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                continue  # an ICMP error queued on the socket: consumed
            dropped = overflow.delta(self.socket, overflow.from_ancillary(ancdata))
            if dropped:
                self.counters[overflow.REASON] += dropped
            if is_quic(data):
                self.quic_received(data, (str(addr[0]), int(addr[1])))
            elif not data:
                self.counters["short"] += 1
            elif is_data_plane(data):
                self.counters["no_session"] += 1
            else:
                self.counters["marker"] += 1
            if self.closed:
                return
