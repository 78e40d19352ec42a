"""The receiver side of a path: which packet numbers arrived, and when to acknowledge them.

Each path acknowledges its own packet numbers (they are per path and never
reused). The tracker is the only owner of that record: the session tells it
what arrived and asks it for the ACK frame's ranges and for when an ACK is
due; nothing else reads or writes the received set. Kept apart from the
sender's state because the two directions of a session share a path but not
this bookkeeping.
"""

from __future__ import annotations

from wanxport.wire.ack_record import AckRecord, PacketRecord, Ranges


class AckTracker:
    """Received packet numbers of one path and the timing of their acknowledgement."""

    __slots__ = ("received", "largest", "largest_eliciting", "largest_at", "unacked_eliciting", "ack_at",
                 "ack_now")

    def __init__(self, record: PacketRecord | None = None) -> None:
        """``record``: where the received numbers are kept (``wire.ack_record``; a driver with
        the native data path passes the native one, the same record in C)."""
        self.received = AckRecord() if record is None else record
        self.largest = -1  # largest packet number received, -1 before the first
        self.largest_eliciting = -1  # ... of the ack-eliciting ones: where a gap is judged from
        self.largest_at = 0.0  # when it arrived (the ACK's delay is measured from it)
        self.unacked_eliciting = 0  # ack-eliciting packets since the last ACK
        self.ack_at: float | None = None  # delayed-ACK deadline, None when no ACK is owed
        self.ack_now = False  # an ACK should go out with the next transmit

    def on_packet_received(self, pn: int, ack_eliciting: bool, now: float, ack_threshold: int,
                           max_ack_delay_s: float) -> None:
        """Record ``pn`` for acknowledgement and decide when to send the ACK."""
        # A gap or reordering: tell the sender promptly, but only about packets that
        # ask for acknowledgement; answering an ACK-only packet would start an ACK
        # ping-pong whenever acknowledgements themselves are lost or reordered.
        if ack_eliciting:
            if self._gap_before(pn):
                self.ack_now = True
            self.largest_eliciting = max(self.largest_eliciting, pn)
        self.received.add(pn, pn + 1)  # (the record keeps itself bounded)
        if pn > self.largest:
            self.largest = pn
            self.largest_at = now
        if ack_eliciting:
            self.unacked_eliciting += 1
            if self.unacked_eliciting >= ack_threshold:
                self.ack_now = True
            elif self.ack_at is None:
                self.ack_at = now + max_ack_delay_s

    def on_data_run(self, first_pn: int, end_pn: int, now: float, ack_threshold: int,
                    max_ack_delay_s: float) -> None:
        """Ack-eliciting packets ``first_pn .. end_pn - 1`` arrived together (one data run).

        Leaves the tracker as :meth:`on_packet_received` of each packet in turn
        would (same record, same ACK owed), in one call per run instead of one
        per packet: the native data path hands the core whole runs, and this is
        the receiver's per-run work on the event loop's thread.
        """
        if self._gap_before(first_pn):
            self.ack_now = True  # a gap before the run: tell the sender promptly
        last = end_pn - 1
        if last > self.largest_eliciting:
            self.largest_eliciting = last
        self.received.add(first_pn, end_pn)
        if last > self.largest:
            self.largest = last
            self.largest_at = now
        self.unacked_eliciting += end_pn - first_pn
        if self.unacked_eliciting >= ack_threshold:
            self.ack_now = True
        elif self.ack_at is None:
            self.ack_at = now + max_ack_delay_s

    def _gap_before(self, pn: int) -> bool:
        """Whether ack-eliciting ``pn`` arrives out of order: late (below the largest
        ack-eliciting number), or with a number missing between that one and it. Numbers
        already received do not count as missing: the peer's acknowledgement-only packets
        may overtake its data (``Transmitter._send``), and that is no loss to report."""
        expected = self.largest_eliciting + 1
        if pn == expected:
            return False
        return pn < expected or not self.received.contains(expected, pn)

    def on_timer(self, now: float) -> bool:
        """The path's timer fired: True if that was the delayed ACK's, which is now due at once."""
        if self.ack_at is not None and self.ack_at <= now:
            self.ack_now = True
            return True
        return False

    def ack_due(self, now: float) -> bool:
        """Whether an ACK should be sent at ``now`` (at once, or its delay has run out)."""
        return self.ack_now or (self.ack_at is not None and self.ack_at <= now)

    @property
    def has_unacked(self) -> bool:
        """Something was received that the last ACK did not cover, or an ACK was asked for."""
        return self.largest >= 0 and (self.unacked_eliciting > 0 or self.ack_now)

    def ack_ranges(self) -> Ranges:
        """Inclusive packet-number ranges, highest first, for an ACK frame."""
        return self.received.ranges()

    def ack_sent(self) -> None:
        """An ACK covering everything received went out: nothing is owed until more arrives."""
        self.unacked_eliciting = 0
        self.ack_at = None
        self.ack_now = False
