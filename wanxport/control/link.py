"""One QUIC connection carrying the control stream (a "link").

A logical control session (``session.ControlChannel``) may use several links
over its life, one at a time, e.g. when a path dies and the client re-dials
on another address. The link does the QUIC plumbing only: TLS configuration,
frame (de)coding on one bidirectional stream, keepalive pings so a dead path
is noticed within the idle timeout, and turning every way a connection can
end into one of three outcomes reported to its owner:

* orderly end (the peer said goodbye)            -> ``exc`` is a ControlClosed
* fatal (certificate, TLS, protocol violation)   -> ``resumable`` is False
* lost (idle timeout, path failure)              -> ``resumable`` is True
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import cast

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic import events
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import NetworkAddress, QuicConnection

from wanxport.aio.sockets import set_dscp

from .certs import CertificateError, check_ca_file
from .counters import ControlCounters, CountedLink
from .framing import Attach, Attached, Frame, FrameDecoder, Refused, encode_frame
from .messages import ControlProtocolError
from .tlsauth import crypto_error, install_server_check_wording, peer_certificate_name

log = logging.getLogger(__name__)

ALPN = "wanxport/1"
# Application error codes in QUIC CONNECTION_CLOSE (frame_type None).
APP_BYE = 0x0
APP_SUPERSEDED = 0x1
APP_PROTOCOL_ERROR = 0x2
APP_REFUSED = 0x3
SILENT_INTERVALS = 3  # keepalives (1/3 idle timeout each) heard nothing: lost (``_ping``)


class ControlConnectError(ConnectionError):
    """No control connection could be set up (unreachable, timeout, refused)."""


class SessionRefused(ControlConnectError):
    """The server answered but would not open or resume the session."""


class ControlConnectionLost(ConnectionError):
    """An established control session ended without an orderly goodbye."""


class ControlClosed(Exception):
    """The control session was closed in an orderly way (by either side)."""


def make_configuration(
    *,
    is_client: bool,
    cert: str | os.PathLike[str],
    key: str | os.PathLike[str],
    ca: str | os.PathLike[str],
    idle_timeout_s: float,
    server_name: str | None = None,
) -> QuicConfiguration:
    """QUIC/TLS settings shared by both ends: our identity, the one trusted CA,
    ALPN ``wanxport/1`` and certificate verification required.

    The receiver's path ports carry QUIC and data on one socket, told apart by
    QUIC's fixed bit 0x40 (``aio.port``), so that bit must never be greased
    (RFC 9287). aioquic 1.7 has no ``grease_quic_bit`` transport parameter: it
    neither offers nor honours it and sets 0x40 on every packet it builds, so
    there is nothing to turn off (tests/test_path_port.py fails if that changes).
    """
    if idle_timeout_s <= 0:
        raise ValueError(f"idle_timeout_s: {idle_timeout_s} is not valid; use a number > 0")
    config = QuicConfiguration(
        alpn_protocols=[ALPN],
        is_client=is_client,
        idle_timeout=idle_timeout_s,
        server_name=server_name,
        verify_mode=ssl.CERT_REQUIRED,
    )
    for what, path in (("certificate", cert), ("certificate key", key)):
        if not Path(path).is_file():
            raise CertificateError(f"{what}: {path} does not exist")
    try:
        config.load_cert_chain(cert, key)
    except (OSError, ValueError, TypeError) as exc:
        raise CertificateError(f"certificate: cannot load {cert} with key {key} ({exc})") from None
    config.load_verify_locations(cafile=str(check_ca_file(ca)))
    return config


class _Void:
    """Stands in for a closed UDP socket: datagrams vanish, as on a dead path.

    asyncio raises from ``sendto`` on a closed unconnected datagram transport,
    and aioquic keeps sending (retransmissions, close frames) until its idle
    timeout; this keeps those sends harmless."""

    def sendto(self, data: bytes, addr: object = None) -> None:
        """Drop the datagram."""

    def is_closing(self) -> bool:
        return True

    def close(self) -> None:
        """Nothing to close."""


def _ignore_frame(link: ControlConnection, frame: Frame) -> None:
    """Default frame sink of a link nobody owns any more."""


def _ignore_lost(link: ControlConnection, exc: Exception, resumable: bool) -> None:
    """Default end sink of a link nobody owns any more."""


class ControlConnection(CountedLink, QuicConnectionProtocol):
    """A QUIC connection with one control stream and keepalive."""

    def __init__(
        self,
        quic: QuicConnection,
        stream_handler: object = None,
        *,
        where: str,
        keepalive_s: float,
    ) -> None:
        super().__init__(quic)
        self.counters = ControlCounters()  # the channel's own once it carries one (session._attach)
        self.where = where
        self.address: tuple[str, int] | None = None  # the control address dialled (client links)
        self.peer_name = ""
        self.on_ready: Callable[[ControlConnection], None] = lambda link: None
        self.on_frame: Callable[[ControlConnection, Frame], None] = _ignore_frame
        self.on_lost: Callable[[ControlConnection, Exception, bool], None] = _ignore_lost
        self.owns_transport = False
        self.ended = False
        # Frames that arrived after the attach answer but before the session took
        # the link over (``ControlChannel._attach`` replays them): dropping them
        # would leave a gap in the message sequence.
        self.backlog: list[Frame] = []
        self._handshake_done = False
        self._stream_id: int | None = None
        self._decoder = FrameDecoder()
        self._keepalive_s = keepalive_s
        self._keepalive: asyncio.TimerHandle | None = None
        self._heard_at = 0.0  # loop time of the last datagram from the peer
        self._listening_since = 0.0  # since when our loop has read its socket in time
        self._tick_due = 0.0

    @property
    def handshake_done(self) -> bool:
        return self._handshake_done

    # -- sending -----------------------------------------------------------

    def transmit(self) -> None:
        if self._transport is not None and self._transport.is_closing():
            self._transport = cast(asyncio.DatagramTransport, _Void())
        super().transmit()

    def send_frame(self, frame: Frame) -> None:
        if self.ended:
            return
        if self._stream_id is None:
            self._stream_id = self._quic.get_next_available_stream_id()
        self._quic.send_stream_data(self._stream_id, encode_frame(frame))
        self.transmit()

    def shutdown(self, code: int = APP_BYE, reason: str = "") -> None:
        """Close deliberately; the owner is not told (it asked for this)."""
        if self.ended:
            return
        self._end()
        self.close(error_code=code, reason_phrase=reason)

    def abort(self, exc: Exception, code: int = APP_PROTOCOL_ERROR) -> None:
        """Close because of ``exc`` and report it, not resumable."""
        if self.ended:
            return
        on_lost = self.on_lost
        self._end()
        self.close(error_code=code, reason_phrase=str(exc)[:200])
        on_lost(self, exc, False)

    def discard(self) -> None:
        """Forget a connection that never authenticated a packet (a forged Initial):
        no close frame, no timer left, nothing sent to the forged address."""
        self._end()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = cast(asyncio.DatagramTransport, _Void())

    def _end(self) -> None:
        self.ended = True
        self.on_frame = _ignore_frame
        self.on_lost = _ignore_lost
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    # -- keepalive and silence ------------------------------------------------

    def datagram_received(self, data: bytes | str, addr: NetworkAddress) -> None:
        self._heard_at = self._loop.time()
        super().datagram_received(data, addr)

    def _ping(self) -> None:
        """Every ``keepalive_s``: lost once ``SILENT_INTERVALS`` heard nothing, else ping.

        After a stall of our loop QUIC's idle timer is no bound: the acknowledgements read
        late count the stall as round-trip time and the idle timeout (>= 3 probe timeouts)
        grows to several stalls, while the peer waits only its resume window. Silence
        counts time our loop could listen: a tick a whole interval late restarts it."""
        self._keepalive = None
        if self.ended:
            return
        now = self._loop.time()
        if now - self._tick_due > self._keepalive_s:
            self._listening_since = now
        silent = now - max(self._heard_at, self._listening_since)
        if silent >= SILENT_INTERVALS * self._keepalive_s:
            on_lost = self.on_lost
            self._end()
            self.close(error_code=APP_SUPERSEDED, reason_phrase="peer silent")
            on_lost(self, ControlConnectionLost(
                f"{self.where}: connection lost (nothing heard for {silent:.1f} s)"), True)
            return
        self._quic.send_ping(0)
        self.counters.pings_sent += 1
        self.transmit()
        self._tick_due = now + self._keepalive_s
        self._keepalive = self._loop.call_later(self._keepalive_s, self._ping)

    # -- events from aioquic -------------------------------------------------

    def quic_event_received(self, event: events.QuicEvent) -> None:
        if isinstance(event, events.HandshakeCompleted):
            self._on_handshake(event)
        elif isinstance(event, events.StreamDataReceived):
            self._on_stream_data(event)
        elif isinstance(event, events.ConnectionTerminated):
            self._on_terminated(event)

    def _on_handshake(self, event: events.HandshakeCompleted) -> None:
        if self.ended:
            return
        self._handshake_done = True
        if event.alpn_protocol != ALPN:
            self.abort(ControlProtocolError(f"{self.where}: peer does not speak {ALPN}"))
            return
        self.peer_name = peer_certificate_name(self._quic)
        self._heard_at = self._listening_since = now = self._loop.time()
        self._tick_due = now + self._keepalive_s
        self._keepalive = self._loop.call_later(self._keepalive_s, self._ping)
        self.on_ready(self)

    def _on_stream_data(self, event: events.StreamDataReceived) -> None:
        if self.ended:
            return
        if self._stream_id is None:
            self._stream_id = event.stream_id
        if event.stream_id != self._stream_id:
            self.abort(ControlProtocolError(f"{self.where}: data on unexpected stream"))
            return
        try:
            frames = self._decoder.feed(event.data)
        except ControlProtocolError as exc:
            self.abort(ControlProtocolError(f"{self.where}: {exc}"))
            return
        for frame in frames:
            if self.ended:
                return
            self.on_frame(self, frame)

    def _on_terminated(self, event: events.ConnectionTerminated) -> None:
        if self.owns_transport and self._transport is not None:
            self._loop.call_soon(self._transport.close)
        if self.ended:
            return
        on_lost = self.on_lost
        self._end()
        code, reason = event.error_code, event.reason_phrase
        fatal = crypto_error(code, reason, self.where)
        if fatal is not None:
            on_lost(self, fatal, False)
        elif event.frame_type is None and code == APP_BYE:
            on_lost(self, ControlClosed(f"{self.where}: peer closed the control session"), False)
        elif event.frame_type is None and code in (APP_PROTOCOL_ERROR, APP_REFUSED):
            on_lost(self, ControlProtocolError(f"{self.where}: peer closed: {reason}"), False)
        elif not self._handshake_done:
            on_lost(self, ControlConnectError(f"{self.where}: handshake failed ({reason})"), True)
        else:
            why = reason or f"error 0x{code:x}"
            on_lost(self, ControlConnectionLost(f"{self.where}: connection lost ({why})"), True)

    def error_received(self, exc: Exception) -> None:
        """ICMP errors on the connected client socket: fail fast while dialing."""
        if self._handshake_done or self.ended:
            return
        detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        on_lost = self.on_lost
        self._end()
        self._quic.close(error_code=APP_BYE)
        if self.owns_transport and self._transport is not None:
            self._transport.close()
        on_lost(self, ControlConnectError(f"{self.where}: {detail}"), True)


def abandon_code(attach: Attach) -> int:
    """How a dial given up after its Attach may have been taken closes: a resumption's link
    is merely lost (the session waits for its client); a new session's says goodbye."""
    return APP_SUPERSEDED if attach.resume else APP_BYE


