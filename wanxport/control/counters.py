"""What the control channel costs: messages, frames, datagrams, bytes and loop CPU.

The control channel shares the event loop's thread with the core, so every
announcement, verdict, acknowledgement and keepalive it handles is loop time the
data path does not get. These counters make that cost visible per session and,
read before and after, per collective step: a session's channel owns one
``ControlCounters`` and every link that carries it counts into it
(``CountedLink`` below, mixed into ``link.ControlConnection``).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ControlCounters:
    """Totals since the channel began; ``messages_*`` by message type (``ShardAnnounce``...)."""

    messages_sent: Counter[str] = field(default_factory=Counter)
    messages_received: Counter[str] = field(default_factory=Counter)
    acks_sent: int = 0  # the channel's consumption acknowledgements (``framing.Ack``)
    pings_sent: int = 0  # keepalive pings
    datagrams_sent: int = 0  # QUIC datagrams, handshake and acknowledgements included
    datagrams_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    cpu_ns: int = 0  # the loop thread's CPU inside the links' receive, send and timer handlers

    def totals(self) -> dict[str, Any]:
        """A flat copy: message counts by type and in all, the rest as they are."""
        return {"messages_sent": sum(self.messages_sent.values()),
                "messages_received": sum(self.messages_received.values()),
                "sent_by_type": dict(self.messages_sent), "received_by_type": dict(self.messages_received),
                "acks_sent": self.acks_sent, "pings_sent": self.pings_sent,
                "datagrams_sent": self.datagrams_sent, "datagrams_received": self.datagrams_received,
                "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
                "cpu_s": self.cpu_ns / 1e9}


def difference(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    """``after`` minus ``before`` (two ``totals()``), key by key, by type too."""
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            earlier = before.get(key, {})
            out[key] = {k: n - earlier.get(k, 0) for k, n in value.items() if n - earlier.get(k, 0)}
        else:
            out[key] = value - before.get(key, 0)
    return out


def add(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``total`` with ``part`` (two ``totals()`` or differences) added, key by key."""
    for key, value in part.items():
        if isinstance(value, dict):
            into = total.setdefault(key, {})
            for k, n in value.items():
                into[k] = into.get(k, 0) + n
        else:
            total[key] = total.get(key, 0) + value
    return total


class _CountingTransport:
    """The link's datagram transport, counting what it sends."""

    def __init__(self, inner: asyncio.DatagramTransport, link: CountedLink) -> None:
        self._inner = inner
        self._link = link

    def sendto(self, data: bytes, addr: Any = None) -> None:
        counters = self._link.counters
        counters.datagrams_sent += 1
        counters.bytes_sent += len(data)
        self._inner.sendto(data, addr)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class CountedLink:
    """Mixin for a QUIC connection protocol: counts its datagrams and its handlers' CPU.

    The handlers nest (receiving a datagram transmits), so only the outermost is timed."""

    counters: ControlCounters
    _depth: int = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(_CountingTransport(transport, self))  # type: ignore[misc, arg-type]

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self.counters.datagrams_received += 1
        self.counters.bytes_received += len(data)
        self._timed(super().datagram_received, data, addr)  # type: ignore[misc]

    def transmit(self) -> None:
        self._timed(super().transmit)  # type: ignore[misc]

    def _handle_timer(self) -> None:
        self._timed(super()._handle_timer)  # type: ignore[misc]

    def _timed(self, handler: Any, *args: Any) -> None:
        if self._depth:
            handler(*args)
            return
        self._depth = 1
        start = time.thread_time_ns()
        try:
            handler(*args)
        finally:
            self._depth = 0
            self.counters.cpu_ns += time.thread_time_ns() - start
