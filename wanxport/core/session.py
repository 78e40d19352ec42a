"""The sans-IO multipath session: one object per peer, driven by time and packets.

The shape follows aioquic's ``QuicConnection``: the driver (the simulator or
the asyncio adapter) hands in received packets with ``now``, asks for packets
to send, asks when the next timer is due and fires it, and pops events. The
session never reads a clock, opens a socket or draws randomness; it composes
the parts that do the thinking (paths, recovery, scheduler, outgoing and
incoming data, credits), each in its own module.

Packets cross this boundary *opened*: header fields plus frames. The session
owns the datagram: a ``Transmit`` names the wire packet numbers of each
datagram (``numbering``), and a DATA transmit is ``count`` datagrams of
``segment_size`` bytes that the data path cuts and seals. DATA frames going
out carry ``data=None`` for virtual shards, or a view of the shard buffer;
sealing and opening datagrams is the data path's job (``wanxport.wire.datapath``,
``wanxport.wire.receiver`` or the native one). ACKs come back in wire numbers
and are translated here.
"""

from __future__ import annotations

from wanxport.core import recovery
from wanxport.core.cc import CongestionController
from wanxport.core.config import SessionConfig
from wanxport.core.deadlines import DeadlineHeap
from wanxport.core.events import (
    Event,
    PathChanged,
    SessionClosed,
    ShardAcknowledged,
    ShardFilled,
    ShardReceived,
)
from wanxport.core.flow import ReceiveBudget, SendCredit
from wanxport.core.incoming import Allocator, IncomingData, allocate_bytearray
from wanxport.core.numbering import WireNumbering
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path, PathState
from wanxport.core.ranges import RangeSet
from wanxport.core.scheduler import ChunkKind, create_scheduler
from wanxport.core.sent_packets import Chunk, SentPacket
from wanxport.core.shards import IncomingShard, OutgoingShard, sha256
from wanxport.core.transmit import Transmit, number_datagrams
from wanxport.wire.frames import (
    AckFrame,
    CloseFrame,
    CreditFrame,
    DataFrame,
    Frame,
    PaddingFrame,
    ProbeAckFrame,
    ProbeFrame,
    ShardAckFrame,
    ShardDoneFrame,
    ShardOpenFrame,
)

MAX_CONTROL_PAYLOAD = 1200
# How long an unanswered probe is remembered: its answer readmits the path only while
# it is. Longer than any round trip a usable path has, even after a reroute.
PROBE_MEMORY_S = 2.0


