"""Control server: listens on every path's address, keeps sessions across links.

A gateway listens on one control address per path so that the peer can reach
it while any path works. Sessions live in one registry shared by all
listeners: a client whose path died re-attaches on another address with its
session id and its acknowledgement, and the session goes on. A session whose
client does not come back within ``resume_window_s`` ends with
``ControlConnectionLost``.

Connections refused for their certificate never reach ``on_session``; they
are logged, counted in ``rejected_total`` and kept in ``rejections``.

Each listening address is a path's ``aio.port.PathPort``, the UDP socket the
path's data plane shares (``serve_on``), or one the server opens for itself
(``listen``). QUIC-looking datagrams that aioquic drops there (forged, stale,
undecryptable) are counted by reason in ``quic_drops``, as are the Initials
``admission`` turns away (``rate_limited``, ``half_open_cap``); it answers
others with a Retry under load (``control.admission``).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE, QuicConfiguration
from aioquic.quic.connection import END_STATES, NetworkAddress, QuicConnection
from aioquic.quic.packet import QuicHeader, QuicPacketType, pull_quic_header

from wanxport.aio.port import PathPort

from .admission import Admission, AdmissionLimits, Verdict
from .certs import CertificateError
from .drops import QuicDropCounter
from .framing import Attach, Attached, Frame, Refused
from .link import APP_REFUSED, ControlConnection, ControlConnectionLost
from .messages import ControlProtocolError
from .session import ControlChannel
from .tlsauth import install_client_auth

log = logging.getLogger(__name__)

ENDED_REMEMBERED = 256  # ended sessions whose end a late resumption is told (the newest)

SessionCallback = Callable[[ControlChannel], Awaitable[None] | None]


def format_source(address: NetworkAddress) -> str:
    host, port = str(address[0]), int(address[1])
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _PortServer(QuicServer):
    """aioquic's server with its silent drops counted (see ``drops``) and its
    handshakes admitted by ``admission`` (Retry under load, caps, rate limits).

    aioquic drops, without a word, what it cannot route or what reaches a connection
    it is closing; this asks the same questions first to count those (and does not answer an unknown version
    with Version Negotiation: both ends are wanxport, and a reply to a forged
    source would be a reflection). An Initial that would open a connection is
    first put to ``Admission``: dropped, answered with a stateless Retry, or let
    through (aioquic then validates any token it carries). And a connection
    aioquic created for a full-size Initial whose packet did not decrypt is
    discarded at once instead of living until its idle timeout.
    """

    def __init__(self, *, drops: QuicDropCounter, create_protocol: Callable[..., ControlConnection],
                 configuration: QuicConfiguration, admission: Admission,
                 half_open: Callable[[], int]) -> None:
        super().__init__(configuration=configuration, create_protocol=self._create, retry=True)
        self._drops = drops
        self._admission = admission
        self._count_half_open = half_open  # the server's, over all of its ports
        self._retry_handler = self._retry  # aioquic's stateless token handler; used per Initial
        self._make_link = create_protocol
        self._created: ControlConnection | None = None
        self._source: NetworkAddress | None = None  # the datagram being handled came from here

    @property
    def half_open(self) -> int:
        """This port's connections whose handshake started and neither completed nor ended."""
        links = {id(p): p for p in self._protocols.values()}.values()
        return sum(1 for link in links if isinstance(link, ControlConnection) and not link.handshake_done
                   and not link.ended)

    def _create(self, quic: QuicConnection, stream_handler: Any = None) -> ControlConnection:
        self._created = self._make_link(quic, stream_handler, self._source)
        return self._created

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        data = data.encode() if isinstance(data, str) else data
        reason, header = self._unroutable(data)
        if reason is not None:
            self._drops.server_drop(reason)
            return
        assert header is not None
        if header.destination_cid not in self._protocols:  # an Initial that would open a connection
            verdict = self._admission.decide(str(addr[0]), bool(header.token), self._count_half_open(),
                                             self._loop.time())
            if verdict in (Verdict.RATE_LIMITED, Verdict.HALF_OPEN_CAP):
                self._drops.server_drop(verdict.value)
                return
            use_retry = verdict is Verdict.RETRY or bool(header.token)
            self._retry = self._retry_handler if use_retry else None
        self._created = None
        self._source = addr
        self._drops.begin()
        super().datagram_received(data, addr)
        if self._drops.end() and self._created is not None:
            # aioquic opened a connection for a full-size Initial that did not decrypt:
            # a forgery (a real client's Initial opens with keys from its own header).
            link = self._created
            for cid in [cid for cid, p in self._protocols.items() if p is link]:
                del self._protocols[cid]
            link.discard()

    def _unroutable(self, data: bytes) -> tuple[str | None, QuicHeader | None]:
        try:
            header = pull_quic_header(Buffer(data=data),
                                      host_cid_length=self._configuration.connection_id_length)
        except ValueError:
            return "header_parse_error", None
        if (header.packet_type != QuicPacketType.VERSION_NEGOTIATION and header.version is not None
                and header.version not in self._configuration.supported_versions):
            return "unsupported_version", header
        protocol = self._protocols.get(header.destination_cid)
        if protocol is not None:
            # aioquic ignores, without a word, what reaches a connection it is closing.
            return ("closed_connection" if protocol._quic._state in END_STATES else None), header
        if header.packet_type == QuicPacketType.INITIAL and len(data) >= SMALLEST_MAX_DATAGRAM_SIZE:
            return None, header  # aioquic opens a connection for it (or answers with a Retry)
        return "unknown_connection_id", header


