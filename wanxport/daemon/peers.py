"""One session per peer pair, whoever dialled it, and the rule that keeps one when two meet.

Both gateways dial their configured peers (at start, and whenever they have work and no
session), and a session carries files both ways, so two sessions for one pair meet when both
dial at about the same time, or when one side redials while the other's session stands.
Each side decides alone, from facts both sides see alike, so both keep the same one:

* A session from another *instance* of the peer (its process restarted: the random id it
  sends in Hello/Welcome changed) replaces the old one at once: the old one's peer is gone.
  So does a second dial from the same instance (it lost the old session and redialled).
* Two sessions between the same two instances, one dialled by each: the one **dialled by the
  site whose name sorts first** is kept. The other is refused during its setup, before any
  data moves, with a goodbye naming the rule, or closed with it if it was set up already.
* While our own dial is in flight to a peer whose name sorts after ours, its dial to us waits
  for ours to end: set up, theirs is refused; failed, theirs is taken. The other side never
  waits (for it, our dial is the kept one), so nothing deadlocks, and a pair that can only
  dial one way still meets.

The decision falls between the peer's Hello (or Welcome) and the first data, under a lock per
peer, because both sessions would use the same data sockets (``ports.py``). Transfers that ran
on a session closed for this are queued again and resume on the kept one (``RETRY_REASONS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator

from wanxport.gateway.handshake import SetupError
from wanxport.gateway.session import GatewaySession

log = logging.getLogger(__name__)

SUPERSEDED = "superseded by a new session from the same peer"
DUPLICATE = "one session per peer pair: keeping the one dialled by"
IDLE = "idle"
RECONNECT = "reconnecting with the new config"
CANCELLED = "cancelled"
SHUTDOWN = "the gateway is shutting down"  # only ever sent by a daemon that is
ABORTED = "the session was lost"  # ended here by an error that says nothing about the transfers
# A session that ended for one of these says nothing about the transfers on it: they are
# queued again (and resume) instead of failing.
RETRY_REASONS = (SUPERSEDED, DUPLICATE, IDLE, RECONNECT, CANCELLED, SHUTDOWN, ABORTED)


def dialled_by(session: GatewaySession, site: str) -> str:
    return site if session.role == "initiator" else session.peer_name


class Admission:
    """One session being set up with ``peer``: ``decide`` is the handshake's hook."""

    def __init__(self, registry: PeerSessions, peer: str, dialler: str) -> None:
        self.registry = registry
        self.peer = peer
        self.dialler = dialler
        self._lock: asyncio.Lock | None = None

    async def decide(self, peer_instance: str | None) -> None:
        """Make room for the new session, or raise SetupError (it is refused)."""
        registry = self.registry
        dial = registry._dials.get(self.peer)
        if self.dialler == self.peer and dial is not None and registry.site < self.peer:
            await asyncio.shield(dial)  # our dial is in flight and would be kept: it decides
        self._lock = registry._lock(self.peer)
        await self._lock.acquire()
        old = registry.current.get(self.peer)
        if old is None:
            return
        old_dialler = dialled_by(old, registry.site)
        same = old.peer_instance == peer_instance and old.end_reason is None
        if same and old_dialler != self.dialler:  # one each way between the same two processes
            keep = min(registry.site, self.peer)
            if self.dialler != keep:
                registry.refused += 1
                log.info("session with %s: refused a second one (%s %s)", self.peer, DUPLICATE, keep)
                raise SetupError(f"{DUPLICATE} {keep}")
            reason = f"{DUPLICATE} {keep}"
        else:
            reason = SUPERSEDED
        log.info("session with %s: closing the old one (%s)", self.peer, reason)
        registry.refused += 1
        registry.current.pop(self.peer, None)
        await old.close(reason)  # its data sockets are free when this returns

    def adopt(self, session: GatewaySession) -> None:
        self.registry.current[self.peer] = session
        self.registry.peak = max(self.registry.peak, len(self.registry.current))

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None


class PeerSessions:
    """The live session with each peer, and the dials in flight."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.instance = os.urandom(8).hex()  # new at each start: peers tell a restart by it
        self.current: dict[str, GatewaySession] = {}
        self.peak = 0  # most peers with a session at once (tests, logs)
        self.refused = 0  # sessions refused or closed by the rule above
        self._dials: dict[str, asyncio.Future[None]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, peer: str) -> asyncio.Lock:
        return self._locks.setdefault(peer, asyncio.Lock())

    @contextlib.asynccontextmanager
    async def admission(self, peer: str, dialler: str) -> AsyncIterator[Admission]:
        """Around one session's setup; the caller ``adopt``s the session it got."""
        admission = Admission(self, peer, dialler)
        dial: asyncio.Future[None] | None = None
        if dialler == self.site:
            dial = self._dials[peer] = asyncio.get_running_loop().create_future()
        try:
            yield admission
        finally:
            admission.release()
            if dial is not None:
                dial.set_result(None)
                if self._dials.get(peer) is dial:
                    del self._dials[peer]

    def ended(self, session: GatewaySession) -> None:
        if self.current.get(session.peer_name) is session:
            del self.current[session.peer_name]
