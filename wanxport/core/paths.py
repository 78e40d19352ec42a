"""Per-path state: estimators, congestion control, pacing, sent packets, path health.

A path is one long-haul route between the two gateways. Both directions of a
session use it: the sending side keeps the sent packets, RTT and congestion
state here; the receiving side keeps the packet numbers it must acknowledge.
Packet numbers are per path and never reused.
"""

from __future__ import annotations

from collections import OrderedDict
from enum import StrEnum

from wanxport.core.cc import CongestionController
from wanxport.core.delivery_rate import DeliveryRateEstimator
from wanxport.core.ranges import RangeSet
from wanxport.core.rtt import RttEstimator
from wanxport.core.sent_packets import SentPacket
from wanxport.wire.frames import Frame

# Ranges per ACK frame, the most recent first. Every ACK repeats them, so with
# a loss in one packet of 100 a range is still reported ~3000 packets later:
# enough for ACK loss and late (reordered) packets, while the ACK stays about
# 500 bytes instead of 1 KB that, with data flowing both ways, competes with
# the data (16 ranges were too few with 10 % ACK loss and reordering jitter).
# The receiver remembers many more: reordering can open dozens of gaps at once,
# and forgetting the ranges below them would leave packets whose ACKs were lost
# never acknowledged (the sender would re-send them).
MAX_ACK_RANGES = 32
RECEIVED_RANGES_KEPT = 256
#: Careful resume: a readmitted path's RTT sample must lie within these factors of
#: the min RTT (below) and smoothed RTT (above) it had, or its route has changed.
RESUME_RTT_LOW = 0.5
RESUME_RTT_HIGH = 1.5


class PathState(StrEnum):
    PROBING = "probing"  # readmitted, ramping up again
    ACTIVE = "active"
    DEGRADED = "degraded"  # probe timeout fired: no new data until it answers
    FAILED = "failed"  # several probe timeouts: only probes until it answers


class PathStats:
    """Counters for reports and metrics."""

    __slots__ = (
        "payload_bytes",
        "retransmitted_bytes",
        "hedged_bytes",
        "packets_sent",
        "packets_lost",
        "spurious_losses",
        "bytes_sent",
        "failures",
    )

    def __init__(self) -> None:
        self.payload_bytes = 0
        self.retransmitted_bytes = 0
        self.hedged_bytes = 0
        self.packets_sent = 0
        self.packets_lost = 0
        self.spurious_losses = 0
        self.bytes_sent = 0
        self.failures = 0


