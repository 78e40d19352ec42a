"""A BBR-family congestion controller tuned for long WAN paths with random loss.

The model is BBRv1's: the path is a bottleneck bandwidth (a windowed max of
delivery-rate samples over ~10 round trips) and a minimum RTT (a windowed min
over 10 s). The sender paces at gain x bandwidth and keeps at most
2 x BDP (+ 3 packets) in flight. States:

* Startup: pacing and window gain 2/ln 2, doubling the rate each round,
  until the bandwidth stops growing by 25 % for 3 rounds;
* Drain: the inverse gain until what is in flight fits one BDP;
* ProbeBW: the 8-phase gain cycle 1.25, 0.75, 1 x 6, one min RTT each;
* ProbeRTT: only when no RTT sample has matched the min RTT for 10 s. It
  drains to 4 packets for max(200 ms, 1 RTT), then restores the window, so
  on long paths it costs little; it is off unless ``probe_rtt`` is set.

wanxport's departures from BBRv1:

* Random loss does not reduce the rate. A loss batch counts as congestion
  only with queueing evidence: the smallest RTT seen over the current and the
  previous round is more than max(5 ms, 25 % of min RTT) above the min RTT,
  i.e. a queue has *stood* for a round (a jitter spike or the ProbeBW 1.25
  phase's brief queue does not qualify).
* Congestion then caps the bandwidth estimate, BBRv2 ``inflight_hi``-style
  but gently: cap = 0.85 x the lower of the estimate and the recent delivery
  rate (while a queue stands, the path delivers exactly its capacity), at
  most once per round trip (losses of packets sent before the last reduction
  are ignored), and ProbeBW jumps to its 0.75 phase to drain the queue. Each
  round without congestion or a standing queue raises the cap 5 %; once it
  exceeds the max-filter estimate it is dropped. The window follows, since it
  derives from the capped bandwidth. In Startup, congestion simply ends the
  search (as in BBRv2) rather than reducing anything.
* The bandwidth filter ages only when a usable sample arrives, so an
  app-limited stretch (a path idling between shards or training steps) keeps
  its estimate; nothing else expires over idle either. A Startup interrupted by
  idle (``on_app_idle``) leaves at the measured rate if its last round queued,
  else resumes at most 1.25 x it and its BDP (docs/notes/steps.md).
* ProbeBW starts at a phase drawn from an RNG seeded with ``seed`` plus the
  path's index, so runs are reproducible and paths start out of phase.
* ``shared = true`` (links shared with other traffic): the session's paths
  probe as one flow and the min RTT is held (``core.cc.coupling``).
* Careful resume (``on_path_resume``, policy in ``core.warm``): a readmitted
  path's first round is paced at half its saved rate with the window for the
  full rate, then Startup runs never paced above the saved rate; its usual
  exits apply, and a standing queue with loss drains to what was measured.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from typing import Any, ClassVar

from wanxport.core.cc.base import CcContext, CongestionController
from wanxport.core.cc.bbr_config import BbrConfig
from wanxport.core.cc.bbr_figures import named_figures
from wanxport.core.cc.coupling import coupled_gain
from wanxport.core.delivery_rate import RateSample
from wanxport.core.rtt import RttEstimator
from wanxport.core.windowed_filter import RoundMaxFilter

STARTUP_GAIN = 2.0 / math.log(2.0)
DRAIN_GAIN = 1.0 / STARTUP_GAIN
CWND_GAIN = 2.0
PACING_GAIN_CYCLE = (1.25, 0.75, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)
DRAIN_PHASE = 1
BW_FILTER_ROUNDS = 10
FULL_BW_GROWTH = 1.25
FULL_BW_ROUNDS = 3
MIN_RTT_WINDOW_S = 10.0
PROBE_RTT_DURATION_S = 0.2
PROBE_RTT_CWND_PACKETS = 4
MIN_CWND_PACKETS = 4
#: Packets added to the window target so ack batching and pacing quanta do not starve the pipe.
EXTRA_CWND_PACKETS = 3
QUEUE_DELAY_MIN_S = 0.005
QUEUE_DELAY_FRACTION = 0.25
LOSS_CAP_BETA = 0.85
#: Careful resume: the first, unvalidated round runs at this share of the saved rate (core.warm).
RESUME_JUMP_GAIN = 0.5
CAP_GROWTH_PER_ROUND = 1.05
#: Startup resumed from idle paces at, and keeps in flight, at most this times the measured rate
#: (BDP): ProbeBW's probe gain, not 2/ln 2, which threw ~2 BDP at a path measured near full.
RESTART_STARTUP_GAIN = 1.25

STARTUP, DRAIN, PROBE_BW, PROBE_RTT = 0, 1, 2, 3
_STATE_NAMES = ("startup", "drain", "probe_bw", "probe_rtt")


class BbrCongestionController(CongestionController):
    """BBRv1 state machine with loss counted as congestion only when a queue stands."""

    __slots__ = (
        "_mss", "_initial_cwnd", "_probe_rtt_enabled", "_rng", "_mode", "_state", "_pacing_gain",
        "_cwnd_gain", "_cwnd", "_pacing_rate", "_srtt_s", "_bw_filter", "_has_bw", "_bw_cap", "_round_count",
        "_next_round_delivered", "_round_start", "_full_bw", "_full_bw_count", "_full_bw_reached",
        "_min_rtt_s", "_min_rtt_stamp", "_round_min_rtt", "_prev_round_min_rtt", "_round_max_rate",
        "_prev_round_max_rate", "_idle_restart", "_probe_rtt_done", "_prior_cwnd", "_cycle_index",
        "_cycle_stamp", "_loss_in_phase", "_last_reduction", "_congested_in_round", "_delivered",
        "_resume_cap", "_newest_sent", "_restart_capped", "_group",
    )

    name: ClassVar[str] = "bbr"

    def __init__(self, config: BbrConfig, context: CcContext) -> None:
        if context.initial_window_packets < MIN_CWND_PACKETS:
            raise ValueError(f"bbr needs an initial window of at least {MIN_CWND_PACKETS} packets, "
                             f"got initial_window_packets={context.initial_window_packets}")
        self._mss = context.mss_bytes
        self._initial_cwnd = context.initial_window_packets * context.mss_bytes
        self._probe_rtt_enabled = config.probe_rtt
        self._rng = random.Random(config.seed + context.path_index)
        self._srtt_s = float(context.initial_rtt_s)
        self._bw_filter = RoundMaxFilter(BW_FILTER_ROUNDS)
        self._min_rtt_s = math.inf
        self._min_rtt_stamp = 0.0
        self._delivered = 0
        self._newest_sent = -math.inf
        self._group = (context.group.controllers if context.group else []) if config.shared else None
        if self._group is not None:
            self._group.append(self)  # None: not shared; [] a shared path on its own
        self._reset(0.0)

    def _reset(self, now: float) -> None:
        self._bw_filter.reset()
        self._has_bw = False
        self._bw_cap = math.inf
        self._round_count = 0
        self._next_round_delivered = 0
        self._round_start = False
        self._full_bw = 0.0
        self._full_bw_count = 0
        self._full_bw_reached = False
        self._round_min_rtt = math.inf
        self._prev_round_min_rtt = math.inf
        self._round_max_rate = 0.0
        self._prev_round_max_rate = 0.0
        self._idle_restart = False
        self._probe_rtt_done: float | None = None
        self._prior_cwnd = 0
        self._cycle_index = 0
        self._cycle_stamp = now
        self._loss_in_phase = False
        self._last_reduction = -math.inf
        self._congested_in_round = False
        self._resume_cap = math.inf  # while resuming: Startup is not paced above this
        self._restart_capped = False  # Startup resumed from idle: gain RESTART_STARTUP_GAIN
        self._cwnd = self._initial_cwnd
        self._pacing_rate = self._initial_pacing_rate()
        self._enter_startup()

    def _initial_pacing_rate(self) -> float:
        """The initial window over one RTT at the Startup gain (BBR's BBRInitPacingRate): the
        configured guess before the first sample, then the min RTT (as Linux re-initialises), so a
        short path does not dribble out its first window at the pace of a long guess."""
        rtt = self._min_rtt_s if self._min_rtt_s < math.inf else self._srtt_s
        return STARTUP_GAIN * self._initial_cwnd * 8.0 / rtt

    # -- events ---------------------------------------------------------------

    def on_packet_sent(self, now: float, size_bytes: int, bytes_in_flight: int) -> None:
        """Note restarts from idle, whose first RTT sample may refresh an expired min RTT.

        ``now`` is the packet's departure time, which may lie a pacing horizon
        ahead; the newest one marks what a reduction can no longer hold back.
        """
        if bytes_in_flight <= 0:
            self._idle_restart = True
            self.on_app_idle(now)  # a search interrupted by idle settles as at a step's end
        if now > self._newest_sent:
            self._newest_sent = now

    def on_ack(self, now: float, acked_bytes: int, rtt: RttEstimator, sample: RateSample | None,
               bytes_in_flight: int) -> None:
        """Update the path model from one ack batch, then the state, rate and window."""
        self._srtt_s = rtt.smoothed_s
        rtt_s = sample.rtt_s if sample is not None else rtt.latest_s if rtt.has_sample else 0.0
        self._round_start = False
        if sample is not None:
            self._delivered = sample.prior_delivered + sample.delivered_bytes
            self._update_round(sample)
            self._update_bw(sample)
        if rtt_s > 0.0 and rtt_s < self._round_min_rtt:
            self._round_min_rtt = rtt_s
        if self._mode == PROBE_BW:
            self._update_cycle_phase(now, acked_bytes, bytes_in_flight)
        if sample is not None and self._round_start:
            self._check_full_bw(sample)
        if self._mode == STARTUP and self._full_bw_reached:
            self._enter_drain(now)
        if self._mode == DRAIN and bytes_in_flight <= self._inflight(1.0):
            self._enter_probe_bw(now)
        self._update_min_rtt(now, rtt_s, bytes_in_flight)
        self._set_pacing_rate()
        self._set_cwnd(acked_bytes)

    def on_loss(self, now: float, lost_bytes: int, bytes_in_flight: int, lost_sent_time: float,
                rtt: RttEstimator) -> None:
        """Count the loss as congestion only when a queue has been standing."""
        self._loss_in_phase = True
        if lost_sent_time <= self._last_reduction or not self._queue_standing():
            return
        self._note_reduction(now)
        self._congested_in_round = True
        if self._mode == STARTUP:
            self._full_bw_reached = True
            self._enter_drain(now)
        elif self._has_bw:
            # While a queue stands the path delivers exactly its capacity, so the
            # recent delivery rate is the better anchor than the (older) max filter.
            recent = max(self._round_max_rate, self._prev_round_max_rate)
            anchor = min(self._bandwidth(), recent) if recent > 0.0 else self._bandwidth()
            floor = MIN_CWND_PACKETS * self._mss * 8.0 / self._min_rtt_s
            self._bw_cap = max(LOSS_CAP_BETA * anchor, floor)
            if self._mode == PROBE_BW:
                # Drain the standing queue now rather than at the next 0.75 phase.
                self._set_cycle_phase(now, DRAIN_PHASE)
        self._set_pacing_rate()
        self._set_cwnd(0)

    def on_path_reset(self, now: float) -> None:
        """Search for the capacity again from the initial window; keep the min RTT."""
        self._reset(now)

    def on_route_change(self, now: float) -> None:
        """Another route: search from the initial window, and take the next RTT sample as the min."""
        self._min_rtt_s = math.inf
        self._reset(now)

    def on_path_resume(self, now: float, rate_bps: float) -> None:
        """Careful resume towards ``rate_bps``: a half-rate first round, then Startup capped at it.

        Without a min RTT (never measured) there is no window to size: start over.
        """
        self._reset(now)
        if not rate_bps > 0.0 or self._min_rtt_s == math.inf:
            return
        self._resume_cap = rate_bps
        self._pacing_rate = max(self._pacing_rate, RESUME_JUMP_GAIN * rate_bps)
        full_bdp = int(rate_bps / 8.0 * self._min_rtt_s) + EXTRA_CWND_PACKETS * self._mss
        self._cwnd = max(self._cwnd, full_bdp)

    def on_app_idle(self, now: float) -> None:
        """A step ended during Startup (``core.warm``), or the path restarts from idle in it.

        The app-limited tail never ran the plateau test, and resuming at 2/ln 2 x
        the measured rate threw about two BDP into the queue. If the last round
        queued (by the standing-queue margin) the bottleneck was full and the
        estimate is the path's rate: ProbeBW at it and the min RTT. Otherwise (a
        short step ends long before the plateau) the search goes on at most 1.25 x
        the measured rate and BDP, until three flat rounds or a queued round.
        """
        if self._mode != STARTUP or not self._has_bw or self._min_rtt_s == math.inf:
            return
        if self._queued(self._round_min_rtt):
            self._full_bw_reached = True
            self._enter_drain(now)  # its bookkeeping: losses sent before now are not congestion
            self._enter_probe_bw(now)
        else:
            self._restart_capped = True  # see RESTART_STARTUP_GAIN
            self._pacing_rate = 0.0  # so that the capped rate replaces it
            self._cwnd_gain = RESTART_STARTUP_GAIN  # and at most a quarter BDP queued
        self._set_pacing_rate()
        self._set_cwnd(0)

    # -- model updates ----------------------------------------------------------

    def _update_round(self, sample: RateSample) -> None:
        if sample.prior_delivered < self._next_round_delivered:
            return
        self._next_round_delivered = self._delivered
        self._round_count += 1
        self._round_start = True
        self._prev_round_min_rtt = self._round_min_rtt
        self._round_min_rtt = math.inf
        self._prev_round_max_rate = self._round_max_rate
        self._round_max_rate = 0.0
        # Relax a congestion cap a little after every round without congestion
        # once the queue is gone.
        if self._bw_cap < math.inf and not self._congested_in_round and not self._queue_standing():
            self._bw_cap *= CAP_GROWTH_PER_ROUND
            if self._bw_cap >= self._bw_filter.value:
                self._bw_cap = math.inf
        self._congested_in_round = False

    def _update_bw(self, sample: RateSample) -> None:
        rate = sample.delivery_rate_bps
        if rate > self._round_max_rate:
            self._round_max_rate = rate
        # An app-limited sample says only "at least this much"; it may raise the
        # estimate but never hold it down.
        if sample.is_app_limited and rate < self._bw_filter.value:
            return
        self._bw_filter.update(self._round_count, rate)
        self._has_bw = self._bw_filter.value > 0.0

    def _check_full_bw(self, sample: RateSample) -> None:
        if self._full_bw_reached or sample.is_app_limited:
            return
        max_bw = self._bw_filter.value
        if max_bw >= self._full_bw * FULL_BW_GROWTH:
            self._full_bw = max_bw
            self._full_bw_count = 0
            return
        self._full_bw_count += 1
        # A search resumed from idle also ends on a round that queued: the estimate is the rate.
        if self._full_bw_count >= FULL_BW_ROUNDS or (
                self._restart_capped and self._queued(self._prev_round_min_rtt)):
            self._full_bw_reached = True

    def _update_cycle_phase(self, now: float, acked_bytes: int, bytes_in_flight: int) -> None:
        gain = self._pacing_gain
        full_length = now - self._cycle_stamp > self._min_rtt_s
        if gain > 1.0:
            # Probe until the extra is really in flight (or loss says there is no room).
            advance = full_length and (
                self._loss_in_phase or bytes_in_flight + acked_bytes >= self._inflight(gain)
            )
        elif gain < 1.0:
            advance = full_length or bytes_in_flight <= self._inflight(1.0)
        else:
            advance = full_length
        if advance:
            self._set_cycle_phase(now, (self._cycle_index + 1) % len(PACING_GAIN_CYCLE))

    def _set_cycle_phase(self, now: float, index: int) -> None:
        self._cycle_index = index
        self._cycle_stamp = now
        self._pacing_gain = PACING_GAIN_CYCLE[index]
        self._loss_in_phase = False

    def _update_min_rtt(self, now: float, rtt_s: float, bytes_in_flight: int) -> None:
        expired = self._min_rtt_s < math.inf and now - self._min_rtt_stamp > MIN_RTT_WINDOW_S
        if expired and self._group is not None:  # shared links: keep the base (core.cc.coupling)
            self._min_rtt_stamp, expired = now, False
        if rtt_s > 0.0 and (rtt_s <= self._min_rtt_s or expired):
            self._min_rtt_s = rtt_s
            self._min_rtt_stamp = now
        if self._probe_rtt_enabled and expired and not self._idle_restart and self._mode != PROBE_RTT:
            self._enter_probe_rtt()
        self._idle_restart = False
        if self._mode != PROBE_RTT:
            return
        if self._probe_rtt_done is None:
            if bytes_in_flight <= PROBE_RTT_CWND_PACKETS * self._mss:
                self._probe_rtt_done = now + max(PROBE_RTT_DURATION_S, self._min_rtt_s)
        elif now >= self._probe_rtt_done:
            self._min_rtt_stamp = now
            self._cwnd = max(self._cwnd, self._prior_cwnd)
            if self._full_bw_reached:
                self._enter_probe_bw(now)
            else:
                self._enter_startup()

    def _queued(self, rtt_s: float) -> bool:
        """Whether an RTT is more than max(5 ms, 25 % of the min RTT) above it: a queue."""
        if self._min_rtt_s == math.inf or rtt_s == math.inf:
            return False
        return rtt_s - self._min_rtt_s > max(QUEUE_DELAY_MIN_S, QUEUE_DELAY_FRACTION * self._min_rtt_s)

    def _queue_standing(self) -> bool:
        return self._queued(min(self._round_min_rtt, self._prev_round_min_rtt))

    # -- states ---------------------------------------------------------------

    def _set_mode(self, mode: int) -> None:
        """The mode and its label, kept together: a statistics snapshot copies the label."""
        self._mode = mode
        self._state = _STATE_NAMES[mode]

    def _enter_startup(self) -> None:
        self._set_mode(STARTUP)
        self._pacing_gain = STARTUP_GAIN
        self._cwnd_gain = STARTUP_GAIN

    def _note_reduction(self, now: float) -> None:
        """Start a new congestion episode: later losses count only for packets sent after it.
        Packets already handed out to depart after ``now`` (the pacing horizon) left at the old
        rate into the same queue: they belong to the episode being answered, not a new one."""
        self._last_reduction = max(now, self._newest_sent)

    def _enter_drain(self, now: float) -> None:
        """Leave Startup: drain its queue. That is the answer to the overshoot, so losses
        of packets sent before now (found a round trip later, in Drain or ProbeBW) are
        not a new congestion episode: they must not cap the rate Startup just measured."""
        self._note_reduction(now)
        # The search is over; ProbeBW may look beyond the saved (or restart) rate.
        self._resume_cap, self._restart_capped = math.inf, False
        self._set_mode(DRAIN)
        self._pacing_gain = DRAIN_GAIN
        self._cwnd_gain = STARTUP_GAIN

    def _enter_probe_bw(self, now: float) -> None:
        self._set_mode(PROBE_BW)
        self._cwnd_gain = CWND_GAIN
        # Any phase but the draining 0.75 one, so a new flow does not start by backing off.
        start = self._rng.choice((0, 2, 3, 4, 5, 6, 7))  # not DRAIN_PHASE
        self._set_cycle_phase(now, start)

    def _enter_probe_rtt(self) -> None:
        self._set_mode(PROBE_RTT)
        self._pacing_gain = 1.0
        self._cwnd_gain = 1.0
        self._probe_rtt_done = None
        self._prior_cwnd = self._cwnd

    # -- outputs --------------------------------------------------------------

    def _bandwidth(self) -> float:
        return min(self._bw_filter.value, self._bw_cap)

    def _inflight(self, gain: float) -> float:
        if not self._has_bw or self._min_rtt_s == math.inf:
            return float(self._initial_cwnd)
        return gain * self._bandwidth() / 8.0 * self._min_rtt_s

    def _coupled_gain(self, gain: float) -> float:
        """ProbeBW's gains (and the window's extra packets, gain 1 + extra) reduced to this path's
        share on shared links (``core.cc.coupling``)."""
        return coupled_gain(gain, self.bandwidth_bps, self._group) if self._mode == PROBE_BW else gain

    def _set_pacing_rate(self) -> None:
        if not self._has_bw:
            rate = self._initial_pacing_rate()
        else:
            rate = self._coupled_gain(self._pacing_gain) * self._bandwidth()
        if not self._full_bw_reached:
            rate = min(max(rate, self._initial_pacing_rate()), self._resume_cap)
            if self._restart_capped and self._has_bw:
                rate = min(rate, RESTART_STARTUP_GAIN * self._bandwidth())
        # In Startup a small early sample must not slow the search down.
        if self._full_bw_reached or rate > self._pacing_rate:
            floor_rtt = self._min_rtt_s if self._min_rtt_s < math.inf else self._srtt_s
            self._pacing_rate = max(rate, MIN_CWND_PACKETS * self._mss * 8.0 / floor_rtt)

    def _set_cwnd(self, acked_bytes: int) -> None:
        mss = self._mss
        if self._has_bw:
            extra = (self._coupled_gain(1.0 + EXTRA_CWND_PACKETS) - 1.0) * mss
            target = int(self._inflight(self._coupled_gain(self._cwnd_gain)) + extra)
            if self._full_bw_reached or self._restart_capped:
                self._cwnd = min(self._cwnd + acked_bytes, target)
            elif self._cwnd < target or self._delivered < self._initial_cwnd:
                self._cwnd += acked_bytes
        self._cwnd = max(self._cwnd, MIN_CWND_PACKETS * mss)
        if self._mode == PROBE_RTT:
            self._cwnd = min(self._cwnd, PROBE_RTT_CWND_PACKETS * mss)

    @property
    def cwnd_bytes(self) -> int:
        return self._cwnd

    @property
    def pacing_rate_bps(self) -> float:
        return self._pacing_rate

    @property
    def bandwidth_bps(self) -> float:
        """The (congestion-capped) bottleneck bandwidth estimate, or the pacing rate before one."""
        return self._bandwidth() if self._has_bw else self._pacing_rate

    @property
    def in_startup(self) -> bool:
        return self._mode == STARTUP

    @property
    def state(self) -> str:
        return self._state

    def metrics(self) -> dict[str, float]:
        """Adds the model: ``max_bw_bps`` (before any cap), ``bw_cap_bps`` (while one holds), gains."""
        return named_figures(self.metrics_figures()[1])

    def metrics_figures(self) -> tuple[Callable[[Any], dict[str, float]], tuple[Any, ...]]:
        """The fields ``metrics()`` names, read as they are (``core.cc.bbr_figures`` names them)."""
        return named_figures, (self._cwnd, self._pacing_rate, self._state, self._has_bw,
                               self._bw_filter.value, self._bw_cap, self._pacing_gain, self._cwnd_gain,
                               self._round_count, self._min_rtt_s)
