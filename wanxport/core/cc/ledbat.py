"""LEDBAT-style scavenger: background bulk that yields as soon as the paths show queueing.

Why: a gateway's checkpoint copies share the long-haul paths with the
training step's exchange, which waits for its last byte. A background
transfer must use the capacity nobody else wants and give it back within a
round trip or two when someone does. LEDBAT (RFC 6817) does
exactly that: it aims at a small *target queueing delay* and shrinks its
window when the measured queueing delay exceeds it. This is LEDBAT in the
LEDBAT++ form (draft-irtf-iccrg-ledbat-plus-plus), on round-trip times
rather than one-way delays, since the core measures RTT:

- base delay: the path's lifetime minimum RTT; current delay: the minimum
  RTT of the last ``CURRENT_FILTER`` ack batches, each less the peer's
  reported ack delay (which at low rates reaches ``max_ack_delay_s``, more
  than the target, and would read as a queue that never drains); queueing
  delay = current − base;
- below the target the window grows by ``gain x (1 − delay/target)`` packets
  per window acknowledged, gain = 1 / min(16, ceil(2 target / base)), so it
  never grows faster than Reno;
- above the target it shrinks multiplicatively, by ``delay/target − 1`` of
  the window per round trip, at most half (LEDBAT++'s decrease), so a
  competing flow's queue empties it in a few round trips;
- slow start doubles per round trip only while the queueing delay stays
  under 3/4 of the target; a loss halves the window, at most once per round
  trip;
- pacing at 1.25 x window / smoothed RTT (2x in slow start).

The default target is 3 ms, not RFC 6817's 100 ms or LEDBAT++'s 60 ms. The
flows it must yield to are wanxport's own BBR sessions, and wanxport's BBR
treats loss as congestion once a queue of max(5 ms, 25 % of the min RTT)
stands (``core.cc.bbr``). A scavenger that kept 25 ms of queue on a 20 ms
path would make the training step's BBR read random loss as congestion and
cut its own rate, so the background flow would win; a target below 5 ms
keeps its queue under that threshold on every path, and it is still enough
to keep the bottleneck busy (any standing queue means the link never idles).
Longer targets are an option for paths without wanxport foreground traffic.

Not implemented: LEDBAT++'s periodic slowdown (re-measuring the base delay
when another scavenger's queue hides it) and base-delay expiry after a
route change, so a route whose RTT grows for good makes this controller
read a permanent queue and sit at its minimum window — it yields, which is
the safe failure for a background transfer.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

from wanxport.core.cc.base import CcConfig, CcContext, CongestionController
from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator

CURRENT_FILTER = 4
MAX_GAIN_DIVISOR = 16
SLOW_START_EXIT_FRACTION = 0.75
MAX_DECREASE = 0.5
LOSS_BETA = 0.5
PACING_GAIN = 1.25
SLOW_START_PACING_GAIN = 2.0
MIN_CWND_PACKETS = 2


@dataclass(frozen=True)
class LedbatConfig(CcConfig):
    """Options of the scavenger controller (see the module docstring for the target's choice)."""

    #: Queueing delay the flow aims at, milliseconds; above it the flow backs off.
    target_ms: float = 3.0

    def __post_init__(self) -> None:
        if isinstance(self.target_ms, bool) or not isinstance(self.target_ms, int | float) \
                or not 0.0 < self.target_ms <= 1000.0:
            raise ValueError(f"ledbat option target_ms must be a number in (0, 1000] milliseconds, "
                             f"got {self.target_ms!r}")

    def grows_packets(self) -> bool:
        """No: a grown packet's serialisation reads as queueing delay to a controller that backs
        off at a few milliseconds of it (as a scavenger, at 8 datagrams a packet on 50 Mb/s links
        it then left 27 % of two idle links unused, tests/test_sim_fairness.py)."""
        return False

    def build(self, context: CcContext) -> LedbatCongestionController:
        return LedbatCongestionController(self, context)


class LedbatCongestionController(CongestionController):
    """Window-based, delay-targeting scavenger (LEDBAT++ on RTTs)."""

    __slots__ = ("_mss", "_target_s", "_cwnd", "_slow_start", "_recent", "_srtt_s", "_last_reduction",
                 "_newest_sent", "_queue_delay_s")

    name: ClassVar[str] = "ledbat"

    def __init__(self, config: LedbatConfig, context: CcContext) -> None:
        self._mss = context.mss_bytes
        self._target_s = config.target_ms / 1000.0
        self._cwnd = float(max(context.initial_window_packets, MIN_CWND_PACKETS) * context.mss_bytes)
        self._slow_start = True
        self._recent: deque[float] = deque(maxlen=CURRENT_FILTER)
        self._srtt_s = context.initial_rtt_s
        self._last_reduction = -math.inf
        self._newest_sent = -math.inf
        self._queue_delay_s = 0.0

    def on_packet_sent(self, now: float, size_bytes: int, bytes_in_flight: int) -> None:
        if now > self._newest_sent:
            self._newest_sent = now

    def on_ack(self, now: float, acked_bytes: int, rtt: RttEstimator, sample: RateSample | None,
               bytes_in_flight: int) -> None:
        self._srtt_s = rtt.smoothed_s
        if not rtt.has_sample or acked_bytes <= 0:
            return
        # A sample also holds the time its own packet took to pace out (the core paces a
        # many-datagram packet at the path's rate): at a small window that alone exceeds
        # the target and would read as a queue that holds the window down for good.
        self._recent.append(rtt.latest_adjusted_s - self._mss * 8.0 / self.pacing_rate_bps)
        delay = max(0.0, min(self._recent) - rtt.min_s)
        self._queue_delay_s = delay
        target = self._target_s
        if self._slow_start:
            if delay < SLOW_START_EXIT_FRACTION * target:
                self._cwnd += acked_bytes
                return
            self._slow_start = False
        if delay <= target:
            gain = 1.0 / min(MAX_GAIN_DIVISOR, math.ceil(2.0 * target / max(rtt.min_s, 1e-6)))
            self._cwnd += gain * (1.0 - delay / target) * acked_bytes * self._mss / self._cwnd
        else:
            # Per window acknowledged, shrink by (delay/target - 1) of it, at most half.
            shrink = min(delay / target - 1.0, MAX_DECREASE)
            self._cwnd -= shrink * acked_bytes
        self._cwnd = max(self._cwnd, float(MIN_CWND_PACKETS * self._mss))

    def on_loss(self, now: float, lost_bytes: int, bytes_in_flight: int, lost_sent_time: float,
                rtt: RttEstimator) -> None:
        if lost_sent_time <= self._last_reduction:
            return  # the same congestion episode as the last reduction
        self._last_reduction = max(now, self._newest_sent)
        self._slow_start = False
        self._cwnd = max(self._cwnd * LOSS_BETA, float(MIN_CWND_PACKETS * self._mss))

    def on_path_reset(self, now: float) -> None:
        self._cwnd = float(MIN_CWND_PACKETS * self._mss)
        self._slow_start = True
        self._recent.clear()

    @property
    def cwnd_bytes(self) -> int:
        return int(self._cwnd)

    @property
    def pacing_rate_bps(self) -> float:
        gain = SLOW_START_PACING_GAIN if self._slow_start else PACING_GAIN
        return gain * self._cwnd * 8.0 / max(self._srtt_s, 1e-6)

    @property
    def in_startup(self) -> bool:
        return self._slow_start

    @property
    def state(self) -> str:
        return "slow_start" if self._slow_start else "avoidance"

    def metrics(self) -> dict[str, float]:
        """Adds ``queue_delay_s`` (the latest estimate) and ``target_s``."""
        figures = super().metrics()
        figures["queue_delay_s"] = self._queue_delay_s
        figures["target_s"] = self._target_s
        return figures