class Path:
    """Sender and receiver state of one path."""

    def __init__(self, path_id: int, name: str, mss: int, cc: CongestionController,
                 initial_rtt_s: float) -> None:
        self.path_id = path_id
        self.name = name
        self.mss = mss
        self.state = PathState.ACTIVE
        self.usable = True  # may carry new data: active or probing
        self.rtt = RttEstimator(initial_rtt_s=initial_rtt_s)
        self.rate = DeliveryRateEstimator()
        self.cc = cc
        self.stats = PathStats()
        # sender side
        self.next_pn = 0
        # Packet-number order; an OrderedDict finds its oldest entry in O(1) even after
        # many removals at the front, which a plain dict does not.
        self.sent: OrderedDict[int, SentPacket] = OrderedDict()
        self.bytes_in_flight = 0
        self.largest_acked = -1
        self.next_send_at = 0.0  # pacing: earliest departure of the next packet
        self.last_departure_at = 0.0  # departure of the latest packet handed out
        self.last_ack_at = 0.0
        self.pto_count = 0
        self.reorder_threshold = 3
        self.time_threshold = 9 / 8
        # pn -> declared-lost time (spurious detection); ordered, so forgetting the oldest is O(1)
        self.recently_lost: OrderedDict[int, float] = OrderedDict()
        self.recently_lost_pns: list[int] = []  # the same packet numbers, sorted (for ranges)
        self.bandwidth_bps = 0.0  # max-filtered delivery rate, for the scheduler
        self._bw_round_at = 0.0
        self.probe_token = 0
        self.next_probe_at: float | None = None
        self.needs_open: set[int] = set()  # shards whose SHARD_OPEN this path has not carried
        self.pending_control: list[Frame] = []  # path-specific frames: probes, probe answers
        self.probe_misses = 0
        self.pacing_wake: float | None = None  # set while data waits for the pacing horizon
        # What the path sustained when last suspected of failure (careful resume); 0: nothing validated
        self.saved_rate_bps = 0.0
        self.saved_min_rtt_s = 0.0
        self.saved_srtt_s = 0.0
        # receiver side
        self.recv_pns = RangeSet()
        self.recv_largest = -1
        self.recv_largest_at = 0.0
        self.unacked_eliciting = 0
        self.ack_at: float | None = None
        self.ack_now = False

    # -- sender -------------------------------------------------------------

    def set_state(self, state: PathState) -> None:
        self.state = state
        self.usable = state in (PathState.ACTIVE, PathState.PROBING)

    @property
    def cwnd_space(self) -> int:
        return self.cc.cwnd_bytes - self.bytes_in_flight

    @property
    def one_way_s(self) -> float:
        return self.rtt.smoothed_s / 2

    def send_rate_Bps(self) -> float:
        """Bytes per second the scheduler expects this path to move."""
        if self.bandwidth_bps > 0 and not self.cc.in_startup:
            return self.bandwidth_bps / 8
        return self.cc.pacing_rate_bps / 8

    def note_bandwidth(self, rate_bps: float, now: float) -> None:
        """Max filter over roughly the last few round trips."""
        if rate_bps >= self.bandwidth_bps or now - self._bw_round_at > 4 * self.rtt.smoothed_s:
            self.bandwidth_bps = rate_bps
            self._bw_round_at = now

    def save_for_resume(self) -> None:
        """Remember the rate and RTT of a path about to be suspected, if they were validated.

        An estimate from Startup is a search in progress, not a measured
        capacity: it leaves an older saved rate (or none) in place.
        """
        if self.state is PathState.ACTIVE and not self.cc.in_startup and self.rtt.has_sample:
            self.saved_rate_bps = self.cc.bandwidth_bps
            self.saved_min_rtt_s = self.rtt.min_recent_s
            self.saved_srtt_s = self.rtt.smoothed_s

    def resume_rate_bps(self) -> float:
        """The saved rate if the path's latest RTT sample says the route is unchanged, else 0.

        Careful resume (IETF draft-ietf-tsvwg-careful-resume) reuses saved state only on a confirmed path:
        an RTT well below the old minimum or well above the old smoothed RTT
        means another route, whose capacity nothing here has measured.
        """
        if not self.saved_rate_bps > 0.0:
            return 0.0
        sample = self.rtt.latest_s
        if RESUME_RTT_LOW * self.saved_min_rtt_s <= sample <= RESUME_RTT_HIGH * self.saved_srtt_s:
            return self.saved_rate_bps
        return 0.0

    def pto_s(self, max_ack_delay_s: float) -> float:
        return self.rtt.pto_s(max_ack_delay_s) * float(1 << min(self.pto_count, 6))

    def pto_deadline(self, max_ack_delay_s: float) -> float | None:
        if self.bytes_in_flight <= 0:
            return None
        return max(self.last_ack_at, self._oldest_sent_at()) + self.pto_s(max_ack_delay_s)

    def _oldest_sent_at(self) -> float:
        for packet in self.sent.values():
            return packet.sent_at
        return 0.0

    def take_pn(self) -> int:
        pn = self.next_pn
        self.next_pn += 1
        return pn

    # -- receiver -----------------------------------------------------------

    def on_packet_received(self, pn: int, ack_eliciting: bool, now: float, ack_threshold: int,
                           max_ack_delay_s: float) -> None:
        """Record ``pn`` for acknowledgement and decide when to send the ACK."""
        # A gap or reordering: tell the sender promptly, but only about packets that
        # ask for acknowledgement; answering an ACK-only packet would start an ACK
        # ping-pong whenever acknowledgements themselves are lost or reordered.
        if ack_eliciting and pn != self.recv_largest + 1:
            self.ack_now = True
        self.recv_pns.add(pn, pn + 1)
        if len(self.recv_pns) > RECEIVED_RANGES_KEPT:
            highest = self.recv_pns.last(RECEIVED_RANGES_KEPT // 2)
            self.recv_pns.discard_below(highest[-1][0])
        if pn > self.recv_largest:
            self.recv_largest = pn
            self.recv_largest_at = now
        if ack_eliciting:
            self.unacked_eliciting += 1
            if self.unacked_eliciting >= ack_threshold:
                self.ack_now = True
            elif self.ack_at is None:
                self.ack_at = now + max_ack_delay_s

    def ack_ranges(self) -> tuple[tuple[int, int], ...]:
        """Inclusive packet-number ranges, highest first, for an ACK frame."""
        return tuple((lo, hi - 1) for lo, hi in self.recv_pns.last(MAX_ACK_RANGES))

    def ack_sent(self) -> None:
        self.unacked_eliciting = 0
        self.ack_at = None
        self.ack_now = False
