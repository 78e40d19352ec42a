"""Path failure, probing and readmission: what the session does when a path stops answering.

Split from ``core.session`` because it is one policy with its own vocabulary
(probe timeouts, missed probes, careful resume) driven by the path's health
state machine (``core.health``). It moves a suspected path's data elsewhere
through the transmitter, probes the path on its own timer, and readmits it
when a probe is answered: at the saved rate if the route looks the same, else
from a fresh start.
"""

from __future__ import annotations

from wanxport.core.config import SessionConfig
from wanxport.core.events import Event, PathChanged
from wanxport.core.health import HealthEvent, PathState
from wanxport.core.paths import Path
from wanxport.core.recovery import PROBE_MEMORY_S
from wanxport.core.transmitter import Transmitter
from wanxport.wire.frames import ProbeFrame


class Failover:
    """Suspects, fails, probes and readmits paths; announces each change as a ``PathChanged``."""

    def __init__(self, config: SessionConfig, transmitter: Transmitter, events: list[Event]) -> None:
        self.config = config
        self.transmitter = transmitter
        self.events = events  # the session's event queue (shared, never rebound)

    def _health_event(self, path: Path, event: HealthEvent, now: float) -> None:
        """Move the path's health state machine; announce a change, and free a suspected path's stripe."""
        old = path.health.fire(event)
        new = path.health.state
        if new is not old:
            if new in (PathState.DEGRADED, PathState.FAILED):
                self.transmitter.release_stripe(path)
            self.events.append(PathChanged(path.path_id, path.name, old.value, new.value, now))

    def readmit(self, path: Path, now: float) -> None:
        """An acknowledgement on a path that is not active: move it back towards service."""
        health = path.health
        if health.state is PathState.FAILED:
            # The answer to a probe carried a fresh RTT sample: resume at the saved rate
            # if it shows the same route, else search from scratch.
            rate_bps = health.resume_rate_bps(path.rtt, now)
            if rate_bps > 0.0:
                path.cc.on_path_resume(now, rate_bps)
            else:
                path.cc.on_path_reset(now)
            path.next_send_at = now
            self._health_event(path, HealthEvent.ACK, now)
        elif health.state is PathState.PROBING and not path.cc.in_startup:
            self._health_event(path, HealthEvent.STARTUP_DONE, now)
        else:
            self._health_event(path, HealthEvent.ACK, now)
        health.answered()
        self.transmitter.dirty.add(path.path_id)

    def on_timer(self, path: Path, now: float, session_open: bool) -> None:
        """A path's timer fired: its probe timeout, its next failover probe, or a freshness
        probe if its RTT estimate has gone unsampled too long (``core.freshness``)."""
        pto = path.loss.pto_deadline(self.config.max_ack_delay_s) if path.usable else None
        next_probe_at = path.health.next_probe_at
        if pto is not None and pto <= now:
            self.on_probe_timeout(path, now)
        elif next_probe_at is not None and next_probe_at <= now:
            self.on_probe_due(path, now)
        probe = path.freshness.probe(path.rtt, path.usable, session_open, now)
        if probe is not None:
            self.transmitter.control_on(path, probe)

    def on_probe_timeout(self, path: Path, now: float) -> None:
        """No acknowledgement for a probe timeout: suspect the path, move its data elsewhere."""
        # Before the losses below touch the congestion state.
        path.health.save_for_resume(path.cc, path.rtt, now)
        path.loss.on_pto()
        lost = path.loss.declare_all_lost(now)
        if lost:
            self.transmitter.requeue(lost)
        self._health_event(path, HealthEvent.PTO, now)
        self._send_probe(path, now)

    def _send_probe(self, path: Path, now: float) -> None:
        # A long outage holds the probes of the last PROBE_MEMORY_S, not one per interval.
        # Not just the latest: a path that returns with a round trip longer than the probe
        # interval (rerouted) answers a probe that would already be forgotten, and the
        # answer to a forgotten probe readmits nothing: the path would never come back.
        path.loss.forget_probes_before(now - PROBE_MEMORY_S)
        if path.state is PathState.FAILED:
            # Out of service: probes only watch for its return, and their answers are
            # not awaited, so they may go faster than a round trip.
            interval = self.config.failed_probe_interval_s
        else:
            # Suspected: each interval without an answer is a miss (two fail the path),
            # so an answer must have had time to come back.
            interval = min(path.loss.pto_s(self.config.max_ack_delay_s), self.config.max_probe_interval_s)
        self.transmitter.control_on(path, ProbeFrame(path.health.next_probe(now + interval)))

    def on_probe_due(self, path: Path, now: float) -> None:
        """A suspected or failed path's probe timer: count a miss, re-queue its data, probe again."""
        if path.health.probe_missed():
            self._health_event(path, HealthEvent.PROBE_MISSES, now)
        lost = path.loss.declare_all_lost(now)
        if lost:
            self.transmitter.requeue(lost)
        path.loss.on_pto()
        self._send_probe(path, now)
