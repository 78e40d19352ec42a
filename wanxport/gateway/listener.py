"""The receiving gateway: control listeners on every path, sessions one at a time.

Every ``--listen HOST:PORT`` gets a QUIC control listener on ``PORT + 1``, so
a sender can open a session over any live path. The data ports are checked
for availability at start (a port in use is a one-line error before anyone
connects) and bound per session by its endpoint. Sessions are served one at
a time; a second concurrent sender is refused with a goodbye naming the
reason.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from wanxport.aio.endpoint import Allocator
from wanxport.control import ControlChannel, ControlServer, load_identity, serve_control
from wanxport.control.certs import check_ca_file

from .config import Address, GatewayOptions, control_address
from .handshake import SetupError, _refuse, identity_name, respond
from .session import GatewaySession

log = logging.getLogger(__name__)


def check_port_free(address: Address) -> None:
    """Raise OSError (naming the address) when the UDP port cannot be bound."""
    family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind(address)
        except OSError as exc:
            raise OSError(exc.errno, f"{address[0]}:{address[1]}: {exc.strerror}") from None


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
        self.rejections: asyncio.Queue[Exception] = asyncio.Queue()
        self._sessions: asyncio.Queue[GatewaySession | Exception] = asyncio.Queue()
        self._busy = False
        self.busy_refusals = 0  # senders turned away while a session ran (for metrics)
        self.setup_failures = 0  # authenticated senders whose session setup failed

    async def start(self) -> None:
        if not self.listens:
            raise ValueError("listens: give at least one HOST:PORT")
        for address in self.listens:
            check_port_free(address)
            check_port_free(control_address(address))
        self.server = await serve_control(
            [control_address(a) for a in self.listens], cert=self.cert, key=self.key, ca=self.ca,
            on_session=self._on_session, idle_timeout_s=self.options.control_timeout_s,
            resume_window_s=self.options.resume_window_s, on_reject=self.rejections.put_nowait)

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
            await _refuse(channel, "receiver busy with another session")
            return
        self._busy = True
        try:
            session = await respond(channel, self.listens, self.name, self.options, self.allocator)
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
        self._sessions.put_nowait(session)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    async def __aenter__(self) -> GatewayListener:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()
