"""One path composed of parts, each the single owner of its state.

A path is one long-haul route between the two gateways. Both directions of a
session use it, so it holds the sending side's parts and the receiving side's:

- ``rtt``: the RTT estimator (``core.rtt``);
- ``rate``: the delivery-rate estimator (``core.delivery_rate``);
- ``cc``: the congestion controller (``core.cc``);
- ``loss``: the loss detector, sole owner of the sent-packet map, bytes in
  flight, the loss and probe timers (``core.recovery``);
- ``acks``: the receiver's ACK tracker (``core.ack_tracker``);
- ``health``: the health state machine with its probes and careful-resume
  memory (``core.health``);
- ``warm``: what the path learned across an idle gap, checked against the route
  when it sends again (``core.warm``);
- ``freshness``: when an idle path's RTT estimate is stale enough to probe
  (``core.freshness``);
- ``pending_resume``: state a previous session saved (``Session.resume_path``),
  applied or dropped at the path's first acknowledgement, once its RTT is known.

The pacing rate is the controller's, held under the path's ``max_rate_bps``
(``PathConfig``): an operator's cap is a pacer limit, so nothing the controller
estimates sends faster.

What is left here is what ties them to the scheduler: the pacing schedule,
the bandwidth figure the scheduler plans with, the path's payload counters and
the path-specific frames waiting to go out.
"""

from __future__ import annotations

from wanxport.core.ack_tracker import AckTracker
from wanxport.core.cc import CongestionController
from wanxport.core.counters import PathCounters
from wanxport.core.delivery_rate import DeliveryRateEstimator, RateSample
from wanxport.core.freshness import RttFreshness
from wanxport.core.health import PathHealth, PathState
from wanxport.core.packet_size import PacketSizer
from wanxport.core.recovery import LossDetector
from wanxport.core.rtt import RttEstimator
from wanxport.core.sent_packets import SentPacket
from wanxport.core.warm import IdleGuard, PathMemory
from wanxport.wire.ack_record import PacketRecord
from wanxport.wire.frames import Frame