async def dial(
    host: str,
    port: int,
    attach: Attach,
    *,
    config: QuicConfiguration,
    keepalive_s: float,
    dscp: int | None = None,
    may_attach: Callable[[ControlConnection], bool] | None = None,
) -> tuple[ControlConnection, Attached]:
    """Connect, authenticate, and attach to a session; no timeout of its own.

    ``may_attach(link)``, asked once the handshake is done: False closes the link
    unattached (another link of the same happy-eyeballs dial attaches)."""
    loop = asyncio.get_running_loop()
    where = f"control connection to {host}:{port}"
    try:
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except socket.gaierror as exc:
        raise ControlConnectError(f"{where}: cannot resolve {host!r} ({exc.strerror})") from None
    addr = cast(tuple[str, int], infos[0][4])  # AF_INET/AF_INET6 only for SOCK_DGRAM
    quic = QuicConnection(configuration=config)
    install_server_check_wording(quic)
    link = ControlConnection(quic, where=where, keepalive_s=keepalive_s)
    link.address = (host, port)
    result: asyncio.Future[Attached] = loop.create_future()

    def on_frame(link: ControlConnection, frame: Frame) -> None:
        if result.done():
            link.backlog.append(frame)
            return
        if isinstance(frame, Attached) and frame.session == attach.session:
            result.set_result(frame)
        elif isinstance(frame, Refused):
            result.set_exception(SessionRefused(f"{where}: session refused ({frame.reason})"))
        else:
            link.abort(ControlProtocolError(f"{where}: unexpected {type(frame).__name__} frame"))

    def on_lost(link: ControlConnection, exc: Exception, resumable: bool) -> None:
        if not result.done():
            result.set_exception(exc)

    def on_ready(link: ControlConnection) -> None:
        if may_attach is None or may_attach(link):
            link.send_frame(attach)
            return
        link.shutdown(APP_SUPERSEDED, "another control address answered first")
        result.set_exception(ControlConnectError(f"{where}: another control address answered first"))

    link.on_ready = on_ready
    link.on_frame = on_frame
    link.on_lost = on_lost
    try:
        transport, _ = await loop.create_datagram_endpoint(lambda: link, remote_addr=addr)
    except OSError as exc:
        raise ControlConnectError(f"{where}: {exc.strerror or exc}") from None
    link.owns_transport = True
    try:
        if dscp is not None:
            set_dscp(transport.get_extra_info("socket"), dscp)
        link.connect(addr)
        attached = await result
    except BaseException:
        link.shutdown(abandon_code(attach), "dial abandoned")
        transport.close()
        raise
    return link, attached