class Session:
    """Both directions of one multipath session with one peer."""

    def __init__(self, config: SessionConfig, allocator: Allocator | None = None, *,
                 defer_verification: bool = False) -> None:
        """``defer_verification``: a complete shard is announced as ``ShardFilled`` and the
        driver checks its digest (off its event loop) and calls ``shard_verified``;
        otherwise the session hashes it on the spot (the simulator's choice: no threads)."""
        self.config = config
        self.defer_verification = defer_verification
        self.paths = [
            Path(i, p.name, config.data_payload(p), self._make_cc(config, i), config.initial_rtt_s)
            for i, p in enumerate(config.paths)
        ]
        self.outgoing = OutgoingData(SendCredit(config.peer_credit_bytes))
        self.scheduler = create_scheduler(config.scheduler, config, self.outgoing)
        self.incoming = IncomingData(ReceiveBudget(config.receive_budget_bytes),
                                     allocator or allocate_bytearray)
        self._control: list[Frame] = []
        self._events: list[Event] = []
        self._deadlines = DeadlineHeap(len(self.paths))  # per path: its earliest timer
        self._wire = [WireNumbering() for _ in self.paths]
        self._segments = [config.datagram_payload(p) for p in config.paths]
        self._dirty: set[int] = set(range(len(self.paths)))
        self.closed: SessionClosed | None = None
        self.data_dropped = 0  # DATA we could not accept (unknown shard, out of bounds)
        self.hedged_bytes = 0
        self._touched: set[int] = set()
        self._needs_ack: set[int] = set()  # paths with an ACK or path control frames to send

    @staticmethod
    def _make_cc(config: SessionConfig, index: int) -> CongestionController:
        return config.congestion_control.build(config.cc_context(index))

    # -- application side ----------------------------------------------------

    def submit(self, shard_id: int, data: bytes | bytearray | memoryview | None, now: float, *,
               size: int | None = None, meta: bytes = b"", digest: bytes | None = None) -> None:
        """Queue a shard. ``data=None`` makes it virtual: ``size`` bytes tracked, none moved."""
        if self.closed is not None:
            raise RuntimeError("session is closed")
        if not 0 <= shard_id < 1 << 32:
            raise ValueError("shard_id must fit in 32 bits")
        view = memoryview(data).cast("B") if data is not None else None
        length = len(view) if view is not None else size
        if length is None or length <= 0:
            raise ValueError("a shard needs data or a positive size")
        if length > self.config.peer_credit_bytes:
            raise ValueError(f"shard {shard_id} has {length} bytes, more than the peer's whole receive "
                             f"budget ({self.config.peer_credit_bytes} bytes); split it or raise the budget")
        if digest is None:
            digest = sha256(view) if view is not None else bytes(32)
        shard = OutgoingShard(shard_id, length, view, digest, meta, submitted_at=now)
        self.outgoing.submit(shard)
        self._dirty.update(range(len(self.paths)))

    @property
    def sending_done(self) -> bool:
        return self.outgoing.unfinished == 0

    def events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def close(self, now: float, code: int = 0, reason: str = "") -> None:
        """Tell the peer we are done (best effort) and stop."""
        if self.closed is None:
            self._control.append(CloseFrame(code, reason))
            self.closed = SessionClosed(code, reason, now)

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
            first = self._wire[path.path_id].reserve(1)
            size = self.config.packet_overhead() + frames[0].wire_size
            out.append(Transmit(path.path_id, first, 1, self._segments[path.path_id], frames, size, now))
        return out

    # -- receive -------------------------------------------------------------

    def receive_packet(self, path_id: int, packet_number: int, frames: list[Frame], now: float) -> None:
        """An authenticated, de-duplicated datagram (wire ``packet_number``) arrived on ``path_id``."""
        if not 0 <= path_id < len(self.paths):
            self.data_dropped += 1
            return
        path = self.paths[path_id]
        eliciting = False
        accept = True
        for frame in frames:
            if isinstance(frame, DataFrame):
                eliciting = True
                accept = self._on_data(frame, now) and accept
            elif isinstance(frame, AckFrame):
                self._on_ack(frame, now)
            elif isinstance(frame, PaddingFrame):
                continue
            elif isinstance(frame, ProbeAckFrame):
                self._on_control(path, frame, now)  # an answer: nothing to acknowledge
            else:
                eliciting = True
                self._on_control(path, frame, now)
        if not accept:
            self._flush_timers()
            return  # not acknowledged: the sender will re-send it once the shard is open
        path.on_packet_received(packet_number, eliciting, now, self.config.ack_threshold,
                                self.config.max_ack_delay_s)
        if path.ack_now:
            self._needs_ack.add(path_id)  # otherwise the ack timer (ack_at) will add it
        self._touch(path)
        self._flush_timers()

    def receive_data_run(self, path_id: int, first_pn: int, count: int, shard_id: int, offset: int,
                         length: int, now: float) -> None:
        """``count`` data datagrams, packet numbers ``first_pn...``, carried ``[offset, offset+length)``.

        The native data path has already authenticated them and placed their bytes;
        this records them for acknowledgement and reassembly in one call per run.
        """
        if not 0 <= path_id < len(self.paths) or count < 1:
            self.data_dropped += 1
            return
        if self.incoming.accepts(shard_id, offset, length) is False:
            self.data_dropped += 1  # not acknowledged: the sender re-sends once the shard is open
            return
        last = first_pn + count - 1
        if count > 1:
            path = self.paths[path_id]
            if first_pn != path.recv_largest + 1:
                path.ack_now = True  # a gap before the run: tell the sender promptly
            path.recv_pns.add(first_pn, last)
            if last - 1 > path.recv_largest:
                path.recv_largest = last - 1
                path.recv_largest_at = now
            path.unacked_eliciting += count - 1
        self.receive_packet(path_id, last, [DataFrame(shard_id, offset, length, None)], now)

    def _on_data(self, frame: DataFrame, now: float) -> bool:
        verdict = self.incoming.accepts(frame.shard_id, frame.offset, frame.length)
        if verdict is None:
            return True
        if not verdict:
            self.data_dropped += 1
            return False
        shard = self.incoming.shards[frame.shard_id]
        shard.place(frame.offset, frame.data, frame.length, now)
        if shard.complete and not shard.verifying:
            if self.defer_verification and shard.buffer is not None:
                shard.verifying = True
                self._events.append(ShardFilled(shard.shard_id, shard.buffer, shard.digest, now))
            else:
                self._hand_over(shard, self.incoming.finish(shard, now), now)
        return True

    def received_prefix(self, shard_id: int) -> int:
        """How many bytes from the start of an incoming shard are in (0 if unknown).

        They are never written again, so a driver may hash them while the rest
        arrives (``defer_verification``).
        """
        shard = self.incoming.shards.get(shard_id)
        return 0 if shard is None else shard.received_prefix

    def shard_verified(self, shard_id: int, ok: bool, now: float) -> None:
        """The driver's verdict on a ``ShardFilled`` shard: ``ok`` when its digest matched.

        A verdict for a shard that is not awaiting one (unknown, already handed
        over) is ignored.
        """
        shard = self.incoming.shards.get(shard_id)
        if shard is None or not shard.verifying:
            return
        self._hand_over(shard, self.incoming.release(shard, ok, now), now)

    def _hand_over(self, shard: IncomingShard, status: int, now: float) -> None:
        """A checked shard goes to the application, its verdict and our credit to the peer."""
        self._events.append(ShardReceived(shard.shard_id, shard.size, shard.meta,
                                          shard.verified is True, now))
        self._control.append(ShardDoneFrame(shard.shard_id, status))
        self._control.append(CreditFrame(self.incoming.budget.limit))

    def _on_control(self, path: Path, frame: Frame, now: float) -> None:
        if isinstance(frame, ShardOpenFrame):
            self.incoming.open(frame)
        elif isinstance(frame, ShardDoneFrame):
            shard = self.outgoing.on_done(frame.shard_id, frame.status)
            if shard is not None:
                self.scheduler.forget_shard(shard.shard_id)
                self._events.append(ShardAcknowledged(shard.shard_id, frame.status == 0, now))
        elif isinstance(frame, CreditFrame):
            self.outgoing.credit.update(frame.max_bytes)
            self._dirty.update(range(len(self.paths)))
        elif isinstance(frame, ShardAckFrame):
            shard = self.outgoing.shards.get(frame.shard_id)
            if shard is not None:
                for start, end in frame.ranges:
                    shard.acked.add(start, min(end, shard.size))
        elif isinstance(frame, ProbeFrame):
            self._control_on(path, ProbeAckFrame(frame.token))
        elif isinstance(frame, CloseFrame):
            if self.closed is None:
                self.closed = SessionClosed(frame.code, frame.reason, now)
                self._events.append(self.closed)

    def _control_on(self, path: Path, frame: Frame) -> None:
        path.pending_control.append(frame)
        self._needs_ack.add(path.path_id)

    def _on_ack(self, frame: AckFrame, now: float) -> None:
        """An ACK in wire numbers: whole core packets acknowledged, partly covered ones confirmed.

        A core packet counts as acknowledged only when all its datagrams are, but
        the datagrams of a partly acknowledged one did arrive: their bytes count, so
        a loss re-sends one datagram's worth, not the whole core packet (with 32
        datagrams a core packet and 1 % loss, that was a quarter of the data).
        """
        if not 0 <= frame.path_id < len(self.paths):
            return
        path = self.paths[frame.path_id]
        oldest = self._oldest_of_interest(path)
        if oldest is None:
            return  # nothing outstanding or remembered: nothing to learn
        translated, parts = self._wire[frame.path_id].translate_fresh(frame, oldest)
        segment = self._segments[frame.path_id]
        for core_pn, first, last in parts:
            self._confirm_part(path, core_pn, first * segment, (last + 1) * segment, now)
        if translated is None:
            return
        delay = min(frame.ack_delay_us / 1e6, self.config.max_ack_delay_s)
        acked, lost = recovery.on_ack(path, translated.ranges, delay, now)
        if acked:
            for packet in acked:
                if packet.chunks:
                    self.outgoing.on_acked(packet.chunks)
            if path.state is not PathState.ACTIVE:
                self._readmit(path, now)
        if lost:
            self._requeue(lost)
        self._dirty.add(path.path_id)
        self._touch(path)

    @staticmethod
    def _oldest_of_interest(path: Path) -> int | None:
        """The lowest core packet number of the path an ACK can still tell us about, or None.

        Below it every packet is acknowledged or declared lost and forgotten, so
        the ranges an ACK repeats for them (every ACK repeats its ranges) need no work.
        """
        oldest = next(iter(path.sent), None)
        if path.recently_lost_pns and (oldest is None or path.recently_lost_pns[0] < oldest):
            oldest = path.recently_lost_pns[0]  # a late delivery proves the loss spurious
        return oldest

    def _confirm_part(self, path: Path, packet_number: int, start: int, end: int, now: float) -> None:
        """``[start, end)`` of the data an outstanding packet carries reached the peer.

        An acknowledgement finer than a packet (some datagrams of a segmented
        one) says so. The bytes count as delivered for the path's rate estimate,
        and if the packet is declared lost only the rest is sent again.
        Ignored for a packet no longer outstanding or not carrying one chunk.
        """
        packet = path.sent.get(packet_number)
        if packet is None or packet.chunks is None or len(packet.chunks) != 1:
            return
        shard_id, offset, length = packet.chunks[0]
        start, end = max(start, 0), min(end, length)
        if start >= end:
            return
        if packet.confirmed is None:
            packet.confirmed = RangeSet()
        if not packet.confirmed.add(start, end):
            return
        credit = packet.size * packet.confirmed.total // length - packet.credited  # no rounding drift
        packet.credited += credit
        if packet.in_flight and packet.rate_state is not None:
            path.rate.on_bytes_delivered(credit, now)
        if shard_id in self.outgoing.shards:
            self.outgoing.on_acked([(shard_id, offset + start, end - start)])

    # -- send ----------------------------------------------------------------

    def poll_transmit(self, now: float) -> list[Transmit]:
        """Everything that should leave now or within the pacing horizon."""
        out: list[Transmit] = []
        if self._needs_ack:
            for path_id in sorted(self._needs_ack):
                path = self.paths[path_id]
                if path.ack_now or path.pending_control or (path.ack_at is not None and path.ack_at <= now):
                    self._emit_path_control(path, now, out)
            self._needs_ack.clear()  # an ACK not yet due has its ack timer
        if self._control:
            self._emit_control(now, out)
        for shard in self.outgoing.open_ready():
            for path in self.paths:
                path.needs_open.add(shard.shard_id)
        self._emit_data(now, out)
        self._flush_timers()
        return out

    def _emit_path_control(self, path: Path, now: float, out: list[Transmit]) -> None:
        frames: list[Frame] = []
        if path.recv_largest >= 0 and (path.unacked_eliciting or path.ack_now):
            departs = max(now, path.last_departure_at)  # behind data already handed out
            delay_us = int(max(0.0, departs - path.recv_largest_at) * 1e6)
            frames.append(AckFrame(path.path_id, min(delay_us, 0xFFFFFFFF), path.ack_ranges()))
            path.ack_sent()
        frames.extend(path.pending_control)
        # A probe must be acknowledged (that readmits the path); a probe answer need not.
        eliciting = any(isinstance(frame, ProbeFrame) for frame in path.pending_control)
        path.pending_control = []
        path.ack_now = False
        if frames:
            self._send(path, frames, now, now, out, in_flight=False, eliciting=eliciting)

    def _emit_control(self, now: float, out: list[Transmit]) -> None:
        path = self._best_path(now)
        if path is None:
            return
        frames: list[Frame] = []
        size = 0
        for frame in self._control:
            if frames and size + frame.wire_size > MAX_CONTROL_PAYLOAD:
                self._send(path, frames, now, now, out, control=frames)
                frames, size = [], 0
            frames.append(frame)
            size += frame.wire_size
        if frames:
            self._send(path, frames, now, now, out, control=frames)
        self._control = []

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
        if not self.outgoing.unfinished or not self._dirty:
            return
        if self.scheduler.refresh(self.paths, now):
            self._dirty.update(range(len(self.paths)))  # data became free for every path
        # A path without window room, or whose pacing holds it beyond the horizon,
        # waits whatever the others do: settle those first, so only the paths that
        # may send are ordered (after a loss every path is dirty; with hundreds of
        # paths, sorting them all on every call dominated the simulator's time).
        ready: list[Path] = []
        for i in self._dirty:
            path = self.paths[i]
            if not path.usable or path.cwnd_space <= 0:
                continue  # the next acknowledgement marks it changed
            horizon = now + self._horizon_s(path)
            if path.next_send_at > horizon:
                wake = path.next_send_at - (horizon - now)
                if path.pacing_wake != wake:  # unchanged: its timer already stands
                    path.pacing_wake = wake
                    self._touch(path)
                continue
            ready.append(path)
        self._dirty.clear()
        if len(ready) > 1:
            ready = self.scheduler.order(ready, now)
        for path in ready:
            wait_until = self.scheduler.hold(path, now)
            if wait_until is not None:
                self._release_stripe(path)
                path.pacing_wake = wait_until
                self._touch(path)
                continue
            self._fill(path, now, now + self._horizon_s(path), out)

    def _release_stripe(self, path: Path) -> None:
        """Give the data the path reserved to the others, and let them know."""
        if self.scheduler.release(path.path_id):
            self._dirty.update(i for i, p in enumerate(self.paths) if p.usable and p is not path)

    def _horizon_s(self, path: Path) -> float:
        """How far ahead of its departure a packet is handed out: about one burst.

        Handed-out packets count as in flight, so the horizon stays well under a
        round trip or the congestion controller would see a phantom queue.
        """
        burst_s = self.config.burst_packets * (path.mss + self.config.packet_overhead()) * 8
        return max(self.config.pacing_horizon_s, min(burst_s / path.cc.pacing_rate_bps, path.rtt.min_s / 8))

    def _fill(self, path: Path, now: float, horizon: float, out: list[Transmit]) -> None:
        overhead = self.config.packet_overhead()
        path.pacing_wake = None
        while path.cwnd_space > 0:
            if path.next_send_at > horizon:
                path.pacing_wake = path.next_send_at - (horizon - now)
                self._touch(path)
                return
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
            self._send(path, frames, now, not_before, out, chunks=[chunk])
            stats = path.stats
            stats.payload_bytes += length
            if kind is ChunkKind.RETRANSMISSION:
                stats.retransmitted_bytes += length
            elif kind is ChunkKind.HEDGE:
                stats.hedged_bytes += length
                self.hedged_bytes += length
            # Pace by the whole datagram, DATA frame header included: the delivery-rate
            # samples count the same bytes, so gain 1.0 is exactly the measured rate.
            # Leaving the frame header out paced ~1 % above it: a queue crept up
            # over seconds until it overflowed and a congestion cap cut the rate.
            rate = path.cc.pacing_rate_bps / 8
            path.next_send_at = not_before + (overhead + frames[0].wire_size) / rate

    def _send(self, path: Path, frames: list[Frame], now: float, not_before: float,
              out: list[Transmit], *, chunks: list[Chunk] | None = None,
              control: list[Frame] | None = None, in_flight: bool = True, eliciting: bool = True) -> None:
        # Packets leave a path in packet-number order: one handed out later never
        # departs before one already scheduled (an ACK overtaking paced data would
        # look like reordering to the peer, which answers reordering at once).
        if not_before < path.last_departure_at:
            not_before = path.last_departure_at
        path.last_departure_at = not_before
        pn = path.take_pn()
        overhead = self.config.packet_overhead()
        size = overhead + sum(f.wire_size for f in frames)
        if in_flight or eliciting:
            rate_state = path.rate.on_packet_sent(not_before, path.bytes_in_flight) if in_flight else None
            recovery.on_packet_sent(path, SentPacket(pn, not_before, size, chunks, control,
                                                     eliciting, in_flight, rate_state))
        out.append(number_datagrams(self._wire[path.path_id], path.path_id, pn, frames,
                                    chunks[0][2] if chunks is not None else None,
                                    self._segments[path.path_id], overhead, not_before))
        self._touch(path)

    # -- loss, failure, readmission -----------------------------------------

    def _requeue(self, lost: list[SentPacket]) -> None:
        for packet in lost:
            if packet.chunks:
                self.outgoing.requeue(packet.chunks)
            if packet.control:
                self._control.extend(packet.control)
        self._dirty.update(range(len(self.paths)))
        self.scheduler.data_requeued()

    def _set_state(self, path: Path, state: PathState, now: float) -> None:
        if state in (PathState.DEGRADED, PathState.FAILED):
            self._release_stripe(path)
        if path.state is not state:
            self._events.append(PathChanged(path.path_id, path.name, path.state.value, state.value, now))
            path.set_state(state)

    def _readmit(self, path: Path, now: float) -> None:
        if path.state is PathState.FAILED:
            # The answer to a probe carried a fresh RTT sample: resume at the saved rate
            # if it shows the same route, else search from scratch.
            rate_bps = path.resume_rate_bps()
            if rate_bps > 0.0:
                path.cc.on_path_resume(now, rate_bps)
            else:
                path.cc.on_path_reset(now)
            path.next_send_at = now
            self._set_state(path, PathState.PROBING, now)
        elif path.state is PathState.DEGRADED:
            self._set_state(path, PathState.ACTIVE, now)
        elif path.state is PathState.PROBING and not path.cc.in_startup:
            self._set_state(path, PathState.ACTIVE, now)
        path.next_probe_at = None
        path.probe_misses = 0
        self._dirty.add(path.path_id)

    def _on_probe_timeout(self, path: Path, now: float) -> None:
        """No acknowledgement for a probe timeout: suspect the path, move its data elsewhere."""
        path.save_for_resume()  # before the losses below touch the congestion state
        path.pto_count += 1
        lost = recovery.declare_all_lost(path, now)
        if lost:
            self._requeue(lost)
        if path.state in (PathState.ACTIVE, PathState.PROBING):
            self._set_state(path, PathState.DEGRADED, now)
        self._send_probe(path, now)

    def _send_probe(self, path: Path, now: float) -> None:
        # A long outage holds the probes of the last PROBE_MEMORY_S, not one per interval.
        # Not just the latest: a path that returns with a round trip longer than the probe
        # interval (rerouted) answers a probe that would already be forgotten, and the
        # answer to a forgotten probe readmits nothing: the path would never come back.
        horizon = now - PROBE_MEMORY_S
        for pn in [pn for pn, p in path.sent.items() if not p.in_flight and p.sent_at < horizon]:
            del path.sent[pn]
        path.probe_token += 1
        self._control_on(path, ProbeFrame(path.probe_token))
        if path.state is PathState.FAILED:
            # Out of service: probes only watch for its return, and their answers are
            # not awaited, so they may go faster than a round trip.
            interval = self.config.failed_probe_interval_s
        else:
            # Suspected: each interval without an answer is a miss (two fail the path),
            # so an answer must have had time to come back.
            interval = min(path.pto_s(self.config.max_ack_delay_s), self.config.max_probe_interval_s)
        path.next_probe_at = now + interval

    def _on_probe_due(self, path: Path, now: float) -> None:
        path.probe_misses += 1
        if path.probe_misses >= 2 and path.state is not PathState.FAILED:
            path.stats.failures += 1
            self._set_state(path, PathState.FAILED, now)
        lost = recovery.declare_all_lost(path, now)
        if lost:
            self._requeue(lost)
        path.pto_count += 1
        self._send_probe(path, now)

    # -- timers --------------------------------------------------------------

    def _touch(self, path: Path) -> None:
        """The path's state changed: recompute its deadline before control returns."""
        self._touched.add(path.path_id)

    def _flush_timers(self) -> None:
        deadlines = self._deadlines
        for path_id in self._touched:
            deadlines.set(path_id, self._path_deadline(self.paths[path_id]))
        self._touched.clear()

    def _path_deadline(self, path: Path) -> float:
        at = float("inf")
        if path.ack_at is not None:
            at = path.ack_at
        loss = recovery.loss_deadline(path)
        if loss is not None and loss < at:
            at = loss
        if path.usable:
            pto = path.pto_deadline(self.config.max_ack_delay_s)
            if pto is not None and pto < at:
                at = pto
        if path.next_probe_at is not None and path.next_probe_at < at:
            at = path.next_probe_at
        if path.pacing_wake is not None and path.pacing_wake < at:
            at = path.pacing_wake
        return at

    def next_deadline(self) -> float | None:
        at = self._deadlines.earliest()
        return None if at == float("inf") else at

    def on_deadline(self, now: float) -> None:
        for path_id in self._deadlines.pop_due(now):
            self._fire(self.paths[path_id], now)
        self._flush_timers()

    def _fire(self, path: Path, now: float) -> None:
        if path.ack_at is not None and path.ack_at <= now:
            path.ack_now = True
            self._needs_ack.add(path.path_id)
        lost = recovery.detect_losses(path, now)
        if lost:
            self._requeue(lost)
        pto = path.pto_deadline(self.config.max_ack_delay_s) if path.usable else None
        if pto is not None and pto <= now:
            self._on_probe_timeout(path, now)
        elif path.next_probe_at is not None and path.next_probe_at <= now:
            self._on_probe_due(path, now)
        path.pacing_wake = None
        self._dirty.add(path.path_id)
        self._touch(path)
