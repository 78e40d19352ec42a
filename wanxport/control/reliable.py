"""Exactly-once message delivery across control reconnects (sans-IO).

Within one QUIC connection the control stream is already reliable and
ordered. What it cannot do is survive the connection: when a path dies, the
bytes in flight on it are gone. This small state machine numbers outgoing
messages, keeps them until the peer acknowledges them, and filters
duplicates on the way in, so a new connection on another address can pick
up exactly where the old one stopped. It holds no sockets and no clock, so
the switch-over logic is unit-testable without a network.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from .framing import MsgFrame
from .messages import ControlProtocolError


class ReliableState:
    """Sequence numbers, retransmission buffer and duplicate filter of one session.

    ``window`` bounds the unacknowledged messages; a sender that reaches it
    must wait (``has_room``), which gives producers backpressure.
    """

    def __init__(self, window: int = 1024) -> None:
        if window < 1:
            raise ValueError(f"window: {window} is not valid; use an integer >= 1")
        self.window = window
        self.next_seq = 1
        self.peer_acked = 0
        self.delivered = 0
        self.consumed = 0
        self.ack_sent = 0
        self._unacked: deque[MsgFrame] = deque()

    @property
    def unacked(self) -> int:
        return len(self._unacked)

    @property
    def has_room(self) -> bool:
        return len(self._unacked) < self.window

    def stamp(self, body: dict[str, Any]) -> MsgFrame:
        """Number a new outgoing message and keep it until acknowledged."""
        frame = MsgFrame(seq=self.next_seq, ack=self.consumed, body=body)
        self.next_seq += 1
        self._unacked.append(frame)
        self.ack_sent = self.consumed
        return frame

    def on_ack(self, ack: int) -> None:
        """The peer has consumed every message up to ``ack``."""
        if ack >= self.next_seq:
            raise ControlProtocolError(
                f"frame.ack: {ack} acknowledges a message never sent (last {self.next_seq - 1})"
            )
        if ack <= self.peer_acked:
            return
        self.peer_acked = ack
        while self._unacked and self._unacked[0].seq <= ack:
            self._unacked.popleft()

    def on_msg(self, frame: MsgFrame) -> bool:
        """True when the frame is the next new message; False for a duplicate."""
        self.on_ack(frame.ack)
        if frame.seq <= self.delivered:
            return False
        if frame.seq != self.delivered + 1:
            raise ControlProtocolError(
                f"frame.seq: {frame.seq} skips ahead of {self.delivered + 1}"
            )
        self.delivered = frame.seq
        return True

    def on_consumed(self) -> None:
        """The application took one delivered message; it may now be acknowledged."""
        self.consumed += 1

    def ack_due(self) -> bool:
        return self.consumed > self.ack_sent

    def resend(self, peer_ack: int) -> list[MsgFrame]:
        """After re-attaching: everything the peer has not acknowledged, in order,
        re-stamped with our current acknowledgement."""
        self.on_ack(peer_ack)
        self.ack_sent = self.consumed
        return [MsgFrame(seq=f.seq, ack=self.consumed, body=f.body) for f in self._unacked]
