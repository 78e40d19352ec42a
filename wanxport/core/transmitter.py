"""The session's send mechanics: turning queued frames and the scheduler's picks into ``Transmit``s.

Split from ``core.session`` so the session reads as the protocol (what a frame
means, when a timer fires) and this module as the mechanics of sending: which
path carries connection-level control, pacing and the hand-out horizon, packet
numbering, the sent-packet record. What to send where stays the scheduler's
decision (``core.scheduler``).

The session and its parts talk to the transmitter through four public pieces
of state, shared and never rebound:

- ``dirty``: paths whose state changed since the last poll (only those are filled);
- ``touched``: paths whose timer deadline must be recomputed before control returns;
- ``needs_ack``: paths with an ACK or path-specific control frames to send;
- ``control``: connection-level control frames, for the best usable path.
"""

from __future__ import annotations

from wanxport.core.config import PACER_HEADROOM, SessionConfig
from wanxport.core.fec import FecSender
from wanxport.core.numbering import WireNumbering
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.scheduler import ChunkKind, Scheduler
from wanxport.core.scheduling.burst import burst_rate_bps, small_messages
from wanxport.core.sent_packets import Chunk, SentPacket
from wanxport.core.transmit import DataSource, Transmit, number_datagrams
from wanxport.wire.frames import AckFrame, DataFrame, Frame, ProbeFrame, ShardOpenFrame

MAX_CONTROL_PAYLOAD = 1200
#: A pacing wake-up served this long after it was due is late: a loop's timers are ~1 ms
#: coarse, and a loop short of CPU runs them 5-20 ms late (PathCounters.late_wakes).
LATE_WAKE_S = 0.002


