"""The daemon's receiving side: the gateway listener, with the daemon's rules and live paths.

On top of ``gateway.listener.GatewayListener`` (one port per path, bound at start,
sessions one at a time): a session is accepted only from a peer the config names,
each session's files are rooted in that peer's directory before any data can
arrive, and the set of paths can change while the daemon runs. A path added on
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
from wanxport.gateway.handshake import _refuse, identity_name
from wanxport.gateway.listener import GatewayListener, open_port

from .inbox import Inbox

log = logging.getLogger(__name__)

# The peer's certificate name -> the directory its files go to, or None to refuse it.
PeerCheck = Callable[[str], Path | None]


class DaemonListener(GatewayListener):
    def __init__(self, listens: Sequence[Address], identity: Path, ca: Path, options: GatewayOptions,
                 allocator: Any, peer_dir: PeerCheck, on_inbox: Callable[[Path], Inbox]) -> None:
        super().__init__(list(listens), identity, ca, options, allocator=allocator)
        self._peer_dir = peer_dir
        self._on_inbox = on_inbox
        self._retiring: list[PathPort] = []
        self._released = asyncio.Event()  # set while no session runs
        self._released.set()

    async def _on_session(self, channel: ControlChannel) -> None:
        current = self._session if self._busy else None
        if current is not None and current.peer_name == channel.peer_name:
            # A new session (not a resumed one) from the peer we are serving: it restarted
            # (kill -9, reboot) and cannot come back to the old one. Waiting out the old one's
            # resume window would only delay the resume; end it, keep its partial files.
            log.info("%s opened a new session: ending its old one", channel.peer_name)
            await current.close("superseded by a new session from the same peer")
            await self._released.wait()
        if not self._busy:
            directory = self._peer_dir(channel.peer_name)
            if directory is None:
                self.setup_failures += 1
                log.warning("refused a session from %r: not a configured peer", channel.peer_name)
                await _refuse(channel, f"{channel.peer_name!r} is not a configured peer")
                return
            inbox = self._on_inbox(directory)
            before = self._session
            self._released.clear()
            await super()._on_session(channel)
            if self._session is not None and self._session is not before:
                # Before its control reader first runs: no resume query can come unanswered.
                inbox.bind(self._session)
            elif not self._busy:
                self._released.set()  # setup failed
            return
        await super()._on_session(channel)

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
        self._retire()
        super().close()
