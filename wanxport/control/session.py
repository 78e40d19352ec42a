"""The logical control session that the gateway talks to.

``ControlChannel`` is what ``connect_control`` returns and what the server
hands to ``on_session``. It outlives the QUIC connection underneath (a
``ControlConnection``): messages are numbered by ``ReliableState`` and kept until the peer
has *consumed* them, so when a link is replaced (``ResilientControl`` on the
client, a re-attach on the server) the unacknowledged tail is re-sent and
duplicates are dropped. Acknowledging on consumption rather than on arrival
also bounds memory: a peer can never have more than ``window`` messages
queued at a slow reader.

A plain channel ends when its link is lost; subclasses decide otherwise by
overriding ``_link_lost``.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import deque

from .counters import ControlCounters
from .framing import Ack, Frame, MsgFrame
from .link import APP_BYE, APP_SUPERSEDED, ControlClosed, ControlConnection, ControlConnectionLost
from .messages import ControlProtocolError, Message, message_from_dict, message_to_dict
from .reliable import ReliableState

log = logging.getLogger(__name__)


class ControlChannel:
    """Send and receive control messages with a mutually authenticated peer."""

    def __init__(self, session_id: str, peer_name: str, *, window: int = 1024) -> None:
        self.session_id = session_id
        self.peer_name = peer_name
        self.malformed_total = 0
        self.counters = ControlCounters()  # what this session's control traffic cost (counters)
        self._state = ReliableState(window)
        self._link: ControlConnection | None = None
        self._inbox: deque[Message] = deque()
        self._changed = asyncio.Event()
        self._end: Exception | None = None
        self._ack_scheduled = False
        self._loop = asyncio.get_running_loop()

    # -- public API ----------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._end is not None

    @property
    def connected(self) -> bool:
        """True while a link is attached (False while a resilient channel re-dials)."""
        return self._link is not None

    @property
    def via(self) -> str | None:
        """Which connection carries the session now (for logs and tests)."""
        return None if self._link is None else self._link.where

    @property
    def unacked(self) -> int:
        return self._state.unacked

    async def send(self, msg: Message) -> None:
        """Queue ``msg`` for exactly-once, in-order delivery.

        Waits while ``window`` messages are unacknowledged (backpressure).
        Raises the session's end reason once it has ended.
        """
        body = message_to_dict(msg)
        while True:
            if self._end is not None:
                raise self._end
            if self._state.has_room:
                break
            await self._wait_change()
        frame = self._state.stamp(body)
        self.counters.messages_sent[type(msg).__name__] += 1
        if self._link is not None:
            self._link.send_frame(frame)

    async def recv(self) -> Message:
        """Next message from the peer; raises ControlClosed after an orderly end,
        or the failure that ended the session."""
        while not self._inbox:
            if self._end is not None:
                raise self._end
            await self._wait_change()
        msg = self._inbox.popleft()
        self._consumed()
        return msg

    def __aiter__(self) -> ControlChannel:
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.recv()
        except ControlClosed:
            raise StopAsyncIteration from None

    def close(self) -> None:
        """End the session now; the peer sees an orderly close."""
        if self._link is not None:
            self._link.shutdown(APP_BYE, "bye")
            self._link = None
        self._finish(ControlClosed("control session closed locally"))

    async def aclose(self, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until the peer has consumed what we sent, then close."""
        try:
            async with asyncio.timeout(timeout_s):
                while self._state.unacked and self._end is None:
                    await self._wait_change()
        except TimeoutError:
            log.warning("closing control session with %d unacknowledged messages",
                        self._state.unacked)
        self.close()

    # -- link management (used by connect functions, server, resilient) -------

    def _attach(self, link: ControlConnection, peer_ack: int) -> None:
        """Carry on over ``link``: re-send what the peer has not consumed."""
        old, self._link = self._link, link
        if old is not None and old is not link:
            old.shutdown(APP_SUPERSEDED, "superseded by a newer connection")
        link.on_frame = self._on_frame
        link.on_lost = self._on_lost
        link.counters = self.counters
        try:
            frames = self._state.resend(peer_ack)
        except ControlProtocolError as exc:
            link.abort(exc)
            return
        for frame in frames:
            link.send_frame(frame)
        backlog, link.backlog = link.backlog, []
        for frame in backlog:
            if link.ended:
                break
            self._on_frame(link, frame)
        self._notify()

    def _link_lost(self, exc: Exception) -> None:
        """The link died but the session could go on; a plain channel ends."""
        self._finish(exc)

    def _finish(self, exc: Exception) -> None:
        if self._end is None:
            self._end = exc
            self._notify()

    # -- internals -------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()

    async def _wait_change(self) -> None:
        self._changed.clear()
        await self._changed.wait()

    def _consumed(self) -> None:
        self._state.on_consumed()
        if not self._ack_scheduled:
            self._ack_scheduled = True
            self._loop.call_soon(self._flush_ack)

    def _flush_ack(self) -> None:
        """One acknowledgement per loop iteration, not per message."""
        self._ack_scheduled = False
        if self._link is not None and self._state.ack_due():
            self._state.ack_sent = self._state.consumed
            self.counters.acks_sent += 1
            self._link.send_frame(Ack(self._state.consumed))

    def _on_frame(self, link: ControlConnection, frame: Frame) -> None:
        try:
            if isinstance(frame, MsgFrame):
                if self._state.on_msg(frame):
                    self._deliver(frame)
            elif isinstance(frame, Ack):
                self._state.on_ack(frame.ack)
            else:
                raise ControlProtocolError(f"unexpected {type(frame).__name__} frame mid-session")
        except ControlProtocolError as exc:
            link.abort(ControlProtocolError(f"{link.where}: {exc}"))
            return
        self._notify()

    def _deliver(self, frame: MsgFrame) -> None:
        try:
            msg = message_from_dict(frame.body)
        except ControlProtocolError as exc:
            # An authenticated peer may run a newer version: count, log, go on.
            self.malformed_total += 1
            log.warning("dropped control message %d from %s: %s", frame.seq, self.peer_name, exc)
            self._consumed()
            return
        self.counters.messages_received[type(msg).__name__] += 1
        self._inbox.append(msg)

    def _on_lost(self, link: ControlConnection, exc: Exception, resumable: bool) -> None:
        if link is not self._link:
            return
        self._link = None
        if resumable:
            log.info("control link lost: %s", exc)
            self._link_lost(exc)
        else:
            self._finish(exc)
        self._notify()


def new_session_id() -> str:
    """128 random bits: unguessable, so a session cannot be joined by guessing."""
    return os.urandom(16).hex()


__all__ = ["ControlChannel", "ControlClosed", "ControlConnectionLost", "new_session_id"]
