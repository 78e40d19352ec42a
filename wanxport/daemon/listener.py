"""The daemon's receiving side: the gateway listener, with the daemon's rules and live paths.

On top of ``gateway.listener.GatewayListener`` (one port per path, bound at start):
a session is accepted only from a peer the config names, each session's files are
rooted in that peer's directory before any data can arrive, sessions from several
peers run at once (the path ports carry one data session; each further one gets
ports of its own), and the set of paths can change while the daemon runs. A path added on
reload is bound and answers control at once; a removed path stops being offered
to new sessions at once, and its port is closed when no session uses it (the live
session keeps every path it was set up with, so nothing in flight is lost).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from wanxport.aio.port import PathPort
from wanxport.control import ControlChannel, load_identity
from wanxport.gateway.config import Address, GatewayOptions, format_endpoint
from wanxport.gateway.handshake import SetupError, _refuse, identity_name, respond
from wanxport.gateway.listener import GatewayListener, open_port
from wanxport.gateway.session import GatewaySession

from .inbox import Inbox

log = logging.getLogger(__name__)

# The peer's certificate name -> the directory its files go to, or None to refuse it.
PeerCheck = Callable[[str], Path | None]


class DaemonListener(GatewayListener):
    """Sessions from several peers at once: the first on the path ports, later ones on ports
    of their own (bound on the same hosts for that session and named in its Welcome, so the
    sender's data goes there; control stays on the path ports). One session per peer: a
    peer's new session supersedes its old one."""

    def __init__(self, listens: Sequence[Address], identity: Path, ca: Path, options: GatewayOptions,
                 allocator: Any, peer_dir: PeerCheck, on_inbox: Callable[[Path], Inbox]) -> None:
        super().__init__(list(listens), identity, ca, options, allocator=allocator)
        self._peer_dir = peer_dir
        self._on_inbox = on_inbox
        self._retiring: list[PathPort] = []
        self._released = asyncio.Event()  # set while no session runs on the path ports
        self._released.set()
        self.inboxes: dict[GatewaySession, Inbox] = {}  # each live session's files
        self._own_ports: dict[GatewaySession, tuple[list[PathPort], asyncio.Event]] = {}
        self.peak_sessions = 0  # most sessions served at once (tests, logs)

    def live(self) -> list[GatewaySession]:
        """The sessions being served: on the path ports, then those with ports of their own."""
        main = [self._session] if self._busy and self._session is not None else []
        return main + list(self._own_ports)

    async def _on_session(self, channel: ControlChannel) -> None:
        directory = self._peer_dir(channel.peer_name)
        if directory is None:
            self.setup_failures += 1
            log.warning("refused a session from %r: not a configured peer", channel.peer_name)
            await _refuse(channel, f"{channel.peer_name!r} is not a configured peer")
            return
        current = next((s for s in self.live() if s.peer_name == channel.peer_name), None)
        if current is not None:
            # A new session (not a resumed one) from a peer we are serving: it restarted
            # (kill -9, reboot) and cannot come back to the old one. Waiting out the old one's
            # resume window would only delay the resume; end it, keep its partial files.
            log.info("%s opened a new session: ending its old one", channel.peer_name)
            await current.close("superseded by a new session from the same peer")
            own = self._own_ports.get(current)
            await (own[1].wait() if own is not None else self._released.wait())
        inbox = self._on_inbox(directory)
        if self._busy:
            await self._on_own_ports(channel, inbox)
            return
        before = self._session
        self._released.clear()
        self.allocator = inbox.allocate  # read by the setup below before its first await
        await super()._on_session(channel)
        if self._session is not None and self._session is not before:
            self._bind(self._session, inbox)
        elif not self._busy:
            self._released.set()  # setup failed

    async def _on_own_ports(self, channel: ControlChannel, inbox: Inbox) -> None:
        """Another peer's session while the path ports carry one: give it ports of its own."""
        ports: list[PathPort] = []
        try:
            for host, _ in self.listens:
                ports.append(open_port((host, 0), self.options.dscp))
            session = await respond(channel, [p.address for p in ports], self.name, self.options,
                                    inbox.allocate, ports=ports)
        except Exception as exc:  # noqa: BLE001 - SetupError, OSError, or the channel died in setup
            for port in ports:
                port.close()
            self.setup_failures += 1
            channel.close()
            reason = exc if isinstance(exc, SetupError) else SetupError(
                f"session setup with {channel.peer_name!r} failed: {exc}")
            self._sessions.put_nowait(reason)
            return
        self._own_ports[session] = (ports, asyncio.Event())
        self._bind(session, inbox)
        self._sessions.put_nowait(session)

    def _bind(self, session: GatewaySession, inbox: Inbox) -> None:
        # Before its control reader first runs: no resume query can come unanswered.
        inbox.bind(session)
        self.inboxes[session] = inbox
        self.peak_sessions = max(self.peak_sessions, len(self.live()))

    def finished(self, session: GatewaySession) -> None:
        """``session`` (closed) is over: free its ports, or the path ports for the next one."""
        self.inboxes.pop(session, None)
        own = self._own_ports.pop(session, None)
        if own is None:
            self.release()
            return
        for port in own[0]:
            port.close()
        own[1].set()

    # -- reload ---------------------------------------------------------------

    def change_paths(self, listens: Sequence[Address]) -> None:
        """Listen on exactly ``listens`` (in this order) from now on; OSError, with
        nothing changed, when a new address cannot be bound."""
        by_address = dict(zip(self.listens, self.ports, strict=True))
        added = [a for a in listens if a not in by_address]
        opened: list[PathPort] = []
        try:
            for address in added:
                opened.append(open_port(address, self.options.dscp))
        except OSError:
            for port in opened:
                port.close()
            raise
        assert self.server is not None
        for address, port in zip(added, opened, strict=True):
            self.server.serve_on(port)
            by_address[address] = port
        removed = [a for a in self.listens if a not in listens]
        self._retiring += [by_address.pop(a) for a in removed]
        self.listens = list(listens)
        self.ports = [by_address[a] for a in listens]
        if added or removed:
            log.info("paths: added %s, removed %s", ", ".join(map(format_endpoint, added)) or "none",
                     ", ".join(map(format_endpoint, removed)) or "none")
        if not self._busy:
            self._retire()

    def reload_identity(self, identity: Path) -> None:
        """Take up a renewed certificate for new sessions (ValueError: kept the old one)."""
        cert, key = load_identity(identity)
        if identity_name(cert) != self.name:
            raise ValueError(f"identity: {cert} names {identity_name(cert)!r}, not {self.name!r}")
        assert self.server is not None
        self.server.config.load_cert_chain(cert, key)
        self.cert, self.key = cert, key

    def release(self) -> None:
        super().release()
        self._released.set()
        self._retire()

    def _retire(self) -> None:
        """Close the removed paths' ports (no session uses them now)."""
        for port in self._retiring:
            if self.server is not None:
                for index, address in enumerate(self.server.addresses):
                    if address == port.address:
                        self.server.kill_listener(index)
            port.close()
        self._retiring = []

    def close(self) -> None:
        for session, (ports, ended) in list(self._own_ports.items()):
            session.endpoint.abort()  # its pacer must not outlive the sockets
            for port in ports:
                port.close()
            ended.set()
        self._own_ports.clear()
        self._retire()
        super().close()
