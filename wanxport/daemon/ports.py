"""Each configured peer's data ports: one UDP port per path of ours, bound at start.

Why: a session's data sockets are ports a firewall must let in, and a port bound only
when a session is set up can be taken by another process in between (seen as "cannot
open the data ports: Address already in use"). So the daemon binds, before it reports
READY, every port a session with any configured peer will use, and that session (whoever
dialled it) carries its data, both ways, on exactly those sockets:

* the first peer in the file without ``data_ports`` (or a ``dscp`` of its own: the path
  ports are marked with ``[network] dscp``) shares the path ports, which also carry QUIC
  control (a gateway with one peer needs one UDP hole per path, as ever);
* a peer with ``data_ports`` gets those ports, each on its path's listen host;
* every other peer gets one ephemeral port per path, bound at start and held until the
  process ends or the peer is removed: nothing can take it, but its number is new at each
  start, so a firewall in front must let the ephemeral range in (or give that peer
  ``data_ports``).

One socket carries one session's data at a time (the native receiver drains it for that
session), hence one set per peer rather than one shared pool. A reload binds the ports of
added peers and paths before the new config is taken (one that cannot be bound refuses the
reload, nothing changed) and closes those no longer wanted once no session uses them.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from wanxport.aio.port import PathPort
from wanxport.gateway.config import Address, format_endpoint
from wanxport.gateway.listener import open_port

from .config import PeerConfig

log = logging.getLogger(__name__)


def _or(value: int | None, default: int | None) -> int | None:
    return default if value is None else value


@dataclass
class Plan:
    """What a config needs: the peer on the path ports, every other (peer, path), new sockets."""

    shared: str | None
    wanted: set[tuple[str, Address]]
    opened: dict[tuple[str, Address], tuple[tuple[int, int | None], PathPort]]  # (port, dscp), socket


class PeerPorts:
    """The data sockets of every configured peer but the one on the path ports."""

    def __init__(self, dscp: int | None = None) -> None:
        self.dscp = dscp
        self.shared: str | None = None  # the peer whose data runs on the path ports
        # (peer, our path) -> ((port asked, 0: ephemeral; its DSCP), the socket)
        self._own: dict[tuple[str, Address], tuple[tuple[int, int | None], PathPort]] = {}
        self._retiring: list[PathPort] = []

    def bind(self, peers: Sequence[PeerConfig], listens: Sequence[Address]) -> None:
        """Hold ports for exactly ``peers`` on ``listens`` from now on (OSError: see ``prepare``)."""
        self.commit(self.prepare(peers, listens))

    def prepare(self, peers: Sequence[PeerConfig], listens: Sequence[Address]) -> Plan:
        """Bind what ``peers`` on ``listens`` need and do not hold yet; OSError naming the
        address, with nothing changed, when one cannot be bound. ``commit`` or ``abort`` it."""
        shared = next((p.name for p in peers if p.data_ports is None and p.dscp is None), None)
        wanted: dict[tuple[str, Address], tuple[int, int | None]] = {
            (p.name, address): (p.data_ports[i] if p.data_ports else 0, _or(p.dscp, self.dscp))
            for p in peers if p.name != shared for i, address in enumerate(listens)}
        opened: dict[tuple[str, Address], tuple[tuple[int, int | None], PathPort]] = {}
        try:
            for key, asked in wanted.items():
                held = self._own.get(key)
                if held is None or held[0] != asked:
                    opened[key] = (asked, open_port((key[1][0], asked[0]), asked[1]))
        except OSError:
            self.abort(Plan(shared, set(wanted), opened))
            raise
        return Plan(shared, set(wanted), opened)

    def commit(self, plan: Plan) -> None:
        for key in [k for k in self._own if k not in plan.wanted or k in plan.opened]:
            self._retiring.append(self._own.pop(key)[1])
        self._own.update(plan.opened)
        self.shared = plan.shared
        for (peer, _), (_, port) in plan.opened.items():
            log.info("data port for %s: %s", peer, format_endpoint(port.address))
        self.retire_idle()

    @staticmethod
    def abort(plan: Plan) -> None:
        for _, port in plan.opened.values():
            port.close()

    def for_peer(self, peer: str, listens: Sequence[Address],
                 path_ports: Mapping[Address, PathPort]) -> list[PathPort]:
        """``peer``'s data sockets in ``listens`` order (KeyError: not a configured peer)."""
        if peer == self.shared:
            return [path_ports[address] for address in listens]
        return [self._own[(peer, address)][1] for address in listens]

    @property
    def ports(self) -> list[PathPort]:
        return [port for _, port in self._own.values()]

    def retire_idle(self) -> None:
        """Close the ports no longer wanted that no session uses now."""
        for port in [p for p in self._retiring if not p.data_attached]:
            port.close()
            self._retiring.remove(port)

    def close(self) -> None:
        for port in [*self.ports, *self._retiring]:
            port.close()
        self._own.clear()
        self._retiring = []