class _ServerChannel(ControlChannel):
    """Server side of a session: waits for the client to re-attach after a loss."""

    def __init__(self, server: ControlServer, session_id: str, peer_name: str) -> None:
        super().__init__(session_id, peer_name, window=server.window)
        self._server = server
        self._expiry: asyncio.TimerHandle | None = None

    def _attach(self, link: ControlConnection, peer_ack: int) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        super()._attach(link, peer_ack)

    def _link_lost(self, exc: Exception) -> None:
        window = self._server.resume_window_s
        self._expiry = self._loop.call_later(
            window,
            self._finish,
            ControlConnectionLost(f"gateway {self.peer_name!r} did not reconnect within {window}s"),
        )

    def _finish(self, exc: Exception) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._server._forget(self, exc)
        super()._finish(exc)


class ControlServer:
    """Accepts mutually authenticated control sessions on one or more addresses."""

    def __init__(
        self,
        *,
        config: QuicConfiguration,
        ca: Path,
        on_session: SessionCallback,
        keepalive_s: float,
        resume_window_s: float,
        window: int,
        on_reject: Callable[[Exception], None] | None = None,
        admission: AdmissionLimits | None = None,
    ) -> None:
        self.config = config
        # One policy for all of this server's ports: the half-open cap and the
        # per-source buckets count across them.
        self.admission = Admission(admission)
        self.resume_window_s = resume_window_s
        self.window = window
        self.addresses: list[tuple[str, int]] = []
        self.sessions: dict[str, ControlChannel] = {}
        # session id -> (its gateway, why it ended): a client coming back too late is told why
        self._ended: OrderedDict[str, tuple[str, str]] = OrderedDict()
        self.rejected_total = 0
        self.resumed_total = 0  # links that re-attached a session (one per client re-dial)
        self.rejections: deque[Exception] = deque(maxlen=64)
        self.quic_drops = QuicDropCounter()
        config.quic_logger = self.quic_drops
        self._ca = ca
        self._on_session = on_session
        self._on_reject = on_reject
        self._keepalive_s = keepalive_s
        self._transports: list[asyncio.DatagramTransport | None] = []
        self._listeners: list[_PortServer] = []
        self._owned: list[PathPort] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def listen(self, host: str, port: int) -> tuple[str, int]:
        """Add a listening address on a port of its own (port 0: pick one); returns it."""
        path_port = PathPort.open((host, port), recv_buffer_bytes=0, send_buffer_bytes=0)
        self._owned.append(path_port)
        return self.serve_on(path_port)

    def serve_on(self, port: PathPort) -> tuple[str, int]:
        """Accept control connections on a path's shared port; returns its address."""
        address = port.address
        def create_protocol(quic: QuicConnection, stream_handler: Any = None,
                            source: NetworkAddress | None = None) -> ControlConnection:
            # Every refusal logged for this connection names where it came from.
            where = f"control listener {address[0]}:{address[1]}"
            if source is not None:
                where += f" (from {format_source(source)})"
            install_client_auth(quic, self._ca)
            link = ControlConnection(quic, where=where, keepalive_s=self._keepalive_s)
            link.on_frame = self._on_setup_frame
            link.on_lost = self._on_setup_lost
            return link

        listener = _PortServer(configuration=self.config, create_protocol=create_protocol,
                               drops=self.quic_drops, admission=self.admission,
                               half_open=lambda: self.half_open)
        transport = port.set_quic(listener)
        self.addresses.append(address)
        self._transports.append(transport)
        self._listeners.append(listener)
        log.info("control server listening on %s:%d", *address)
        return address

    @property
    def half_open(self) -> int:
        """Handshakes started on any of this server's ports and not yet completed."""
        return sum(listener.half_open for listener in self._listeners)

    def kill_listener(self, index: int) -> None:
        """Test hook: the listening socket vanishes without a word to anyone,
        as when a path's link goes dark. Connections on it die by idle timeout."""
        transport = self._transports[index]
        if transport is not None:
            transport.close()
            self._transports[index] = None

    def close(self) -> None:
        """End every session (orderly) and stop listening."""
        for channel in list(self.sessions.values()):
            channel.close()
        for task in self._tasks:
            task.cancel()
        for index, listener in enumerate(self._listeners):
            if self._transports[index] is not None:
                listener.close()
        self._transports = [None] * len(self._transports)
        for port in self._owned:
            port.close()
        self._owned.clear()

    # -- session setup -----------------------------------------------------------

    def _on_setup_frame(self, link: ControlConnection, frame: Frame) -> None:
        if not isinstance(frame, Attach):
            link.abort(ControlProtocolError(f"{link.where}: expected attach, got a "
                                            f"{type(frame).__name__} frame"))
            return
        channel = self.sessions.get(frame.session)
        if not frame.resume:
            if channel is not None:
                self._refuse(link, "session id already in use")
                return
            channel = _ServerChannel(self, frame.session, link.peer_name)
            self.sessions[frame.session] = channel
            link.send_frame(Attached(frame.session, 0, new=True))
            channel._attach(link, frame.ack)
            log.info("control session from %r accepted", link.peer_name)
            self._start_session(channel)
            return
        if channel is None:
            self._refuse(link, self._why_gone(frame.session, link.peer_name))
        elif channel.peer_name != link.peer_name:
            self._refuse(link, "session belongs to another gateway")
        else:
            link.send_frame(Attached(frame.session, channel._state.consumed, new=False))
            channel._attach(link, frame.ack)
            self.resumed_total += 1
            log.info("control session from %r resumed", link.peer_name)

    def _refuse(self, link: ControlConnection, reason: str) -> None:
        log.warning("%s: refused session from %r: %s", link.where, link.peer_name, reason)
        link.send_frame(Refused(reason))
        link.shutdown(APP_REFUSED, reason[:200])

    def _on_setup_lost(self, link: ControlConnection, exc: Exception, resumable: bool) -> None:
        if isinstance(exc, CertificateError):
            self.rejected_total += 1
            self.rejections.append(exc)
            log.warning("%s", exc)
            if self._on_reject is not None:
                self._on_reject(exc)
        else:
            log.info("control connection ended before a session: %s", exc)

    def _start_session(self, channel: ControlChannel) -> None:
        result = self._on_session(channel)
        if inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            self._tasks.add(task)
            task.add_done_callback(self._session_done)

    def _session_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("on_session handler failed: %r", task.exception())

    def _forget(self, channel: ControlChannel, exc: Exception) -> None:
        if self.sessions.get(channel.session_id) is channel:
            del self.sessions[channel.session_id]
            self._ended[channel.session_id] = (channel.peer_name, str(exc))
            if len(self._ended) > ENDED_REMEMBERED:
                self._ended.popitem(last=False)

    def _why_gone(self, session_id: str, peer_name: str) -> str:
        """The refusal of a resumption whose session is not here: why it ended, when this
        server ended it recently (and the asker is its gateway)."""
        ended = self._ended.get(session_id)
        if ended is None or ended[0] != peer_name:
            return "unknown or expired session"
        return f"session already ended: {ended[1]}"
