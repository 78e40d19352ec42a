"""The daemon's receiving side: the gateway listener, with the daemon's rules and live paths.

On top of ``gateway.listener.GatewayListener`` (one port per path, bound at start): a
session is accepted only from a peer the config names; it runs on that peer's own data
ports (``ports.py``, bound at start) and only if the one-session-per-pair rule keeps it
(``peers.py``); its files are rooted in that peer's directory before any data can arrive.
Sessions with several peers run at once, each on its own sockets. The set of paths can
change while the daemon runs: a path added on reload is bound and answers control at once;
a removed path stops being offered to new sessions at once, and its port is closed when no
session uses it (a live session keeps every path it was set up with).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

from wanxport.aio.port import PathPort
from wanxport.control import ControlChannel, load_identity
from wanxport.gateway.config import Address, GatewayOptions, format_endpoint
from wanxport.gateway.handshake import SetupError, identity_name, refuse_session, respond
from wanxport.gateway.listener import GatewayListener, open_port
from wanxport.gateway.session import GatewaySession

from .config import PeerConfig
from .inbox import Inbox
from .peers import PeerSessions
from .ports import PeerPorts

log = logging.getLogger(__name__)

# The peer's certificate name -> the directory its files go to, or None to refuse it.
PeerCheck = Callable[[str], Path | None]


class ListenChangeRefused(Exception):
    """New data ports or paths could not be bound; the running ones stay."""


class DaemonListener(GatewayListener):
    """Sessions dialled by configured peers, each on the peer's own data ports; ``adopt`` gets
    each one that was set up (with its inbox), before its control reader first runs."""

    def __init__(self, listens: Sequence[Address], identity: Path, ca: Path, options: GatewayOptions,
                 peer_dir: PeerCheck, on_inbox: Callable[[Path], Inbox], peer_ports: PeerPorts,
                 sessions: PeerSessions, adopt: Callable[[GatewaySession, Inbox], None]) -> None:
        super().__init__(list(listens), identity, ca, options)
        self._peer_dir = peer_dir
        self._on_inbox = on_inbox
        self.peer_ports = peer_ports
        self.sessions = sessions
        self._adopt = adopt
        self._retiring: list[PathPort] = []

    @property
    def port_counters(self) -> dict[str, int]:
        """The path ports' drops (``GatewayListener``) plus the peers' data ports'."""
        total = super().port_counters
        for port in self.peer_ports.ports:
            for reason, value in dict(port.counters).items():
                total[reason] = total.get(reason, 0) + value
        return total

    def data_ports(self, peer: str) -> list[PathPort]:
        """``peer``'s data sockets on our current paths (KeyError: not a configured peer)."""
        return self.peer_ports.for_peer(peer, self.listens, dict(zip(self.listens, self.ports, strict=True)))

    async def _on_session(self, channel: ControlChannel) -> None:
        peer = channel.peer_name
        via = channel.via or "its address unknown"  # the control link it came over, with its source
        directory = self._peer_dir(peer)
        if directory is None:
            self.setup_failures += 1
            log.warning("refused a session from %r (%s): not a configured peer", peer, via)
            await refuse_session(channel, f"{peer!r} is not a configured peer")
            return
        inbox = self._on_inbox(directory)
        try:
            async with self.sessions.admission(peer, dialler=peer) as admission:
                ports = self.data_ports(peer)
                session = await respond(channel, [p.address for p in ports], self.name, self.options,
                                        inbox.allocate, ports=ports, instance=self.sessions.instance,
                                        decide=admission.decide)
                admission.adopt(session)
                self._adopt(session, inbox)
        except Exception as exc:  # noqa: BLE001 - SetupError, OSError, or the channel died in setup
            channel.close()
            if isinstance(exc, SetupError) and str(exc).startswith("one session per peer pair"):
                return  # the rule refused it (counted there); the peer keeps the other one
            self.setup_failures += 1
            log.warning("incoming session from %s (%s) failed: %s", peer, via, exc)

    # -- reload ---------------------------------------------------------------

    def change_listen(self, peers: Sequence[PeerConfig], listens: Sequence[Address]) -> None:
        """Take up new peers' data ports and paths, all or nothing: ``ListenChangeRefused``
        (saying which part failed) leaves every port as it was."""
        try:
            plan = self.peer_ports.prepare(peers, listens)
        except OSError as exc:
            raise ListenChangeRefused(f"peers' data ports: {exc}") from exc
        try:
            self.change_paths(listens)
        except OSError as exc:
            self.peer_ports.abort(plan)
            raise ListenChangeRefused(f"listen: {exc}") from exc
        self.peer_ports.commit(plan)

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
        self._retire()

    def reload_identity(self, identity: Path) -> None:
        """Take up a renewed certificate for new sessions (ValueError: kept the old one)."""
        cert, key = load_identity(identity)
        if identity_name(cert) != self.name:
            raise ValueError(f"identity: {cert} names {identity_name(cert)!r}, not {self.name!r}")
        assert self.server is not None
        self.server.config.load_cert_chain(cert, key)
        self.cert, self.key = cert, key

    def session_ended(self) -> None:
        """A session closed: ports it held that a reload removed can go now."""
        self._retire()
        self.peer_ports.retire_idle()

    def _retire(self) -> None:
        """Close the removed paths' ports that no session's data uses now."""
        for port in [p for p in self._retiring if not p.data_attached]:
            if self.server is not None:
                for index, address in enumerate(self.server.addresses):
                    if address == port.address:
                        self.server.kill_listener(index)
            port.close()
            self._retiring.remove(port)

    def close(self) -> None:
        for session in list(self.sessions.current.values()):
            session.endpoint.abort()  # its pacer must not outlive the sockets
        for port in self._retiring:
            port.close()
        self._retiring = []
        self.peer_ports.close()
        super().close()