class Transmitter:
    """Builds the datagrams of every path, in packet-number and pacing order."""

    def __init__(self, config: SessionConfig, paths: list[Path], outgoing: OutgoingData,
                 scheduler: Scheduler) -> None:
        self.config = config
        self.paths = paths
        self.outgoing = outgoing
        self.scheduler = scheduler
        self.control: list[Frame] = []
        self.dirty: set[int] = set(range(len(paths)))
        self.touched: set[int] = set()
        self.needs_ack: set[int] = set()
        self.wire = [WireNumbering() for _ in paths]  # per path: core packet -> wire numbers
        self.segments = [config.datagram_payload(p) for p in config.paths]  # per path: datagram payload
        self.hedged_bytes = 0
        self.fec = FecSender(config, paths, outgoing)
        self.bursting: set[int] = set()  # paths pacing a small message's burst (core.scheduling.burst)

    def touch(self, path: Path) -> None:
        """The path's state changed: its deadline is recomputed before control returns."""
        self.touched.add(path.path_id)

    def clear_wake(self, path: Path, now: float) -> None:
        """The path's pacing wake-up is over: its timer fired, or the path is being filled.

        One served more than LATE_WAKE_S after it was due is counted: the path's
        departures slipped by that much. A gateway whose loop is short of CPU shows
        it here (one for every 3 to 20 packets of a path on a saturated 2-core
        host) long before its throughput says why.
        """
        if path.pacing_wake is not None and now - path.pacing_wake > LATE_WAKE_S:
            path.counters.late_wakes += 1
        path.pacing_wake = None

    def control_on(self, path: Path, frame: Frame) -> None:
        """Queue a frame that must go out on ``path`` itself (a probe, a probe answer)."""
        path.pending_control.append(frame)
        self.needs_ack.add(path.path_id)

    def requeue(self, lost: list[SentPacket]) -> None:
        """What lost packets carried goes back in line, for any path."""
        for packet in lost:
            if packet.chunks:
                self.outgoing.requeue(packet.chunks)
            if packet.control:
                self.control.extend(packet.control)
        self.dirty.update(range(len(self.paths)))
        self.scheduler.data_requeued()

    def handshake_probes(self, now: float) -> list[Transmit]:
        """One PROBE datagram per path before any data, outside the packet accounting.

        A driver sends them to learn that the peer hears every path (the peer
        answers each; see ``aio.Endpoint.probe_paths``). Their wire numbers are
        reserved ahead of the first core packet, so no ACK of them can confirm
        anything; only before the session has sent a packet.
        """
        out: list[Transmit] = []
        for path in self.paths:
            frames: list[Frame] = [ProbeFrame(0)]
            first = self.wire[path.path_id].reserve(1)
            size = self.config.packet_overhead() + frames[0].wire_size
            out.append(Transmit(path.path_id, first, 1, self.segments[path.path_id], frames, size, now))
        return out

    def poll(self, now: float) -> list[Transmit]:
        """Everything that should leave now or within the pacing horizon."""
        out: list[Transmit] = []
        if self.needs_ack:
            for path_id in sorted(self.needs_ack):
                path = self.paths[path_id]
                if path.acks.ack_due(now) or path.pending_control:
                    self._emit_path_control(path, now, out)
            self.needs_ack.clear()  # an ACK not yet due has its ack timer
        for shard in self.outgoing.open_ready():
            for path in self.paths:
                path.needs_open.add(shard.shard_id)
            # Also as connection control, on the shortest round trip (every other path
            # still sends its own before its first DATA of the shard). The receiver
            # drops, unacknowledged, DATA of a shard it has not seen opened, so a path
            # whose only OPEN was lost went silent until its probe timeout suspected it
            # (docs/notes/steps.md); now that takes both copies lost.
            self.control.append(ShardOpenFrame(shard.shard_id, shard.size, shard.digest, shard.meta))
        if self.control:
            self._emit_control(now, out)
        self._emit_data(now, out)
        return out

    def _emit_path_control(self, path: Path, now: float, out: list[Transmit]) -> None:
        frames: list[Frame] = []
        acks = path.acks
        # A probe must be acknowledged (that readmits the path); a probe answer need not.
        eliciting = any(isinstance(frame, ProbeFrame) for frame in path.pending_control)
        if acks.has_unacked:
            # Acknowledgement-only packets leave now, ahead of data of ours already handed
            # out on the path (see ``_send``); anything eliciting goes behind it.
            departs = max(now, path.last_departure_at) if eliciting else now
            delay_us = int(max(0.0, departs - acks.largest_at) * 1e6)
            frames.append(AckFrame(path.path_id, min(delay_us, 0xFFFFFFFF), acks.ack_ranges()))
            acks.ack_sent()
        frames.extend(path.pending_control)
        path.pending_control = []
        if frames:
            self._send(path, frames, now, now, out, in_flight=False, eliciting=eliciting,
                       overtake=not eliciting)

    def _emit_control(self, now: float, out: list[Transmit]) -> None:
        path = self._best_path(now)
        if path is None:
            return
        frames: list[Frame] = []
        size = 0
        for frame in self.control:
            if isinstance(frame, ShardOpenFrame):
                path.needs_open.discard(frame.shard_id)  # this path's own copy would be the same
            if frames and size + frame.wire_size > MAX_CONTROL_PAYLOAD:
                self._send(path, frames, now, now, out, control=frames)
                frames, size = [], 0
            frames.append(frame)
            size += frame.wire_size
        if frames:
            self._send(path, frames, now, now, out, control=frames)
        self.control.clear()

    def _best_path(self, now: float) -> Path | None:
        usable = [p for p in self.paths if p.usable]
        if not usable:
            return None
        return min(usable, key=lambda p: p.rtt.smoothed_s)

    def _emit_data(self, now: float, out: list[Transmit]) -> None:
        """Fill the paths whose state changed (an ack, a timer, new data) since the last poll.

        Every other path is waiting for its window (an ack will change it), its
        pacing timer, or a re-check timer set when the scheduler held it back.
        What to send where is the scheduler's decision; this is the mechanics.
        """
        if not self.outgoing.unfinished or not self.dirty:
            return
        if self.bursting and (self.outgoing.retransmit_bytes
                              or not small_messages(self.paths, self.scheduler.remaining_bytes)):
            self.end_bursts()  # a large transfer or a loss: the controllers' pacing again
        if self.scheduler.refresh(self.paths, now):
            self.dirty.update(range(len(self.paths)))  # data became free for every path
        # A path without window room, or whose pacing holds it beyond the horizon,
        # waits whatever the others do: settle those first, so only the paths that
        # may send are ordered (after a loss every path is dirty; with hundreds of
        # paths, sorting them all on every call dominated the simulator's time).
        ready: list[Path] = []
        for i in self.dirty:
            path = self.paths[i]
            if not path.usable or path.cwnd_space <= 0:
                continue  # the next acknowledgement marks it changed
            horizon = now + self._horizon_s(path)
            if path.next_send_at > horizon:
                wake = path.next_send_at - (horizon - now)
                if path.pacing_wake != wake:  # unchanged: its timer already stands
                    path.pacing_wake = wake
                    self.touch(path)
                continue
            ready.append(path)
        self.dirty.clear()
        burst = self.scheduler.burst_path(ready, now, self.paths) if ready else None
        if burst is not None:
            burst.burst_rate_bps = burst_rate_bps(burst)
            self.bursting.add(burst.path_id)
            self._fill(burst, now, now + self._horizon_s(burst), out)
            ready.remove(burst)  # the others find nothing left, or hedge the tail as usual
        if len(ready) > 1:
            ready = self.scheduler.order(ready, now)
        for path in ready:
            wait_until = self.scheduler.hold(path, now)
            if wait_until is not None:
                self.release_stripe(path)
                path.pacing_wake = wait_until
                self.touch(path)
                continue
            self._fill(path, now, now + self._horizon_s(path), out)

    def end_bursts(self) -> None:
        """Paths carrying a small message's burst pace at their controllers' rates again."""
        for path_id in self.bursting:
            self.paths[path_id].burst_rate_bps = 0.0
        self.bursting.clear()

    def release_stripe(self, path: Path) -> None:
        """Give the data the path reserved to the others, and let them know."""
        if self.scheduler.release(path.path_id):
            self.dirty.update(i for i, p in enumerate(self.paths) if p.usable and p is not path)

    def _horizon_s(self, path: Path) -> float:
        """How far ahead of its departure a packet is handed out: about one burst.

        Handed-out packets count as in flight, so the horizon stays well under a
        round trip or the congestion controller would see a phantom queue.
        """
        burst_s = self.config.burst_packets * (path.mss + self.config.packet_overhead()) * 8
        return max(self.config.pacing_horizon_s, min(burst_s / path.pacing_rate_bps, path.rtt.min_s / 8))

    def _fill(self, path: Path, now: float, horizon: float, out: list[Transmit]) -> None:
        overhead = self.config.packet_overhead()
        self.clear_wake(path, now)
        self.fec.observe(path)
        repair: bool | None = None  # whether this path carries repair (asked once per fill)
        while path.cwnd_space > 0:
            if path.next_send_at > horizon:
                path.pacing_wake = path.next_send_at - (horizon - now)
                self.touch(path)
                return
            # Repair follows the data it covers: once nothing is left to send or re-send.
            if self.fec.pending and not self.scheduler.remaining_bytes:
                if repair is None:
                    repair = self.fec.carries_repair(path, now)
                if repair and self._send_repair(path, now, out):
                    continue
            picked = self.scheduler.next_chunk(path, now, self.paths)
            if picked is None:
                path.rate.on_app_limited(path.bytes_in_flight)
                return
            chunk, kind = picked
            shard_id, offset, length = chunk
            if shard_id in path.needs_open:
                path.needs_open.discard(shard_id)
                shard = self.outgoing.shards[shard_id]
                frame = ShardOpenFrame(shard_id, shard.size, shard.digest, shard.meta)
                self._send(path, [frame], now, max(now, path.next_send_at), out, control=[frame])
            data = self.outgoing.shards[shard_id].data
            view = data[offset:offset + length] if data is not None else None
            frames: list[Frame] = [DataFrame(shard_id, offset, length, view)]
            not_before = max(now, path.next_send_at)
            self._send(path, frames, now, not_before, out, chunks=[chunk],
                       source=DataSource(shard_id, data, offset, length))
            counters = path.counters
            counters.payload_bytes += length
            if kind is ChunkKind.RETRANSMISSION:
                counters.retransmitted_bytes += length
            elif kind is ChunkKind.HEDGE:
                counters.hedged_bytes += length
                self.hedged_bytes += length
            else:
                self.fec.on_new_data(length)
            if kind is not ChunkKind.HEDGE and not self.scheduler.remaining_bytes:
                self.fec.plan()  # nothing left behind the data in flight: protect it
            # Pace by the whole datagram, DATA frame header included: the delivery-rate
            # samples count the same bytes, so gain 1.0 is exactly the measured rate.
            # Leaving the frame header out paced ~1 % above it: a queue crept up
            # over seconds until it overflowed and a congestion cap cut the rate.
            rate = path.pacing_rate_bps / 8
            path.next_send_at = not_before + (overhead + frames[0].wire_size) / rate

    @staticmethod
    def _sample_from(path: Path, transmit: Transmit) -> float:
        """The time a packet's round-trip sample is measured from: its first datagram's departure,
        or for a packet grown past the configured size (``core.packet_size``), the departure
        of the datagram that ends a configured-size packet.

        The peer acknowledges a segmented packet once its last datagram has arrived, so a
        sample holds the packet's own serialisation. For the configured size that is part
        of what the controllers were tuned on (it reads as a little standing queue, and
        taking it out made a coupled session take 63 % of a link it shares with one TCP
        BBR flow instead of at most 55 %, tests/test_sim_fairness.py). Growth must not add
        to it: a 1.5 MB packet on a loopback path added 1.7 ms of its own, the minimum RTT
        read 2.5-4.9 ms instead of 0.5-1.4, and windows and socket queues grew to match.
        """
        sizer = path.sizer
        if sizer is None or transmit.count <= 1 or path.pacing_rate_bps <= 0.0:
            return transmit.not_before
        configured = -(-sizer.base // transmit.segment_size)  # datagrams of a configured-size packet
        extra = transmit.count - configured
        if extra <= 0:
            return transmit.not_before
        # The data path spreads a packet's datagrams PACER_HEADROOM faster than the core paces.
        return transmit.not_before + extra * (transmit.size / transmit.count) * 8.0 / (
            path.pacing_rate_bps * PACER_HEADROOM)

    def _send_repair(self, path: Path, now: float, out: list[Transmit]) -> bool:
        """Send the next queued REPAIR frame on ``path``, paced like data; False if none is left.

        In flight and congestion-controlled like data, but never re-sent: a lost
        repair symbol is simply one fewer (the data's own recovery still stands).
        """
        frame = self.fec.next_repair()
        if frame is None:
            return False
        not_before = max(now, path.next_send_at)
        self._send(path, [frame], now, not_before, out)
        path.counters.repair_bytes += frame.symbol
        self.fec.repair_bytes += frame.symbol
        size = self.config.packet_overhead() + frame.wire_size
        path.next_send_at = not_before + size / (path.pacing_rate_bps / 8)
        return True

    def _send(self, path: Path, frames: list[Frame], now: float, not_before: float,
              out: list[Transmit], *, chunks: list[Chunk] | None = None, source: DataSource | None = None,
              control: list[Frame] | None = None, in_flight: bool = True, eliciting: bool = True,
              overtake: bool = False) -> None:
        # Packets leave a path in packet-number order: one handed out later never
        # departs before one already scheduled. Except (``overtake``) a packet that asks
        # for nothing and that we never track: an acknowledgement of the peer's data.
        # Queued behind our own paced data, with data flowing both ways, it waited up
        # to a horizon plus a core packet at our rate on that path: the peer's RTT grew
        # with our slowness, its window then held its rate down, which delayed its
        # acknowledgements of our data in turn -- a spiral that took emulated
        # all-reduce paths to 1-2 Mb/s and second-long RTTs.
        # The peer's gap rule skips numbers such a packet took (``AckTracker``).
        if not overtake:
            if not_before < path.last_departure_at:
                not_before = path.last_departure_at
            path.last_departure_at = not_before
        pn = path.loss.take_pn()
        overhead = self.config.packet_overhead()
        size = overhead + sum(f.wire_size for f in frames)
        numbering = self.wire[path.path_id]
        transmit = number_datagrams(numbering, path.path_id, pn, frames, source,
                                    self.segments[path.path_id], overhead, not_before)
        out.append(transmit)
        if in_flight or eliciting:
            if in_flight and path.bytes_in_flight <= 0:
                path.restart_from_idle(not_before)
            rate_state = path.rate.on_packet_sent(not_before, path.bytes_in_flight) if in_flight else None
            path.loss.on_packet_sent(SentPacket(pn, self._sample_from(path, transmit), size, chunks,
                                                control, eliciting, in_flight, rate_state))
        if not (in_flight or eliciting):
            # Nothing tracks this packet (an acknowledgement), so no ACK answers it: a
            # receiver's path that carries none of its few tracked packets saw no ACK
            # to trim its numbering by, which kept every acknowledgement's span up to
            # MAX_TRACKED (8 MiB a path: the gateway daemon receiver's live heap growth).
            # Nor does an ACK come to prune what holds the oldest packet of interest down.
            path.loss.forget_stale(not_before)
            oldest = path.loss.oldest_of_interest()
            numbering.forget_below(pn if oldest is None else oldest)
        self.touch(path)
