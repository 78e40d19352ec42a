"""Counting the QUIC-looking datagrams aioquic drops on a shared path port.

A path's port carries both the data plane and QUIC (``aio.port``), so anyone
can aim QUIC-looking bytes at it: random bytes with the fixed bit set, a fake
Initial, a packet for a connection that ended. aioquic drops them silently, in
two places, and both are counted here, one count per datagram, by reason:

* its server, before any connection: no parsable header, an unsupported
  version, an unknown connection id on anything but a full-size Initial
  (``server_drop``, called by ``server._PortServer``);
* a connection, after it took the datagram: undecryptable, a key it no longer
  or not yet has, a duplicate. aioquic reports each packet as a qlog
  ``packet_dropped`` or ``packet_received`` event, so a ``QuicLogger`` whose
  traces keep nothing but those two facts sees them. A datagram counts as
  dropped when none of its packets was received: a real one also "drops" the
  zero padding after its last packet (``header_parse_error``), which is no drop.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from aioquic.quic.logger import QuicLogger, QuicLoggerTrace


class _CountingTrace(QuicLoggerTrace):
    """A qlog trace that keeps nothing; it tells its owner about drops and receipts."""

    def __init__(self, owner: QuicDropCounter, *, is_client: bool, odcid: bytes) -> None:
        super().__init__(is_client=is_client, odcid=odcid)
        self._owner = owner

    def log_event(self, *, category: str, event: str, data: dict[str, Any]) -> None:
        if event == "packet_dropped":
            self._owner.packet_dropped(str(data.get("trigger", "unknown")))
        elif event == "packet_received":
            self._owner.packet_received()


class QuicDropCounter(QuicLogger):
    """Set as the server's ``QuicConfiguration.quic_logger``: counts dropped datagrams
    by aioquic's reason. ``begin``/``end`` bracket the handling of one datagram."""

    def __init__(self) -> None:
        super().__init__()
        self.reasons: Counter[str] = Counter()
        self._reason: str | None = None  # first drop reason of the datagram being handled
        self._received = False

    @property
    def total(self) -> int:
        return sum(dict(self.reasons).values())  # one C-level copy: scrapes read from another thread

    def start_trace(self, is_client: bool, odcid: bytes) -> QuicLoggerTrace:
        return _CountingTrace(self, is_client=is_client, odcid=odcid)

    def end_trace(self, trace: QuicLoggerTrace) -> None:
        """Nothing kept per connection, so nothing to release."""

    def server_drop(self, reason: str) -> None:
        self.reasons[reason] += 1

    def begin(self) -> None:
        self._reason, self._received = None, False

    def packet_dropped(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason

    def packet_received(self) -> None:
        self._received = True

    def end(self) -> bool:
        """Count the datagram if aioquic took none of it; True when it did not."""
        dropped = self._reason is not None and not self._received
        if dropped:
            assert self._reason is not None
            self.reasons[self._reason] += 1
        self._reason, self._received = None, False
        return dropped
