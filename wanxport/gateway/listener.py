"""The receiving gateway: one port per path, sessions one at a time.

Every ``--listen HOST:PORT`` is bound once, at start, as an ``aio.port.PathPort``
(a port in use is a one-line error before anyone connects): its QUIC control
listener runs on it from then on, so a sender can open a session over any live
path, and each session's data endpoint shares it while the session runs.
Sessions are served one at a time; a second concurrent sender is refused with
a goodbye naming the reason.
"""

from __future__ import annotations

import asyncio
import logging
import os

from wanxport.aio.endpoint import Allocator
from wanxport.aio.port import PathPort
from wanxport.control import ControlChannel, ControlServer, load_identity, serve_control
from wanxport.control.certs import check_ca_file

from .config import Address, GatewayOptions
from .handshake import SetupError, identity_name, refuse_session, respond
from .session import GatewaySession

log = logging.getLogger(__name__)
KEEP_REJECTIONS = 64


def open_port(address: Address, dscp: int | None = None) -> PathPort:
    """Bind one path's port (its datagrams marked ``dscp``, data and control alike);
    OSError naming the address when it cannot be bound."""
    try:
        return PathPort.open(address, dscp=dscp)
    except OSError as exc:
        raise OSError(exc.errno, f"{address[0]}:{address[1]}: {exc.strerror or exc}") from None


class GatewayListener:
    """Accept sessions from authenticated senders; ``async with`` closes everything."""

    def __init__(self, listens: list[Address], identity: os.PathLike[str] | str,
                 ca: os.PathLike[str] | str, options: GatewayOptions | None = None,
                 allocator: Allocator | None = None) -> None:
        self.listens = list(listens)
        self.options = options or GatewayOptions()
        self.cert, self.key = load_identity(identity)
        self.ca = check_ca_file(ca)
        self.name = identity_name(self.cert)
        self.allocator = allocator
        self.server: ControlServer | None = None
        self.ports: list[PathPort] = []
        self._session: GatewaySession | None = None
        # Refused control connections, for whoever reports them (``recv``); the daemon reads
        # none, and a misconfigured or hostile peer retries for months: keep the latest only.
        self.rejections: asyncio.Queue[Exception] = asyncio.Queue(maxsize=KEEP_REJECTIONS)
        self._sessions: asyncio.Queue[GatewaySession | Exception] = asyncio.Queue()
        self._busy = False
        self.busy_refusals = 0  # senders turned away while a session ran (for metrics)
        self.setup_failures = 0  # authenticated senders whose session setup failed

    async def start(self) -> None:
        if not self.listens:
            raise ValueError("listens: give at least one HOST:PORT")
        try:
            for address in self.listens:
                self.ports.append(open_port(address, self.options.dscp))
            self.server = await serve_control(
                ports=self.ports, cert=self.cert, key=self.key, ca=self.ca,
                on_session=self._on_session, idle_timeout_s=self.options.control_timeout_s,
                resume_window_s=self.options.resume_window_s, on_reject=self._rejected)
        except BaseException:
            self._close_ports()
            raise

    def _rejected(self, exc: Exception) -> None:
        if self.rejections.full():
            self.rejections.get_nowait()  # the oldest unread one goes
        self.rejections.put_nowait(exc)

    @property
    def port_counters(self) -> dict[str, int]:
        """Datagrams the ports dropped by reason: outside any session (``no_session``,
        ``marker``, ``short``) and QUIC-looking ones aioquic dropped (``quic``)."""
        total: dict[str, int] = {}
        for port in self.ports:
            for reason, value in dict(port.counters).items():
                total[reason] = total.get(reason, 0) + value
        if self.server is not None:
            total["quic"] = total.get("quic", 0) + self.server.quic_drops.total
        return total

    async def accept(self) -> GatewaySession:
        """The next session, set up and running (raises SetupError if setup failed)."""
        item = await self._sessions.get()
        if isinstance(item, Exception):
            raise item
        return item

    def release(self) -> None:
        """The current session is over; the next sender may come."""
        self._busy = False

    async def _on_session(self, channel: ControlChannel) -> None:
        if self._busy:
            self.busy_refusals += 1
            await refuse_session(channel, "receiver busy with another session")
            return
        self._busy = True
        try:
            session = await respond(channel, self.listens, self.name, self.options, self.allocator,
                                    ports=self.ports)
        except (SetupError, OSError) as exc:
            self._busy = False
            self.setup_failures += 1
            channel.close()
            self._sessions.put_nowait(exc)
            return
        except Exception as exc:  # noqa: BLE001 - the channel died during setup
            self._busy = False
            self.setup_failures += 1
            channel.close()
            self._sessions.put_nowait(SetupError(f"session setup with {channel.peer_name!r} failed: {exc}"))
            return
        self._session = session
        self._sessions.put_nowait(session)

    def close(self) -> None:
        if self._session is not None:
            self._session.endpoint.abort()  # its pacer must not outlive the sockets
            self._session = None
        if self.server is not None:
            self.server.close()
            self.server = None
        self._close_ports()

    def _close_ports(self) -> None:
        for port in self.ports:
            port.close()
        self.ports = []

    async def __aenter__(self) -> GatewayListener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
