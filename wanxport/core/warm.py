"""Careful resume: when what a path learned may be used again, and how far to trust it.

A training job exchanges shards every step over the same paths, so a session
that carried step k knows each path's bandwidth, min RTT and window when step
k+1 starts; paying BBR's Startup again (log2(BDP / initial window) round trips
on a 150 ms path) would cost a tenth of a 64 MiB step. But learned state is
only as good as the route it was measured on. One policy here decides, for
every moment state is reused — a path idle between steps (``IdleGuard``), a
failed path readmitted (``core.failover``), a session restarted from saved
state (the gateway daemon) — in the spirit of draft-ietf-tsvwg-careful-resume:

* state is saved only once validated: the controller is out of Startup and the
  path has an RTT sample (a search in progress is not a measurement);
* it is dropped when the path's RTT moved by more than ``RTT_TOLERANCE``
  (20 %): a sample below 0.8 x the saved min RTT, or above 1.2 x the saved
  smoothed RTT (which already holds the queueing the path had) and beyond the
  variation the path showed (smoothed RTT + 4 x RTT variation, the span RFC
  9002's probe timeout allows), is another route whose capacity nothing here
  measured. Two sessions sharing a bottleneck (two all-reduce ranks a site)
  start each step into each other's queue: their first samples ran to 1.2-2.1 x
  the smoothed RTT, and without the variation term a quarter of the step
  starts "rerouted" back into Startup;
* it is dropped when older than ``MAX_AGE_S`` (an hour): the path may be shared
  differently by then;
* a *restarted* session (nothing in flight, no live controller) resumes at no
  more than ``RESUME_SHARE`` (half) of the saved rate for its first round,
  which the acknowledgements of that round validate (BBR's ``on_path_resume``);
* a live session's path idle for the think time keeps its controller as it
  is — an idle gap is not evidence that the path changed, and the BBR model
  ages by rounds, not seconds — and the first acknowledgement after the gap
  validates the route; a reroute resets the controller and the RTT estimates;
* a gap shorter than the path's smoothed round trip is not an idle gap: its
  last acknowledgement is as recent as a busy path's, and a sender whose loop
  was late by a fraction of a round trip empties a fast path that way. On
  loopback 4 paths went idle ~250 times per GiB for a median 0.15 ms, and one
  RTT sample each, read against an RTT that the host's load moved by more than
  20 %, "rerouted" half of them back into Startup.

Time is an argument; nothing here reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from wanxport.core.cc import CongestionController
from wanxport.core.counters import PathCounters
from wanxport.core.rtt import RttEstimator

#: The share of the saved rate a resumed path's first, unvalidated round may use.
RESUME_SHARE = 0.5
#: How far a path's RTT may move before its saved state describes another route.
RTT_TOLERANCE = 0.20
#: A sample up to this many RTT variations above the smoothed RTT is the same route.
RTT_VARIATION_SPAN = 4.0
#: Saved state older than this is dropped.
MAX_AGE_S = 3600.0


@dataclass(frozen=True, slots=True)
class PathMemory:
    """What one path had validated when it was saved: its rate and its round trip."""

    rate_bps: float
    min_rtt_s: float
    srtt_s: float
    saved_at: float
    rttvar_s: float = 0.0  # the RTT variation it showed; 0 where unknown (a daemon's cache)

    def same_route(self, rtt_sample_s: float) -> bool:
        """Whether a fresh RTT sample is within ``RTT_TOLERANCE`` of the saved min RTT
        from below, and within the tolerance or the path's own variation from above."""
        low = (1.0 - RTT_TOLERANCE) * self.min_rtt_s
        srtt = self.round_trip_s
        high = max((1.0 + RTT_TOLERANCE) * srtt, srtt + RTT_VARIATION_SPAN * self.rttvar_s)
        return low <= rtt_sample_s <= high

    @property
    def round_trip_s(self) -> float:
        """The saved smoothed RTT, never below the saved min RTT."""
        return max(self.srtt_s, self.min_rtt_s)

    def fresh(self, now: float) -> bool:
        return now - self.saved_at <= MAX_AGE_S

    def usable(self, rtt_sample_s: float, now: float) -> bool:
        """The saved state may be reused: young enough, and the route looks the same."""
        return self.fresh(now) and self.same_route(rtt_sample_s)

    def resume_rate_bps(self) -> float:
        """The most a resumed path's first round may be paced at."""
        return RESUME_SHARE * self.rate_bps


def remember(cc: CongestionController, rtt: RttEstimator, now: float) -> PathMemory | None:
    """The path's validated state, or None while there is nothing validated to save."""
    if cc.in_startup or not rtt.has_sample or not cc.bandwidth_bps > 0.0:
        return None
    return PathMemory(cc.bandwidth_bps, rtt.min_recent_s, rtt.smoothed_s, now, rtt.rttvar_s)


class IdleGuard:
    """One path's learned state across an idle gap (e.g. the think time between steps).

    The path calls :meth:`went_idle` when its last packet in flight is
    acknowledged, :meth:`restarting` when it sends again from idle, and
    :meth:`confirm` with each acknowledgement; the answers say whether to keep
    the controller or start it over.
    """

    __slots__ = ("memory", "_restarted_at", "counters", "expired", "short_gaps")

    def __init__(self, counters: PathCounters | None = None) -> None:
        """``counters``: the path's, whose ``reroutes`` this counts (restarts whose first
        round trip showed another route)."""
        self.memory: PathMemory | None = None
        self._restarted_at: float | None = None
        self.counters = PathCounters() if counters is None else counters
        self.expired = 0  # restarts after an idle gap longer than MAX_AGE_S
        self.short_gaps = 0  # sends resumed within a round trip of going idle: not checked

    def went_idle(self, cc: CongestionController, rtt: RttEstimator, now: float) -> None:
        """Nothing is in flight any more: note the route the path's model was measured on.

        Unlike :func:`remember`, a controller still in Startup counts: it keeps
        searching after the gap, but on the old route's RTT it would size its
        window wrongly, so its route is checked all the same.
        """
        self.memory = PathMemory(cc.bandwidth_bps, rtt.min_recent_s, rtt.smoothed_s, now, rtt.rttvar_s) \
            if rtt.has_sample else None
        self._restarted_at = None

    def restarting(self, now: float) -> bool:
        """The path sends again after idling; False when the saved state is too old to keep."""
        memory = self.memory
        if memory is None or self._restarted_at is not None:
            return True
        if now - memory.saved_at < memory.round_trip_s:
            self.memory = None  # less than a round trip idle: nothing went unobserved
            self.short_gaps += 1
            return True
        if not memory.fresh(now):
            self.memory = None
            self.expired += 1
            return False
        self._restarted_at = now
        return True

    def confirm(self, sent_at: float, rtt_sample_s: float) -> bool:
        """An acknowledgement of a packet sent at ``sent_at`` with this RTT sample.

        Returns False once, for the first packet sent after the restart whose
        round trip shows another route; True otherwise. Either way the first
        such acknowledgement ends the validation.
        """
        memory, restarted_at = self.memory, self._restarted_at
        if memory is None or restarted_at is None or sent_at < restarted_at:
            return True
        self.memory = None
        self._restarted_at = None
        if memory.same_route(rtt_sample_s):
            return True
        self.counters.reroutes += 1
        return False
