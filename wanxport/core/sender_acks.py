"""The sending side of ACK processing: the peer's ACKs (wire numbers) applied to our paths.

Split from ``core.session`` because it is one job with its own mechanics:
translating wire numbers back to core packets (``core.numbering``), confirming
the datagrams of partly acknowledged packets, and handing what was acknowledged
or lost to the outgoing data, the transmitter and the failover policy.

It takes the ACKs of one path *in batches*: a drain of a sender's sockets
holds a path's ACKs back to back (about 1.25 a drain on loopback at 128
datagrams a core packet), and each ACK cost a translation, a loss-detector
pass, a rate sample and a controller update (~140 us of the sender's loop,
measured on loopback). Applied together, they cost one of each; what they acknowledge is
the same, as if only the newest had arrived carrying everything the older
ones did (``WireNumbering.translate_fresh``).
"""

from __future__ import annotations

from wanxport.core.config import SessionConfig
from wanxport.core.failover import Failover
from wanxport.core.health import PathState
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.transmitter import Transmitter
from wanxport.wire.frames import AckFrame


class SenderAcks:
    """Applies batches of one path's ACK frames to that path and to what it carried."""

    __slots__ = ("config", "paths", "outgoing", "tx", "failover")

    def __init__(self, config: SessionConfig, paths: list[Path], outgoing: OutgoingData, tx: Transmitter,
                 failover: Failover) -> None:
        self.config = config
        self.paths = paths
        self.outgoing = outgoing
        self.tx = tx
        self.failover = failover

    def apply(self, path_id: int, frames: list[AckFrame], now: float, held_s: float = 0.0) -> None:
        """ACKs of one path in arrival order: whole core packets acknowledged, partly covered
        ones confirmed. An ACK for a path we do not have is ignored. ``held_s``: how long the
        newest of them waited in our driver (the receive hold-off): not part of the round trip.

        A core packet counts as acknowledged only when all its datagrams are, but
        the datagrams of a partly acknowledged one did arrive: their bytes count, so
        a loss re-sends one datagram's worth, not the whole core packet (with 32
        datagrams a core packet and 1 % loss, that was a quarter of the data).
        """
        if not 0 <= path_id < len(self.paths):
            return
        path = self.paths[path_id]
        oldest = path.loss.oldest_of_interest()
        if oldest is None:
            return  # nothing outstanding or remembered: nothing to learn
        tx = self.tx
        at = path.loss.arrival(now, held_s)
        translated, parts, delay_us = tx.wire[path_id].translate_fresh(frames, oldest)
        if parts:
            segment = tx.segments[path_id]
            for core_pn, first, last in parts:
                self._confirm_part(path, core_pn, first * segment, (last + 1) * segment, at)
        if not translated:
            return
        delay = min(delay_us / 1e6, self.config.max_ack_delay_s)
        acked, lost = path.on_ack(translated, delay, now, at)
        if acked:
            outgoing = self.outgoing
            for packet in acked:
                if packet.chunks:
                    outgoing.on_acked(packet.chunks)
            if path.state is not PathState.ACTIVE:
                self.failover.readmit(path, now)
        if lost:
            tx.requeue(lost)
        tx.dirty.add(path_id)
        tx.touch(path)

    def _confirm_part(self, path: Path, packet_number: int, start: int, end: int, now: float) -> None:
        """``[start, end)`` of the data an outstanding packet carries reached the peer.

        An acknowledgement finer than a packet (some datagrams of a segmented
        one) says so. The bytes count as delivered for the path's rate estimate,
        and if the packet is declared lost only the rest is sent again.
        Ignored for a packet no longer outstanding or not carrying one chunk.
        """
        part = path.loss.confirm_part(packet_number, start, end, now)
        if part is not None and part[0] in self.outgoing.shards:
            self.outgoing.on_acked([part])
