"""CUBIC (RFC 9438), the loss-based baseline.

wanxport keeps CUBIC to compare against: it is what TCP on these paths would
do, and on long paths with random loss it collapses towards the Mathis rate
(window ~ 1/sqrt(p) packets per RTT). It is also a reasonable choice where
loss really does mean congestion.

Window in bytes; the cubic function W(t) = C (t - K)^3 + W_max is evaluated
in segments (C = 0.4 segments/s^3) and scaled by the MSS. The controller
reacts to at most one loss batch per round trip: losses of packets sent
before the last reduction are ignored. Because acknowledgements arrive in
batches without per-packet send times, "recovery" (no growth for packets
sent before the reduction) is approximated as one smoothed RTT after it.
Pacing: 2 (slow start) or 1.25 (congestion avoidance) x cwnd / smoothed RTT.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from wanxport.core.cc.base import CcConfig, CcContext, CongestionController
from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator

BETA = 0.7
C = 0.4
#: AIMD increase per RTT (in segments) that makes CUBIC as aggressive as Reno.
ALPHA = 3.0 * (1.0 - BETA) / (1.0 + BETA)
SLOW_START_PACING_GAIN = 2.0
PACING_GAIN = 1.25
MIN_CWND_PACKETS = 2


@dataclass(frozen=True)
class CubicConfig(CcConfig):
    """CUBIC has no options: RFC 9438's constants, the session's initial window and RTT."""

    def build(self, context: CcContext) -> CubicCongestionController:
        return CubicCongestionController(context)


class CubicCongestionController(CongestionController):
    """RFC 9438 CUBIC with slow start, fast convergence and the Reno-friendly region."""

    __slots__ = (
        "_mss",
        "_initial_cwnd",
        "_cwnd",
        "_ssthresh",
        "_w_max",
        "_cwnd_prior",
        "_k",
        "_w_est",
        "_epoch_start",
        "_last_reduction",
        "_srtt_s",
        "_inflight_peak",
        "_peak_stamp",
    )

    name: ClassVar[str] = "cubic"

    def __init__(self, context: CcContext) -> None:
        if context.initial_window_packets < MIN_CWND_PACKETS:
            raise ValueError(f"cubic needs an initial window of at least {MIN_CWND_PACKETS} packets, "
                             f"got initial_window_packets={context.initial_window_packets}")
        self._mss = context.mss_bytes
        self._initial_cwnd = context.initial_window_packets * context.mss_bytes
        self._srtt_s = float(context.initial_rtt_s)
        self._last_reduction: float | None = None
        self._reset()

    def _reset(self) -> None:
        self._cwnd = float(self._initial_cwnd)
        self._ssthresh = math.inf
        self._w_max = 0.0
        self._cwnd_prior = 0.0
        self._k = 0.0
        self._w_est = 0.0
        self._epoch_start: float | None = None
        self._inflight_peak = 0
        self._peak_stamp = 0.0

    # -- events ---------------------------------------------------------------

    def on_packet_sent(self, now: float, size_bytes: int, bytes_in_flight: int) -> None:
        """Remember how full the window got, to tell cwnd-limited from app-limited."""
        inflight = bytes_in_flight + size_bytes
        if inflight > self._inflight_peak:
            self._inflight_peak = inflight

    def on_ack(
        self,
        now: float,
        acked_bytes: int,
        rtt: RttEstimator,
        sample: RateSample | None,
        bytes_in_flight: int,
    ) -> None:
        """Grow the window (slow start, then the cubic or Reno-friendly curve)."""
        srtt = rtt.smoothed_s
        self._srtt_s = srtt
        cwnd_limited = self._cwnd_limited()
        if now - self._peak_stamp > srtt:
            # The peak describes the last round trip only.
            self._inflight_peak = bytes_in_flight
            self._peak_stamp = now
        if not cwnd_limited or acked_bytes <= 0:
            return
        if self._last_reduction is not None and now - self._last_reduction < srtt:
            return  # recovery: these acks are for packets sent before the reduction
        if self._cwnd < self._ssthresh:
            self._cwnd = min(self._cwnd + acked_bytes, max(self._ssthresh, self._cwnd))
            return
        self._congestion_avoidance(now, acked_bytes, srtt)

    def _cwnd_limited(self) -> bool:
        if self._cwnd < self._ssthresh:
            return 2 * self._inflight_peak > self._cwnd
        return self._inflight_peak + 3 * self._mss >= self._cwnd

    def _congestion_avoidance(self, now: float, acked_bytes: int, srtt: float) -> None:
        mss = self._mss
        cwnd = self._cwnd
        if self._epoch_start is None:
            self._epoch_start = now
            if self._w_max < cwnd:
                # Leaving slow start (or having grown past the old maximum):
                # the plateau is here.
                self._w_max = cwnd
                self._k = 0.0
            else:
                self._k = math.cbrt((self._w_max - cwnd) / (C * mss))
            self._w_est = cwnd
        t = now - self._epoch_start
        # Reno-friendly estimate: alpha segments per RTT, 1 once past the prior window.
        alpha = 1.0 if self._w_est >= self._cwnd_prior else ALPHA
        self._w_est += alpha * mss * acked_bytes / cwnd
        w_cubic = self._w_cubic(t)
        if w_cubic < self._w_est:
            self._cwnd = self._w_est
            return
        target = self._w_cubic(t + srtt)
        if target < cwnd:
            target = cwnd
        elif target > 1.5 * cwnd:
            target = 1.5 * cwnd
        self._cwnd = cwnd + (target - cwnd) * acked_bytes / cwnd

    def _w_cubic(self, t: float) -> float:
        d = t - self._k
        return C * d * d * d * self._mss + self._w_max

    def on_loss(
        self,
        now: float,
        lost_bytes: int,
        bytes_in_flight: int,
        lost_sent_time: float,
        rtt: RttEstimator,
    ) -> None:
        """Multiplicative decrease, once per round trip, with fast convergence."""
        if self._last_reduction is not None and lost_sent_time <= self._last_reduction:
            return
        self._last_reduction = now
        self._epoch_start = None
        cwnd = self._cwnd
        self._cwnd_prior = cwnd
        # Fast convergence: a flow whose maximum keeps falling releases bandwidth sooner.
        self._w_max = cwnd * (1.0 + BETA) / 2.0 if cwnd < self._w_max else cwnd
        self._ssthresh = max(cwnd * BETA, float(MIN_CWND_PACKETS * self._mss))
        self._cwnd = self._ssthresh

    def on_path_reset(self, now: float) -> None:
        """Back to slow start from the initial window."""
        self._last_reduction = None
        self._reset()

    # -- outputs --------------------------------------------------------------

    @property
    def cwnd_bytes(self) -> int:
        return int(self._cwnd)

    @property
    def pacing_rate_bps(self) -> float:
        gain = SLOW_START_PACING_GAIN if self._cwnd < self._ssthresh else PACING_GAIN
        return gain * self._cwnd * 8.0 / self._srtt_s

    @property
    def bandwidth_bps(self) -> float:
        return self._cwnd * 8.0 / self._srtt_s

    @property
    def in_startup(self) -> bool:
        return self._cwnd < self._ssthresh

    @property
    def state(self) -> str:
        if self._cwnd < self._ssthresh:
            return "slow_start"
        if self._last_reduction is not None and self._epoch_start is None:
            return "recovery"
        return "congestion_avoidance"

    def metrics(self) -> dict[str, float]:
        """The window model besides the common figures (``ssthresh_bytes`` once slow start ended)."""
        figures = super().metrics()
        figures["w_max_bytes"] = self._w_max
        figures["k_s"] = self._k
        if self._ssthresh < math.inf:
            figures["ssthresh_bytes"] = self._ssthresh
        return figures

    # -- introspection (tests, statistics) ---------------------------------------

    @property
    def w_max_bytes(self) -> float:
        """Window at the last loss (after fast convergence)."""
        return self._w_max

    @property
    def k_s(self) -> float:
        """Time the cubic curve takes to climb back to ``w_max_bytes``."""
        return self._k
