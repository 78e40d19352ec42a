"""The sans-IO multipath session: one object per peer, driven by time and packets.

The shape follows aioquic's ``QuicConnection``: the driver (the simulator or
the asyncio adapter) hands in received packets with ``now``, asks for packets
to send, asks when the next timer is due and fires it, and pops events. The
session never reads a clock, opens a socket or draws randomness; it composes
the parts that do the thinking (paths, recovery, scheduler, outgoing and
incoming data, credits), each in its own module; the send mechanics live in
``core.transmitter``, path failure and readmission in ``core.failover``, and the
receiving half (placing, rebuilding and handing over shards) in ``core.reception``.

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

from collections.abc import Callable, Iterable, Sequence

from wanxport.core.cc import CongestionController, PathGroup
from wanxport.core.config import SessionConfig
from wanxport.core.counters import ShardCounters
from wanxport.core.deadlines import DeadlineHeap
from wanxport.core.digest import DIGEST_BYTES, shard_digest
from wanxport.core.events import (
    Event,
    SessionClosed,
    ShardAcknowledged,
)
from wanxport.core.failover import Failover
from wanxport.core.flow import ReceiveBudget, SendCredit
from wanxport.core.holdoff import HOLDOFF_RTT_RATIO, ReceiveHoldoff
from wanxport.core.incoming import Allocator, IncomingData, allocate_bytearray
from wanxport.core.late_digest import give_digest
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.rate_caps import apply_rate_caps, rate_caps
from wanxport.core.reception import Reception
from wanxport.core.scheduler import create_scheduler
from wanxport.core.sender_acks import SenderAcks
from wanxport.core.shards import OutgoingShard
from wanxport.core.stall import StallWatch
from wanxport.core.stats import SessionStats, session_stats
from wanxport.core.transmit import Transmit
from wanxport.core.transmitter import Transmitter
from wanxport.core.warm import PathMemory
from wanxport.wire.ack_record import PacketRecord
from wanxport.wire.frames import (
    AckFrame,
    CloseFrame,
    CreditFrame,
    DataFrame,
    Frame,
    PaddingFrame,
    ProbeAckFrame,
    ProbeFrame,
    RepairFrame,
    ShardAckFrame,
    ShardDigestFrame,
    ShardDoneFrame,
    ShardOpenFrame,
)

CLOSE_PROTOCOL_VIOLATION = 1  # CLOSE code: the peer broke the protocol (the reason says how)


class Session:
    """Both directions of one multipath session with one peer."""

    def __init__(self, config: SessionConfig, allocator: Allocator | None = None, *,
                 defer_verification: bool = False, receive_holdoff_s: float = 0.0,
                 receive_interval: bool = False,
                 ack_record: Callable[[], PacketRecord] | None = None) -> None:
        """``defer_verification``: a complete shard is announced as ``ShardFilled`` and the
        driver checks its digest (off its event loop) and calls ``shard_verified``;
        otherwise the session hashes it on the spot (the simulator's choice: no threads).
        ``receive_holdoff_s``: the receive coalescing a driver may apply (``core.holdoff``),
        never beyond the ACK delay; ``receive_interval``: it grows with the round trip (to an
        eighth of the shortest, at most the ACK delay: ``core.holdoff``). ``ack_record``: makes
        each path's record of received packet numbers (``wire.ack_record``; the driver of the
        native data path passes its C twin)."""
        self.config = config
        group = PathGroup()  # lets coupled controllers see their siblings
        self.paths = [
            Path(i, p.name, config.data_payload(p), self._make_cc(config, i, group), config.initial_rtt_s,
                 max_rate_bps=p.max_rate_bps, sizer=config.packet_sizer(p),
                 ack_record=None if ack_record is None else ack_record())
            for i, p in enumerate(config.paths)
        ]
        self.outgoing = OutgoingData(SendCredit(config.peer_credit_bytes))
        self.scheduler = create_scheduler(config.scheduler, config, self.outgoing)
        self.incoming = IncomingData(ReceiveBudget(config.receive_budget_bytes),
                                     allocator or allocate_bytearray)
        # Per path its earliest timer, and one more key for the session's own (stall detection).
        self._deadlines = DeadlineHeap(len(self.paths) + 1)
        # Per path its earliest timer that judges what was heard (all but the pacing wake-up).
        self._judged_at = [float("inf")] * len(self.paths)
        self._events: list[Event] = []
        self._stall = StallWatch(self._deadlines, len(self.paths), self._events)
        # Receive coalescing, for the driver to apply: ``receive_holdoff.wait_s()`` when a path
        # wakes, ``receive_holdoff.after_pass(now, pressed, held_s)`` after each receive pass.
        self.receive_holdoff = ReceiveHoldoff(min(receive_holdoff_s, config.max_ack_delay_s), self.incoming,
                                              self.paths,
                                              max_s=config.max_ack_delay_s if receive_interval else None)
        self._tx = Transmitter(config, self.paths, self.outgoing, self.scheduler)
        self._failover = Failover(config, self._tx, self._events)
        self._acks = SenderAcks(config, self.paths, self.outgoing, self._tx, self._failover)
        self.closed: SessionClosed | None = None
        # Shards (and their bytes) submitted, acknowledged by the peer, received; DATA dropped.
        self.counters = ShardCounters()
        self._rx = Reception(self.incoming, self.counters, self._stall, self._tx, self._events,
                             defer_verification)

    @staticmethod
    def _make_cc(config: SessionConfig, index: int, group: PathGroup) -> CongestionController:
        return config.congestion_control.build(config.cc_context(index, group))

    # -- application side ----------------------------------------------------

    def submit(self, shard_id: int, data: bytes | bytearray | memoryview | None, now: float, *,
               size: int | None = None, meta: bytes = b"", digest: bytes | None = None,
               digest_later: bool = False) -> None:
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
        if digest is None and not digest_later:
            digest = shard_digest(view) if view is not None else bytes(DIGEST_BYTES)
        shard = OutgoingShard(shard_id, length, view, digest, meta, submitted_at=now)
        self.outgoing.submit(shard)
        counters = self.counters
        counters.shards_submitted += 1
        counters.bytes_submitted += length
        self._tx.dirty.update(range(len(self.paths)))
        for path in self.paths:
            if path.freshness.start(now):  # even a path never measured gets probed (core.freshness)
                self._tx.touch(path)

    def set_digest(self, shard_id: int, digest: bytes) -> None:
        """The digest of a shard submitted with ``digest_later`` (``core.late_digest``)."""
        give_digest(self.outgoing, self._tx.control, shard_id, digest)

    @property
    def sending_done(self) -> bool:
        return self.outgoing.unfinished == 0

    def events(self) -> list[Event]:
        events = self._events[:]
        self._events.clear()  # the same list: the failover policy appends to it
        return events

    def watch_stall(self, timeout_s: float | None, now: float) -> None:
        """Report ``ReceiveStalled`` when shards are open and no data arrived for ``timeout_s``
        (None: never); counted from ``now`` or the latest progress (``core.stall``)."""
        self._stall.watch(timeout_s, now)

    def stats(self) -> SessionStats:
        """A frozen snapshot of the session's and every path's figures (safe from another thread):
        a copy of the counter groups kept in place (``core.counters``) and the gauges of now."""
        tx = self._tx
        return session_stats(self.counters, self.outgoing.acked_bytes, self.incoming.placed_bytes(),
                             tx.hedged_bytes, tx.fec.repair_bytes, self._rx.fec.counters, self.paths)

    def acked_bytes(self) -> int:
        """Payload bytes the peer acknowledged so far: one figure, no ``stats()`` snapshot taken."""
        return self.outgoing.acked_bytes

    def receiving_bytes(self) -> int:
        """Payload bytes held in incoming shards not yet handed to the application."""
        return self.incoming.placed_bytes()

    def pacing_rates_bps(self) -> list[float]:
        """Each path's pacing rate, bits/s, in path order: what a driver's pacer should follow.

        Cheaper than :meth:`stats` for a driver that re-reads the rates after
        every batch of transmits.
        """
        return [path.pacing_rate_bps for path in self.paths]

    def set_rate_caps(self, caps_bps: tuple[float | None, ...]) -> None:
        """The operator's sending rate cap of each path, from the next packet on (``core.rate_caps``)."""
        apply_rate_caps(self.paths, caps_bps)
        self._tx.dirty.update(range(len(self.paths)))

    def rate_caps_bps(self) -> tuple[float | None, ...]:
        """Each path's rate cap in force (None: uncapped), in path order."""
        return rate_caps(self.paths)

    def resume_path(self, path_id: int, memory: PathMemory, now: float) -> bool:
        """Careful resume of a new session's path from state a previous session saved.

        For a driver that kept ``memory`` across a restart (the gateway daemon's path
        cache): the path starts as usual, and its first acknowledgement checks the
        route (``core.warm``: RTT within 20 %); on the same route the controller then
        resumes at no more than half the saved rate (``on_path_resume``), else the
        state is dropped and the path keeps searching. Returns False, changing
        nothing, for an unknown path, state older than an hour or no saved rate.
        """
        if not 0 <= path_id < len(self.paths) or not memory.fresh(now) or not memory.rate_bps > 0.0:
            return False
        self.paths[path_id].pending_resume = memory
        return True

    def close(self, now: float, code: int = 0, reason: str = "") -> None:
        """Tell the peer we are done (best effort) and stop."""
        if self.closed is None:
            self._tx.control.append(CloseFrame(code, reason))
            self.closed = SessionClosed(code, reason, now)

    def _violation(self, now: float, reason: str) -> None:
        """The authenticated peer broke the protocol (e.g. opened beyond its credit): close,
        telling it why, and tell our driver the same (``SessionClosed``), rather than
        ignore it and leave both ends waiting for a shard that cannot come."""
        if self.closed is None:
            event = SessionClosed(CLOSE_PROTOCOL_VIOLATION, f"protocol violation: {reason}", now)
            self._tx.control.append(CloseFrame(event.code, event.error))
            self.closed = event
            self._events.append(event)

    def handshake_probes(self, now: float) -> list[Transmit]:
        """One PROBE datagram per path before any data, outside the packet accounting.

        A driver sends them to learn that the peer hears every path (the peer
        answers each; see ``aio.Endpoint.probe_paths``); only before the session
        has sent a packet (see ``Transmitter.handshake_probes``).
        """
        return self._tx.handshake_probes(now)

    # -- receive -------------------------------------------------------------

    def receive_packet(self, path_id: int, packet_number: int, frames: list[Frame], now: float) -> None:
        """An authenticated, de-duplicated datagram (wire ``packet_number``) arrived on ``path_id``."""
        self.receive_packets(((path_id, packet_number, frames),), now)

    def receive_packets(self, packets: Iterable[tuple[int, int, list[Frame]]], now: float,
                        held_s: Sequence[float] = ()) -> None:
        """Datagrams ``(path_id, packet_number, frames)`` that arrived together (one drain).

        ``held_s``: per path (index), how long its datagrams of this drain waited in the
        driver (the newest one's wait: the receive hold-off, ``core.holdoff``); none is
        counted into a round trip. Missing entries: none waited.

        The same as ``receive_packet`` of each in turn, except that the ACK frames of
        one path that follow each other (nothing but other ACKs and padding between
        them) are applied as one (``core.sender_acks``): a sender's drain holds a path's
        ACKs back to back, and applying each cost a translation, a loss-detector
        pass, a rate sample and a controller update. Any other frame first applies
        the ACKs before it, so every frame still sees what came before it.
        """
        pending: dict[int, list[AckFrame]] = {}
        waits: dict[int, float] = {}  # per acknowledged path: its ACKs' shortest wait here
        for path_id, packet_number, frames in packets:
            held = held_s[path_id] if 0 <= path_id < len(held_s) else 0.0
            self._receive(path_id, packet_number, frames, now, pending, held, waits)
        if pending:
            self._apply_acks(pending, now, waits)

    def _receive(self, path_id: int, packet_number: int, frames: list[Frame], now: float,
                 pending: dict[int, list[AckFrame]], held: float = 0.0,
                 waits: dict[int, float] | None = None) -> None:
        if not 0 <= path_id < len(self.paths):
            self.counters.data_dropped += 1
            return
        path = self.paths[path_id]
        eliciting = False
        accept = True
        for frame in frames:
            if isinstance(frame, AckFrame):
                acks = pending.get(frame.path_id)
                if acks is None:
                    pending[frame.path_id] = [frame]
                else:
                    acks.append(frame)
                if waits is not None:
                    waits[frame.path_id] = min(held, waits.get(frame.path_id, held))
                continue
            if isinstance(frame, PaddingFrame):
                continue
            if pending:
                self._apply_acks(pending, now, waits)
            if isinstance(frame, DataFrame):
                eliciting = True
                accept = self._rx.on_data(frame, now) and accept
            elif isinstance(frame, ProbeAckFrame):
                self._on_control(path, frame, now)  # an answer: nothing to acknowledge
            else:
                eliciting = True
                self._on_control(path, frame, now)
        if not accept:
            return  # not acknowledged: the sender will re-send it once the shard is open
        path.acks.on_packet_received(packet_number, eliciting, now - held, self.config.ack_threshold,
                                     self._ack_delay_s(path))
        if path.acks.ack_now:
            self._tx.needs_ack.add(path_id)  # otherwise the ack timer (ack_at) will add it
        self._tx.touch(path)

    def _apply_acks(self, pending: dict[int, list[AckFrame]], now: float,
                    waits: dict[int, float] | None) -> None:
        """The ACKs held back, one call per acknowledged path, in the order paths first appeared."""
        for acked_path, acks in pending.items():
            self._acks.apply(acked_path, acks, now, waits.get(acked_path, 0.0) if waits else 0.0)
        pending.clear()
        if waits:
            waits.clear()

    def receive_data_run(self, path_id: int, first_pn: int, count: int, shard_id: int, offset: int,
                         length: int, now: float, held_s: float = 0.0) -> None:
        """``count`` data datagrams, packet numbers ``first_pn...``, carried ``[offset, offset+length)``.

        The native data path has already authenticated them and placed their bytes;
        this records them for acknowledgement and reassembly in one call per run,
        with the same outcome as ``receive_packet`` of each datagram's DATA frame.
        ``held_s``: how long the run waited in the driver (``receive_packets``).
        """
        if not 0 <= path_id < len(self.paths) or count < 1:
            self.counters.data_dropped += 1
            return
        verdict = self.incoming.accepts(shard_id, offset, length)
        if verdict is False:
            self.counters.data_dropped += 1  # not acknowledged: the sender re-sends once the shard is open
            return
        if verdict:
            self._rx.place(self.incoming.shards[shard_id], offset, None, length, now)
        path = self.paths[path_id]
        path.acks.on_data_run(first_pn, first_pn + count, now - held_s, self.config.ack_threshold,
                              self._ack_delay_s(path))
        if path.acks.ack_now:
            self._tx.needs_ack.add(path_id)
        self._tx.touch(path)

    def _ack_delay_s(self, path: Path) -> float:
        """How long the path's delayed ACK may wait (``SessionConfig.min_ack_delay_s``): the
        configured delay, or an eighth of the path's smoothed RTT within the bounds.

        A fixed delay suits one kind of path only. 1 ms on WAN paths sent an ACK, and ran
        the sender's Python, every millisecond on every path for nothing the controllers
        needed (about 33,000 ACKs per GiB on the emulated hetero-8path); 10 ms on a
        sub-millisecond path is ten of its round trips, which a window smaller than the ACK
        threshold would wait out.
        """
        config = self.config
        floor = config.min_ack_delay_s
        if floor is None:
            return config.max_ack_delay_s
        rtt = path.rtt
        if not rtt.has_sample:
            return floor
        return min(config.max_ack_delay_s, max(floor, rtt.smoothed_s / HOLDOFF_RTT_RATIO))

    def received_prefix(self, shard_id: int) -> int:
        """How many bytes from the start of an incoming shard are in (0 if unknown).

        They are never written again, so a driver may hash them while the rest
        arrives (``defer_verification``).
        """
        return self._rx.received_prefix(shard_id)

    def shard_verified(self, shard_id: int, ok: bool, now: float) -> None:
        """The driver's verdict on a ``ShardFilled`` shard: ``ok`` when its digest matched."""
        self._rx.shard_verified(shard_id, ok, now)

    def _on_control(self, path: Path, frame: Frame, now: float) -> None:
        if isinstance(frame, ShardOpenFrame):
            refusal = self._rx.on_open(frame, now)
            if refusal is not None:
                self._violation(now, refusal)
        elif isinstance(frame, ShardDigestFrame):
            refusal = self._rx.on_digest(frame.shard_id, frame.digest, now)
            if refusal is not None:
                self._violation(now, refusal)
        elif isinstance(frame, ShardDoneFrame):
            shard = self.outgoing.on_done(frame.shard_id, frame.status)
            if shard is not None:
                self.counters.shards_acknowledged += 1
                self.scheduler.forget_shard(shard.shard_id)
                for p in self.paths:  # a path that never carried its SHARD_OPEN (it was down)
                    p.needs_open.discard(shard.shard_id)
                self._events.append(ShardAcknowledged(shard.shard_id, frame.status == 0, now))
                if not self.outgoing.unfinished:
                    for p in self.paths:
                        p.on_app_idle(now)
        elif isinstance(frame, CreditFrame):
            self.outgoing.credit.update(frame.max_bytes)
            self._tx.dirty.update(range(len(self.paths)))
        elif isinstance(frame, ShardAckFrame):
            shard = self.outgoing.shards.get(frame.shard_id)
            if shard is not None:
                for start, end in frame.ranges:
                    self.outgoing.on_shard_ack(shard, start, end)
        elif isinstance(frame, RepairFrame):
            self._rx.on_repair(frame, now)
        elif isinstance(frame, ProbeFrame):
            self._tx.control_on(path, ProbeAckFrame(frame.token))
        elif isinstance(frame, CloseFrame):
            if self.closed is None:
                self.closed = SessionClosed(frame.code, frame.reason, now)
                self._events.append(self.closed)

    # -- send ----------------------------------------------------------------

    def poll_transmit(self, now: float) -> list[Transmit]:
        """Everything that should leave now or within the pacing horizon."""
        return self._tx.poll(now)

    # -- timers --------------------------------------------------------------

    def _flush_timers(self) -> None:
        """Recompute the deadline of every path whose state changed (``Transmitter.touched``).

        Lazily, when a deadline is read (``next_deadline``, ``on_deadline``), not
        after every packet: a driver hands in a batch of packets and polls once,
        and a path touched by many of them is recomputed once. The deadlines do
        not depend on the order of updates (``DeadlineHeap``), so this is the
        same timer as recomputing after each call.
        """
        touched = self._tx.touched
        if touched:
            deadlines = self._deadlines
            judged_at = self._judged_at
            max_ack_delay_s = self.config.max_ack_delay_s
            for path_id in touched:
                path = self.paths[path_id]
                at = judged_at[path_id] = path.judged_at(max_ack_delay_s)
                wake = path.pacing_wake
                deadlines.set(path_id, wake if wake is not None and wake < at else at)
            touched.clear()

    def next_deadline(self) -> float | None:
        self._flush_timers()
        at = self._deadlines.earliest()
        return None if at == float("inf") else at

    def judgement_due(self, now: float) -> bool:
        """Whether a deadline due by ``now`` acts on what the peer sent, or failed to: an ACK
        owed, a loss, a probe timeout, a probe, a stale RTT, a stalled receive. A driver
        reads what already waits in its sockets before such a deadline (``on_deadline``)
        judges its absence; before a deadline that only wakes the pacing it need not."""
        self._flush_timers()
        deadlines = self._deadlines
        if deadlines.earliest() > now:
            return False
        stall_at = deadlines.at(len(self.paths))  # the stall watch's key (``StallWatch``)
        return stall_at <= now or min(self._judged_at, default=float("inf")) <= now

    def on_deadline(self, now: float) -> None:
        self._flush_timers()
        paths = self.paths
        for key in self._deadlines.pop_due(now):
            if key < len(paths):
                self._fire(paths[key], now)
            else:
                self._stall.fire(now, self.incoming)

    def _fire(self, path: Path, now: float) -> None:
        if path.acks.on_timer(now):
            self._tx.needs_ack.add(path.path_id)
        lost = path.loss.detect_losses(now)
        if lost:
            self._tx.requeue(lost)
        self._failover.on_timer(path, now, self.closed is None)
        self._tx.clear_wake(path, now)
        self._tx.dirty.add(path.path_id)
        self._tx.touch(path)
