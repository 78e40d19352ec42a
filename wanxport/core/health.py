"""Path health as an explicit state machine, with the probing and careful-resume state beside it.

A path is ACTIVE while acknowledgements flow. A probe timeout suspects it
(DEGRADED: no new data, its outstanding data goes elsewhere, probes ask
whether it still answers); enough unanswered probes fail it (FAILED: only
probes, to notice its return); an answer readmits it (FAILED -> PROBING while
the controller searches its capacity again, DEGRADED -> ACTIVE), and PROBING
becomes ACTIVE once an answer finds the controller out of Startup.

Every legal move is one entry of :data:`TRANSITIONS`, in the manner of h11's
``_state.py``: a pair the table does not list is a bug in the caller and
raises :class:`IllegalTransition` instead of silently doing something. Pairs
that change nothing but can happen are listed explicitly as no-ops, so the
table answers every question about the machine by itself.
"""

from __future__ import annotations

from enum import StrEnum

from wanxport.core.cc import CongestionController
from wanxport.core.counters import PathCounters
from wanxport.core.rtt import RttEstimator
from wanxport.core.warm import PathMemory, remember

#: Consecutive probe intervals without an answer that fail a suspected path.
PROBE_MISS_LIMIT = 2


class PathState(StrEnum):
    PROBING = "probing"  # readmitted, ramping up again
    ACTIVE = "active"
    DEGRADED = "degraded"  # probe timeout fired: no new data until it answers
    FAILED = "failed"  # several probe timeouts: only probes until it answers


class HealthEvent(StrEnum):
    PTO = "pto"  # the probe timeout fired: nothing acknowledged for too long
    PROBE_MISSES = "probe_misses"  # PROBE_MISS_LIMIT probe intervals passed without an answer
    ACK = "ack"  # a not-ACTIVE path acknowledged something (its controller still in Startup if PROBING)
    STARTUP_DONE = "startup_done"  # a PROBING path acknowledged something and its controller left Startup


class IllegalTransition(Exception):
    """An event the path's current state cannot receive: the caller's logic is wrong.

    A plain ``Exception`` subclass: mypyc compiles this module, and it can subclass
    only a few built-in exceptions (not ``RuntimeError``).
    """


_A, _P, _D, _F = PathState.ACTIVE, PathState.PROBING, PathState.DEGRADED, PathState.FAILED

TRANSITIONS: dict[tuple[PathState, HealthEvent], PathState] = {
    (_A, HealthEvent.PTO): _D,
    (_A, HealthEvent.PROBE_MISSES): _F,
    (_A, HealthEvent.ACK): _A,  # no-op: acknowledgements are what keeps it active
    (_P, HealthEvent.PTO): _D,
    (_P, HealthEvent.PROBE_MISSES): _F,
    (_P, HealthEvent.ACK): _P,  # no-op: still searching its capacity
    (_P, HealthEvent.STARTUP_DONE): _A,
    (_D, HealthEvent.PTO): _D,  # no-op: already suspected
    (_D, HealthEvent.PROBE_MISSES): _F,
    (_D, HealthEvent.ACK): _A,
    (_F, HealthEvent.PTO): _F,  # no-op: already out of service
    (_F, HealthEvent.PROBE_MISSES): _F,  # no-op: probes go on until it answers
    (_F, HealthEvent.ACK): _P,
}
# Not listed, so illegal: STARTUP_DONE in ACTIVE, DEGRADED or FAILED (only a PROBING
# path's controller is in a Startup the machine waits for).

USABLE_STATES = frozenset({PathState.ACTIVE, PathState.PROBING})


class PathHealth:
    """One path's health state, its failure probes and what careful resume remembers."""

    __slots__ = ("state", "usable", "counters", "probe_token", "probe_misses", "next_probe_at",
                 "saved")

    def __init__(self, counters: PathCounters | None = None) -> None:
        """``counters``: the path's, whose ``failures`` this counts (entries into FAILED)."""
        self.state = PathState.ACTIVE
        self.usable = True  # may carry new data: active or probing
        self.counters = PathCounters() if counters is None else counters
        self.probe_token = 0  # token of the latest probe sent
        self.probe_misses = 0  # probe intervals without an answer since the last one
        self.next_probe_at: float | None = None  # when the current probe counts as missed
        # What the path sustained when last suspected of failure (careful resume); None: nothing validated
        self.saved: PathMemory | None = None

    def next_state(self, event: HealthEvent) -> PathState:
        """Where ``event`` takes the path from its current state, without moving it."""
        try:
            return TRANSITIONS[(self.state, event)]
        except KeyError:
            raise IllegalTransition(f"path health: event {event.value!r} in state "
                                    f"{self.state.value!r}") from None

    def fire(self, event: HealthEvent) -> PathState:
        """Apply ``event``; return the state the path was in before it."""
        old = self.state
        new = self.next_state(event)
        if new is not old:
            self.state = new
            self.usable = new in USABLE_STATES
            if new is PathState.FAILED:
                self.counters.failures += 1
        return old

    # -- probing ---------------------------------------------------------------

    def next_probe(self, next_probe_at: float) -> int:
        """A probe goes out now; its answer is awaited until ``next_probe_at``. Returns its token."""
        self.probe_token += 1
        self.next_probe_at = next_probe_at
        return self.probe_token

    def probe_missed(self) -> bool:
        """The awaited probe interval passed unanswered; True once that fails the path."""
        self.probe_misses += 1
        return self.probe_misses >= PROBE_MISS_LIMIT

    def answered(self) -> None:
        """The path answered: no probe is awaited and the misses start over."""
        self.next_probe_at = None
        self.probe_misses = 0

    # -- careful resume --------------------------------------------------------

    def save_for_resume(self, cc: CongestionController, rtt: RttEstimator, now: float) -> None:
        """Remember the rate and RTT of a path about to be suspected, if they were validated.

        An estimate from Startup is a search in progress, not a measured
        capacity: it leaves an older saved rate (or none) in place.
        """
        if self.state is PathState.ACTIVE:
            self.saved = remember(cc, rtt, now) or self.saved

    def resume_rate_bps(self, rtt: RttEstimator, now: float) -> float:
        """The saved rate if the path's latest RTT sample says the route is unchanged, else 0.

        The careful-resume policy is ``core.warm``'s: saved state is reused only
        on a confirmed route (RTT within 20 %) and for an hour; the controller
        then paces its first round at half of it.
        """
        saved = self.saved
        if saved is None or not saved.usable(rtt.latest_s, now):
            return 0.0
        return saved.rate_bps
