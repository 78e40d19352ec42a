"""What the sender remembers about each packet until it is acknowledged or lost."""

from __future__ import annotations

from wanxport.core.delivery_rate import PacketRateState
from wanxport.core.ranges import RangeSet
from wanxport.wire.frames import Frame

Chunk = tuple[int, int, int]  # (shard_id, offset, length)


class SentPacket:
    """One sent packet: its data chunks and control frames are re-queued if it is lost."""

    __slots__ = ("pn", "sent_at", "size", "chunks", "control", "ack_eliciting", "in_flight", "rate_state",
                 "confirmed", "credited")

    def __init__(
        self,
        pn: int,
        sent_at: float,
        size: int,
        chunks: list[Chunk] | None,
        control: list[Frame] | None,
        ack_eliciting: bool,
        in_flight: bool,
        rate_state: PacketRateState | None,
    ) -> None:
        self.pn = pn
        self.sent_at = sent_at
        self.size = size
        self.chunks = chunks
        self.control = control
        self.ack_eliciting = ack_eliciting
        self.in_flight = in_flight
        self.rate_state = rate_state
        # Parts of a segmented packet's data known to have arrived before the whole
        # packet is acknowledged (offsets into its one chunk; None until the first),
        # and the packet bytes already counted as delivered for them.
        self.confirmed: RangeSet | None = None
        self.credited = 0
