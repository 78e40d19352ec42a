"""Keeping an idle path's RTT estimate fresh: a cheap probe when it has gone unsampled too long.

The scheduler sends each chunk where it is expected to land first, from each
path's round trip (``core.scheduling.order``). A path that carries no data
produces no RTT samples, so an estimate that is wrong stays wrong: one sample
taken during a host stall (0.83 s on a 20 ms route) sent every later small
message to a slower route, and nothing ever measured the fast one again.

So a usable path whose estimate has had no sample for ``max(STALE_AFTER_S,
STALE_AFTER_RTTS x srtt)`` gets one PROBE frame: ack-eliciting, outside the
congestion window (not in flight), answered by the peer's ACK like any packet,
whose RTT sample refreshes the estimate. A path that carries data is sampled on
every acknowledgement and is never probed. One never measured (another path
looked faster than its initial estimate, so it never got data) counts from the
session's first submitted shard. A suspected or failed path has the failover
probes (``core.failover``) and gets none of these. At most one probe
per interval, and the interval is at least ``STALE_AFTER_S``: about 50 bytes a
second a path each way, however long the session sits idle.

Time is an argument (``now``); nothing here reads a clock.
"""

from __future__ import annotations

from wanxport.core.counters import PathCounters
from wanxport.core.rtt import RttEstimator
from wanxport.wire.frames import ProbeFrame

#: Floor of the interval without a sample after which a path is probed (and between probes).
STALE_AFTER_S = 1.0
#: ... in smoothed RTTs, for a long path whose acknowledgements are naturally spaced out.
STALE_AFTER_RTTS = 3.0
#: The token of a freshness probe: its answer (PROBE_ACK) is not awaited, only the ACK of its packet.
FRESHNESS_TOKEN = 0

INFINITY = float("inf")


class RttFreshness:
    """One path's freshness clock: when its estimate goes stale, and how many probes refreshed it."""

    __slots__ = ("counters", "started_at", "probed_at", "stopped")

    def __init__(self, counters: PathCounters) -> None:
        self.counters = counters  # the path's: ``rtt_probes`` counts the probes sent
        self.started_at = -INFINITY  # the session's first shard: an unmeasured path counts from here
        self.probed_at = -INFINITY  # the latest freshness probe sent
        self.stopped = False  # the session closed: nothing more to keep fresh

    def start(self, now: float) -> bool:
        """The session has data to send: the clock runs from now on. False if it already ran."""
        if self.started_at != -INFINITY:
            return False
        self.started_at = now
        return True

    def due_at(self, rtt: RttEstimator) -> float:
        """When the path should be probed if no sample comes first; inf before the clock started
        or once it stopped.

        The caller asks only for a usable path (active or probing).
        """
        if self.stopped:
            return INFINITY
        last = rtt.sampled_at if rtt.has_sample else self.started_at
        if self.probed_at > last:
            last = self.probed_at
        if last == -INFINITY:
            return INFINITY
        return last + max(STALE_AFTER_S, STALE_AFTER_RTTS * rtt.smoothed_s)

    def probe(self, rtt: RttEstimator, usable: bool, session_open: bool, now: float) -> ProbeFrame | None:
        """The path's timer fired: a probe to send on it if its estimate is stale, else None.

        A closed session stops the clock for good.
        """
        if not session_open:
            self.stopped = True
            return None
        if not usable or self.due_at(rtt) > now:
            return None
        self.probed_at = now
        self.counters.rtt_probes += 1
        return ProbeFrame(FRESHNESS_TOKEN)
