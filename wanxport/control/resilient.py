"""A client control session that survives the death of its current path.

Multipath users see the same failure again and again: the control connection
was set up over the path that has just died, so the session dies with it
although other paths are fine. ``ResilientControl`` keeps the logical session
(session id, sequence numbers, unacknowledged messages) and, when its link is
lost (nothing heard for an idle timeout of listening, or a path error),
re-dials all control addresses happy-eyeballs style and re-attaches over the
first that completes its handshake (one link only: ``channel.AttachClaim``). The server
answers with what it has consumed, both sides re-send their unacknowledged
tail, duplicates are dropped by sequence number: every message is delivered
once and in order across the switch.

Messages sent while re-dialling are queued (up to ``window``) and go out on
the new link. If no address answers within ``resume_window_s`` the session
ends with ``ControlConnectionLost``; a certificate refusal ends it at once.
"""

from __future__ import annotations

import asyncio
import logging

from .certs import CertificateError
from .channel import (
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_STAGGER_S,
    Address,
    DialOptions,
    PathLike,
    dial_any,
)
from .framing import Attach
from .link import APP_SUPERSEDED, ControlConnectError, ControlConnectionLost, SessionRefused
from .session import ControlChannel, new_session_id

log = logging.getLogger(__name__)

_RETRY_BACKOFF_S = (0.1, 0.2, 0.5, 1.0)


class ResilientControl(ControlChannel):
    """``ControlChannel`` that re-establishes itself on another control address."""

    def __init__(
        self,
        session_id: str,
        peer_name: str,
        addresses: list[Address],
        options: DialOptions,
        *,
        resume_window_s: float,
        window: int,
    ) -> None:
        super().__init__(session_id, peer_name, window=window)
        self.addresses = list(addresses)
        self.reconnects_total = 0
        self._options = options
        self._resume_window_s = resume_window_s
        self._reconnect_task: asyncio.Task[None] | None = None

    @classmethod
    async def connect(
        cls,
        addresses: list[Address],
        *,
        cert: PathLike,
        key: PathLike,
        ca: PathLike,
        server_name: str | None = None,
        timeout_s: float = 5.0,
        idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
        stagger_s: float = DEFAULT_STAGGER_S,
        resume_window_s: float = 30.0,
        window: int = 1024,
        dscp: int | None = None,
    ) -> ResilientControl:
        """Open a session over the first address that answers (see connect_control_any).

        ``dscp`` marks the control datagrams (redials included) with that code point."""
        options = DialOptions(cert, key, ca, server_name, timeout_s, idle_timeout_s, stagger_s, dscp)
        session_id = new_session_id()
        link, _ = await dial_any(addresses, Attach(session_id, 0, resume=False), options)
        channel = cls(
            session_id, link.peer_name, addresses, options,
            resume_window_s=resume_window_s, window=window,
        )
        channel._attach(link, 0)
        return channel

    def close(self) -> None:
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            self._reconnect_task = None
        super().close()

    def abandon_link(self, address: Address) -> bool:
        """The data plane found the path to ``address`` failed: if the control link runs over
        it, re-dial now instead of waiting out the idle timeout (keepalives missed for
        ``idle_timeout_s``, 10 s by default, while every message queued behind the dead link).
        True if it did. The re-dial tries every address as after any other loss."""
        link = self._link
        if link is None or self.closed or link.address != tuple(address):
            return False
        link.shutdown(APP_SUPERSEDED, "its path failed")  # tells nobody: lose it as a dead link
        self._on_lost(link, ControlConnectionLost(f"{link.where}: the data plane failed its path"), True)
        return True

    def _link_lost(self, exc: Exception) -> None:
        if self._reconnect_task is None and not self.closed:
            self._reconnect_task = asyncio.create_task(self._reconnect(exc))

    async def _reconnect(self, cause: Exception) -> None:
        deadline = self._loop.time() + self._resume_window_s
        attempt = 0
        try:
            while not self.closed:
                attach = Attach(self.session_id, self._state.consumed, resume=True)
                try:
                    link, attached = await dial_any(self.addresses, attach, self._options)
                except CertificateError as exc:
                    self._finish(exc)
                    return
                except SessionRefused as exc:
                    self._finish(ControlConnectionLost(f"control session not resumed: {exc}"))
                    return
                except ControlConnectError as exc:
                    if self._loop.time() >= deadline:
                        self._finish(ControlConnectionLost(
                            f"control session lost ({cause}) and not re-established within "
                            f"{self._resume_window_s}s: {exc}"
                        ))
                        return
                    await asyncio.sleep(_RETRY_BACKOFF_S[min(attempt, len(_RETRY_BACKOFF_S) - 1)])
                    attempt += 1
                    continue
                if link.peer_name != self.peer_name:
                    link.shutdown()
                    self._finish(ControlConnectionLost(
                        f"control session lost: {link.peer_name!r} answered instead of "
                        f"{self.peer_name!r}"
                    ))
                    return
                self.reconnects_total += 1
                log.info("control session re-attached via %s", link.where)
                self._attach(link, attached.ack)
                return
        finally:
            self._reconnect_task = None