class Path:
    """The parts of one path, and the pacing state that joins them to the scheduler."""

    __slots__ = ("path_id", "name", "mss", "sizer", "rtt", "rate", "cc", "loss", "acks", "health", "warm",
                 "counters", "freshness", "next_send_at", "last_departure_at", "pacing_wake", "bandwidth_bps",
                 "_bw_round_at", "needs_open", "pending_control", "max_rate_bps", "pending_resume",
                 "burst_rate_bps")

    def __init__(self, path_id: int, name: str, mss: int, cc: CongestionController,
                 initial_rtt_s: float, *, max_rate_bps: float | None = None,
                 sizer: PacketSizer | None = None, ack_record: PacketRecord | None = None) -> None:
        """``ack_record``: where the path's received packet numbers are kept (``AckTracker``)."""
        self.path_id = path_id
        self.name = name
        self.mss = mss  # data bytes of the path's next core packets (core.packet_size)
        self.sizer = sizer
        self.rtt = RttEstimator(initial_rtt_s=initial_rtt_s)
        self.rate = DeliveryRateEstimator()
        self.cc = cc
        self.counters = PathCounters()  # bumped by each part where its events happen (core.counters)
        self.loss = LossDetector(self.rtt, self.rate, cc, self.counters)
        self.acks = AckTracker(ack_record)
        self.health = PathHealth(self.counters)
        self.warm = IdleGuard(self.counters)
        self.freshness = RttFreshness(self.counters)
        self.next_send_at = 0.0  # pacing: earliest departure of the next packet
        self.last_departure_at = 0.0  # departure of the latest packet handed out
        self.pacing_wake: float | None = None  # set while data waits for the pacing horizon
        self.bandwidth_bps = 0.0  # max-filtered delivery rate, for the scheduler
        self._bw_round_at = 0.0
        self.needs_open: set[int] = set()  # shards whose SHARD_OPEN this path has not carried
        self.pending_control: list[Frame] = []  # path-specific frames: probes, probe answers
        self.max_rate_bps = float("inf") if max_rate_bps is None else max_rate_bps
        self.pending_resume: PathMemory | None = None
        self.burst_rate_bps = 0.0  # while the path carries a small message as one burst (else 0)

    @property
    def state(self) -> PathState:
        return self.health.state

    @property
    def usable(self) -> bool:
        """May carry new data: active or probing."""
        return self.health.usable

    @property
    def bytes_in_flight(self) -> int:
        return self.loss.bytes_in_flight

    @property
    def cwnd_space(self) -> int:
        return self.cc.cwnd_bytes - self.loss.bytes_in_flight

    @property
    def pacing_rate_bps(self) -> float:
        """The rate the path is paced at: the controller's (or a small message's burst rate,
        ``core.scheduling.burst``, when higher), never above the operator's cap."""
        rate = self.cc.pacing_rate_bps
        if self.burst_rate_bps > rate:
            rate = self.burst_rate_bps
        return rate if rate <= self.max_rate_bps else self.max_rate_bps

    @property
    def one_way_s(self) -> float:
        """How long a packet the path sends now takes to arrive: half its recent minimum round
        trip (the route as it is) plus the time the path's own data already queued beyond its
        pipe takes to drain (bytes in flight over its rate, less a round trip).

        Not half the smoothed RTT: that forgets a high sample only over several more (each
        takes an eighth off), and a path the scheduler stops using takes no more samples. One
        stall-inflated start (0.8 s on a 20 ms route) kept every later small message on a
        55 ms route even with the path probed once its estimate went stale
        (``core.freshness``); the windowed minimum takes the probe's sample at once.
        The controllers still read the smoothed RTT; only the scheduler's order reads this.
        """
        rtt = self.rtt
        base = rtt.min_recent_s
        rate_bps = self.bandwidth_bps if self.bandwidth_bps > 0.0 else self.pacing_rate_bps
        if not rate_bps > 0.0:
            return base / 2
        queued_s = self.loss.bytes_in_flight * 8.0 / rate_bps - base
        return base / 2 + (queued_s if queued_s > 0.0 else 0.0)

    def judged_at(self, max_ack_delay_s: float) -> float:
        """When the path's earliest timer that acts on what was heard (or not) from the peer
        is due: an ACK owed, a loss, a probe timeout, a probe, a stale RTT; inf if none.
        Only the pacing wake-up is not one: it hands out data and judges nothing."""
        at = float("inf")
        ack_at = self.acks.ack_at
        if ack_at is not None:
            at = ack_at
        loss = self.loss.loss_deadline()
        if loss is not None and loss < at:
            at = loss
        if self.usable:
            pto = self.loss.pto_deadline(max_ack_delay_s)
            if pto is not None and pto < at:
                at = pto
            stale_at = self.freshness.due_at(self.rtt)
            if stale_at < at:
                at = stale_at
        next_probe_at = self.health.next_probe_at
        if next_probe_at is not None and next_probe_at < at:
            at = next_probe_at
        return at

    def send_rate_Bps(self) -> float:
        """Bytes per second the scheduler expects this path to move."""
        if self.bandwidth_bps > 0 and not self.cc.in_startup:
            return min(self.bandwidth_bps, self.max_rate_bps) / 8
        return self.pacing_rate_bps / 8

    def on_ack(self, ranges: tuple[tuple[int, int], ...], ack_delay_s: float, now: float,
               arrived_at: float | None = None) -> tuple[list[SentPacket], list[SentPacket]]:
        """Apply an ACK frame for this path's packets; return (newly acknowledged, newly lost).
        ``arrived_at``: when it arrived (``LossDetector.arrival``; default ``now``)."""
        acked, lost, sample = self.loss.on_ack(ranges, ack_delay_s, now, arrived_at)
        if acked and self.pending_resume is not None:
            self._resume_saved(self.pending_resume, now)
        if acked:
            if not self.warm.confirm(acked[-1].sent_at, self.rtt.latest_s):
                self._rerouted(now)
                sample = None  # measured across the old route's model
            elif self.loss.bytes_in_flight == 0:
                self.warm.went_idle(self.cc, self.rtt, now)
        # An app-limited sample only says the path can do at least that much.
        if sample is not None and (not sample.is_app_limited
                                   or sample.delivery_rate_bps > self.bandwidth_bps):
            self._note_bandwidth(sample, now)
        if self.sizer is not None and acked:
            self._resize_packets()
        return acked, lost

    def _resize_packets(self) -> None:
        """Grow or shrink the core packets for the bandwidth and the share of lost packets
        (spurious losses are not losses) measured so far (``core.packet_size``)."""
        assert self.sizer is not None
        counted = self.counters
        lossy = ((counted.packets_lost - counted.spurious_losses) / counted.packets_sent
                 if counted.packets_sent else 0.0)
        self.mss = self.sizer.update(min(self.bandwidth_bps, self.max_rate_bps), self.cc.in_startup, lossy)

    def restart_from_idle(self, now: float) -> None:
        """The path sends again with nothing in flight: keep what it learned unless too old."""
        if not self.warm.restarting(now):
            self.cc.on_path_reset(now)
            self.bandwidth_bps = 0.0

    def on_app_idle(self, now: float) -> None:
        """The session has nothing left to send (a step ended): the warm-step policy of ``core.warm``."""
        self.cc.on_app_idle(now)
        self.loss.on_app_idle()

    def _resume_saved(self, memory: PathMemory, now: float) -> None:
        """The first RTT sample of a new session decides whether a previous one's state holds."""
        self.pending_resume = None
        if memory.same_route(self.rtt.latest_adjusted_s):
            self.cc.on_path_resume(now, memory.rate_bps)
            self.counters.resumes += 1
        else:
            self.counters.resumes_dropped += 1

    def _rerouted(self, now: float) -> None:
        """The first round trip after an idle gap shows another route: forget the old one."""
        self.rtt.restart(now)
        self.cc.on_route_change(now)
        self.bandwidth_bps = 0.0

    def _note_bandwidth(self, sample: RateSample, now: float) -> None:
        """Max filter over roughly the last few round trips."""
        rate_bps = sample.delivery_rate_bps
        if rate_bps >= self.bandwidth_bps or now - self._bw_round_at > 4 * self.rtt.smoothed_s:
            self.bandwidth_bps = rate_bps
            self._bw_round_at = now
