"""Per-path acknowledgement processing and loss detection (RFC 9002 style).

The :class:`LossDetector` of a path is the only owner of its sent-packet map:
packets enter it when sent and leave it when acknowledged, declared lost or
(probes) forgotten, and every question about what is outstanding goes through
it. That is what lets bytes in flight, the PTO and the loss timer stay
consistent without anyone else knowing how packets are stored.

Losses are detected with a packet threshold and a time threshold, both of
which widen when a loss turns out to be spurious (the packet was only
reordered), so paths with jitter-induced reordering do not retransmit in
vain. A probe timeout's "everything in flight is lost" that proves spurious
is not reordering but a stall (of either end, or the path's queue), so it
is counted and widens neither. What was lost is handed back to the session,
which re-sends it on whichever path delivers first. The detector feeds the path's RTT estimator,
delivery-rate estimator and congestion controller (it holds references to
them; it does not own them), because those react to exactly the
acknowledgements and losses it computes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Iterator

from wanxport.core.cc import CongestionController
from wanxport.core.counters import PathCounters
from wanxport.core.delivery_rate import DeliveryRateEstimator, RateSample
from wanxport.core.ranges import RangeSet
from wanxport.core.rtt import RttEstimator
from wanxport.core.sent_packets import Chunk, SentPacket

GRANULARITY_S = 0.001
MAX_REORDER_THRESHOLD = 1024
SPURIOUS_MEMORY_S = 0.25  # remember losses at least this long (and 3 smoothed RTTs)
# How long an unanswered probe is remembered: its answer readmits the path only while
# it is. Longer than any round trip a usable path has, even after a reroute.
PROBE_MEMORY_S = 2.0
MAX_PTO_BACKOFF_EXPONENT = 6
INITIAL_REORDER_THRESHOLD = 3
INITIAL_TIME_THRESHOLD = 9 / 8


class LossDetector:
    """The sent packets of one path: acknowledgement, loss, PTO and in-flight accounting."""

    __slots__ = ("rtt", "rate", "cc", "next_pn", "_sent", "bytes_in_flight", "largest_acked",
                 "last_ack_at", "pto_count", "reorder_threshold", "time_threshold",
                 "_recently_lost", "_recently_lost_pns", "_timed_out", "counters", "detected_lost",
                 "detected_lost_bytes",
                 "_quiet", "_resumed_at", "_arrived_at")

    def __init__(self, rtt: RttEstimator, rate: DeliveryRateEstimator, cc: CongestionController,
                 counters: PathCounters | None = None) -> None:
        """``counters``: the path's, whose packet counts this keeps (its own when None)."""
        self.rtt = rtt
        self.rate = rate
        self.cc = cc
        self.next_pn = 0  # packet numbers are per path and never reused
        # Packet-number order; an OrderedDict finds its oldest entry in O(1) even after
        # many removals at the front, which a plain dict does not.
        self._sent: OrderedDict[int, SentPacket] = OrderedDict()
        self.bytes_in_flight = 0
        self.largest_acked = -1
        self.last_ack_at = 0.0
        self._arrived_at = 0.0  # when the latest ACK arrived (``arrival``)
        self.pto_count = 0
        self.reorder_threshold = INITIAL_REORDER_THRESHOLD
        self.time_threshold = INITIAL_TIME_THRESHOLD
        # pn -> declared-lost time (spurious detection); ordered, so forgetting the oldest is O(1)
        self._recently_lost: OrderedDict[int, float] = OrderedDict()
        self._recently_lost_pns: list[int] = []  # the same packet numbers, sorted (for ranges)
        # Those of them declared lost by a probe timeout (declare_all_lost), not by the thresholds.
        # hetero-8path on a saturated 2-core host: each timeout on its 20 ms path, all spurious,
        # took the time threshold from 9/8 to 4 RTTs for the rest of the run.
        self._timed_out: set[int] = set()
        self.counters = PathCounters() if counters is None else counters  # packets sent, lost
        # Losses found by the thresholds (not a probe timeout's "everything in flight"), and
        # their bytes not confirmed by a partial acknowledgement: the datagrams really lost,
        # which the erasure-coded tail prices its repair by (core.fec).
        self.detected_lost = 0
        self.detected_lost_bytes = 0
        self._quiet = False  # the session ran out of data; the next packet sent resumes the path
        self._resumed_at = 0.0  # when it did: the probe timeout counts from no earlier

    # -- sending -----------------------------------------------------------------

    def take_pn(self) -> int:
        pn = self.next_pn
        self.next_pn += 1
        return pn

    def on_packet_sent(self, packet: SentPacket) -> None:
        self._sent[packet.pn] = packet
        if packet.in_flight:
            if self._quiet:
                self._quiet, self._resumed_at = False, packet.sent_at
            self.cc.on_packet_sent(packet.sent_at, packet.size, self.bytes_in_flight)
            self.bytes_in_flight += packet.size
        counted = self.counters
        counted.packets_sent += 1
        counted.bytes_sent += packet.size

    # -- what is outstanding -------------------------------------------------------

    def outstanding_chunks(self) -> Iterator[tuple[float, Chunk]]:
        """(sent_at, chunk) of every data chunk outstanding, in packet-number order."""
        for packet in self._sent.values():
            if packet.chunks:
                for chunk in packet.chunks:
                    yield packet.sent_at, chunk

    def oldest_of_interest(self) -> int | None:
        """The lowest packet number an ACK can still tell us about, or None.

        Below it every packet is acknowledged or declared lost and forgotten;
        a remembered loss counts, since a late delivery proves it spurious.
        """
        oldest = next(iter(self._sent), None)
        pns = self._recently_lost_pns
        if pns and (oldest is None or pns[0] < oldest):
            oldest = pns[0]
        return oldest

    def forget_stale(self, now: float) -> None:
        """Forget what only an arriving ACK used to prune: old remembered losses, and
        probes at the front older than ``PROBE_MEMORY_S``.

        Both hold ``oldest_of_interest`` down, and with it the path's wire numbering
        (8 bytes a core packet). A receiver's path that lost a tracked packet (a
        verdict, a probe of an outage) and then carries only acknowledgements gets no
        ACK back, so neither was ever forgotten: the daemon's receiver grew ~1 MiB an
        hour of the soak (heaptrack: ``array.append`` of ``WireNumbering``). Cheap
        enough per packet: each loop stops at the first entry still of interest.
        """
        if self._recently_lost:
            self._forget_old_losses(now)
        horizon = now - PROBE_MEMORY_S
        sent = self._sent
        while sent:
            packet = next(iter(sent.values()))
            if packet.in_flight or packet.sent_at >= horizon:
                break
            del sent[packet.pn]

    def forget_probes_before(self, horizon: float) -> None:
        """Drop the probes (not in flight, nothing to re-send) sent before ``horizon``.

        Their answers would no longer readmit the path; dropping them keeps a
        long outage from accumulating one entry per probe interval.
        """
        for pn in [pn for pn, p in self._sent.items() if not p.in_flight and p.sent_at < horizon]:
            del self._sent[pn]

    def confirm_part(self, pn: int, start: int, end: int, now: float) -> Chunk | None:
        """``[start, end)`` of the one chunk outstanding packet ``pn`` carries reached the peer.

        Credits the newly confirmed share of the packet to the delivery rate
        and returns that part as a chunk, or None when there is nothing new
        (packet not outstanding, not carrying exactly one chunk, span empty or
        already confirmed).
        """
        packet = self._sent.get(pn)
        if packet is None or packet.chunks is None or len(packet.chunks) != 1:
            return None
        shard_id, offset, length = packet.chunks[0]
        start, end = max(start, 0), min(end, length)
        if start >= end:
            return None
        if packet.confirmed is None:
            packet.confirmed = RangeSet()
        if not packet.confirmed.add(start, end):
            return None
        credit = packet.size * packet.confirmed.total // length - packet.credited  # no rounding drift
        packet.credited += credit
        if packet.in_flight and packet.rate_state is not None:
            self.rate.on_bytes_delivered(credit, now)
        return shard_id, offset + start, end - start

    # -- acknowledgements ------------------------------------------------------------

    def arrival(self, now: float, held_s: float) -> float:
        """When an ACK handled at ``now`` arrived: ``held_s`` earlier (it waited out the receive
        hold-off, ``core.holdoff``), never before the previous one. Its round-trip and delivery
        samples are taken at this time: the wait is no part of the path's round trip, and ACKs
        held and then handled together must not look like a burst of delivery."""
        at = now - held_s
        if at < self._arrived_at:
            at = self._arrived_at
        self._arrived_at = at
        return at

    def on_ack(self, ranges: tuple[tuple[int, int], ...], ack_delay_s: float, now: float,
               arrived_at: float | None = None
               ) -> tuple[list[SentPacket], list[SentPacket], RateSample | None]:
        """Apply an ACK frame's ranges; return (newly acknowledged, newly lost, rate sample).
        ``arrived_at``: when it arrived (``arrival``; default ``now``)."""
        at = now if arrived_at is None else arrived_at
        sent = self._sent
        acked: list[SentPacket] = []
        lowest = next(iter(sent), self.next_pn)
        top = self.next_pn - 1
        for lo, hi in ranges:
            hi = min(hi, top)
            if hi < lowest:
                break  # ranges are highest first: nothing below can be outstanding
            for pn in range(hi, max(lo, lowest) - 1, -1):  # descending, as the ranges are
                packet = sent.pop(pn, None)
                if packet is not None:
                    acked.append(packet)
        if self._recently_lost:
            self._forget_old_losses(now)  # without new losses nothing else would prune them
            if self._recently_lost:
                self._check_spurious(ranges)
        if not acked:
            return acked, [], None
        acked.reverse()  # ascending packet numbers
        largest = acked[-1]
        self.last_ack_at = now
        self.pto_count = 0
        if largest.pn > self.largest_acked:
            self.largest_acked = largest.pn
            if largest.ack_eliciting:
                self.rtt.update(at - largest.sent_at, ack_delay_s, now)
        acked_bytes = 0
        rate = self.rate
        for packet in acked:
            if packet.in_flight:
                self.bytes_in_flight -= packet.size
                acked_bytes += packet.size
                if packet.rate_state is not None:
                    rate.on_packet_acked(packet.rate_state, packet.size - packet.credited, at)
        sample = rate.generate_sample(at, self.rtt.min_s)
        self.cc.on_ack(at, acked_bytes, self.rtt, sample, self.bytes_in_flight)
        lost = self.detect_losses(now)
        return acked, lost, sample

    def _check_spurious(self, ranges: tuple[tuple[int, int], ...]) -> None:
        """A packet we declared lost was delivered after all (reordering): widen both thresholds.

        The remembered losses are also kept sorted by packet number, so each ACK
        range finds the ones it covers by bisection instead of every remembered
        loss being tested against every ACK.
        """
        pns = self._recently_lost_pns
        delivered: list[int] = []
        for lo, hi in ranges:
            i = bisect_left(pns, lo)
            while i < len(pns) and pns[i] <= hi:
                delivered.append(pns[i])
                i += 1
        for pn in delivered:
            timed_out = pn in self._timed_out
            self._forget_loss(pn)
            self.counters.spurious_losses += 1
            if timed_out:
                continue  # a stall, not reordering: the thresholds stay
            gap = self.largest_acked - pn + 1
            self.reorder_threshold = min(max(self.reorder_threshold, gap), MAX_REORDER_THRESHOLD)
            self.time_threshold = min(self.time_threshold * 1.25, 4.0)

    def _forget_loss(self, pn: int) -> None:
        del self._recently_lost[pn]
        self._timed_out.discard(pn)
        pns = self._recently_lost_pns
        del pns[bisect_left(pns, pn)]

    # -- loss --------------------------------------------------------------------------

    def loss_delay_s(self) -> float:
        return max(self.time_threshold * max(self.rtt.smoothed_s, self.rtt.latest_s), GRANULARITY_S)

    def detect_losses(self, now: float) -> list[SentPacket]:
        """Declare lost every packet below the largest acknowledged that is too old or too far behind."""
        largest = self.largest_acked
        if largest < 0:
            return []
        delay = self.loss_delay_s()
        cutoff_pn = largest - self.reorder_threshold
        lost: list[SentPacket] = []
        for pn, packet in self._sent.items():
            if pn >= largest:
                break
            # Same expression as loss_deadline(), so a timer firing at that deadline always
            # finds the packet lost (now - delay could round the other way).
            if pn <= cutoff_pn or packet.sent_at + delay <= now:
                lost.append(packet)
            else:
                break  # later packets are newer and closer to the largest acknowledged
        if lost:
            self.detected_lost += len(lost)
            self.detected_lost_bytes += sum(packet.size - packet.credited for packet in lost)
            self._remove_lost(lost, now)
        return lost

    def loss_deadline(self) -> float | None:
        """When the oldest outstanding packet below the largest acknowledged would time out."""
        for pn, packet in self._sent.items():
            if pn >= self.largest_acked:
                return None
            return packet.sent_at + self.loss_delay_s()
        return None

    def declare_all_lost(self, now: float) -> list[SentPacket]:
        """The path is suspected dead: everything in flight goes back to the session.

        Probes (not in flight, nothing to re-send) stay: the session keeps the last
        few, and an answer to any of them readmits the path.
        """
        lost = [packet for packet in self._sent.values() if packet.in_flight]
        if lost:
            self._remove_lost(lost, now, timed_out=True)
        return lost

    def _remove_lost(self, lost: list[SentPacket], now: float, timed_out: bool = False) -> None:
        lost_bytes = 0
        newest_sent = 0.0
        for packet in lost:
            del self._sent[packet.pn]
            if packet.in_flight:
                self.bytes_in_flight -= packet.size
                lost_bytes += packet.size
            newest_sent = max(newest_sent, packet.sent_at)
            if packet.pn not in self._recently_lost:
                insort(self._recently_lost_pns, packet.pn)
            self._recently_lost[packet.pn] = now
            if timed_out:
                self._timed_out.add(packet.pn)
        self.counters.packets_lost += len(lost)
        self._forget_old_losses(now)
        if lost_bytes:
            self.cc.on_loss(now, lost_bytes, self.bytes_in_flight, newest_sent, self.rtt)

    def _forget_old_losses(self, now: float) -> None:
        horizon = now - max(SPURIOUS_MEMORY_S, 3 * self.rtt.smoothed_s)
        stale: list[int] = []
        for pn, at in self._recently_lost.items():  # insertion order is time order
            if at >= horizon and len(self._recently_lost) - len(stale) <= 4096:
                break
            stale.append(pn)
        for pn in stale:
            self._forget_loss(pn)

    # -- probe timeout -------------------------------------------------------------------

    def on_pto(self) -> None:
        """A probe timeout (or an unanswered probe interval) passed: back the next one off."""
        self.pto_count += 1

    def pto_s(self, max_ack_delay_s: float) -> float:
        return self.rtt.pto_s(max_ack_delay_s) * float(1 << min(self.pto_count, MAX_PTO_BACKOFF_EXPONENT))

    def on_app_idle(self) -> None:
        """The session has nothing left to send: every shard acknowledged (a step ended)."""
        self._quiet = True

    def pto_deadline(self, max_ack_delay_s: float) -> float | None:
        """A probe timeout after the last acknowledgement and the oldest packet in flight.

        And, once the path resumes after the session ran out of data (a step
        ended, :meth:`on_app_idle`), after that: a packet lost at the tail of
        one step (nothing sent behind it to reveal the loss) was otherwise
        timed from before the gap, and the timeout fired before the next
        step's first packets could be acknowledged -- suspecting a healthy
        path and re-sending all it carried. Counted from the resumption, those
        first acknowledgements declare it lost by the time threshold instead.
        During a long think time the timeout still runs: a path that died at
        a step's end is found before the next step needs it.
        """
        if self.bytes_in_flight <= 0:
            return None
        start = max(self.last_ack_at, self._oldest_sent_at(), self._resumed_at)
        return start + self.pto_s(max_ack_delay_s)

    def _oldest_sent_at(self) -> float:
        for packet in self._sent.values():
            return packet.sent_at
        return 0.0

    # -- inspection (tests, invariant checks) ----------------------------------------------

    def outstanding(self) -> list[SentPacket]:
        """A copy of the outstanding packets in packet-number order (for tests and checks)."""
        return list(self._sent.values())

    def is_outstanding(self, pn: int) -> bool:
        return pn in self._sent

    def remembered_losses(self) -> list[int]:
        """Packet numbers declared lost and still remembered for spurious-loss detection, ascending."""
        return list(self._recently_lost_pns)
