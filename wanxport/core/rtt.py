"""Per-path round-trip time estimation (RFC 9002 section 5).

One :class:`RttEstimator` lives on each path. The loss detector reads
``smoothed_s``/``latest_s`` for its time threshold, the probe timer reads
:meth:`RttEstimator.pto_s`, and the congestion controllers read ``min_s`` and
``min_recent_s``.

Besides the RFC's path-lifetime ``min_s`` the estimator keeps a *windowed*
minimum (``min_recent_s``) over the last ``min_window_s`` seconds. A lifetime
minimum never forgets a route that has since changed; a windowed one follows
the path (:class:`~wanxport.core.windowed_filter.RunningMinFilter`).

Time is an argument (``now``, seconds); the estimator never reads a clock.
"""

from __future__ import annotations

from wanxport.core.windowed_filter import RunningMinFilter

#: RFC 9002 kInitialRtt: what the estimates are before the first sample.
INITIAL_RTT_S = 0.333
#: RFC 9002 kGranularity: floor of the variance term of the probe timeout.
GRANULARITY_S = 0.001
#: Floor of the probe timeout itself, as Linux floors its tail-loss probe (TCP_TIMEOUT_MIN).
#: On a sub-millisecond path the RFC's timeout is a few milliseconds, shorter than the
#: stalls of a busy host's scheduler: a loopback transfer on two cores timed out 30-80
#: times per GiB, each declaring a healthy path's whole flight lost.
#: A path of 5 ms or more round trip has a longer timeout anyway.
MIN_PTO_S = 0.010
#: Window of ``min_recent_s``; BBR's min-RTT filter length.
MIN_WINDOW_S = 10.0


class RttEstimator:
    """Smoothed RTT, RTT variation, lifetime and windowed minimum RTT of one path."""

    __slots__ = (
        "latest_s",
        "latest_adjusted_s",
        "smoothed_s",
        "rttvar_s",
        "min_s",
        "has_sample",
        "sampled_at",
        "initial_rtt_s",
        "min_window_s",
        "_recent",
    )

    def __init__(self, initial_rtt_s: float = INITIAL_RTT_S, min_window_s: float = MIN_WINDOW_S) -> None:
        if not initial_rtt_s > 0.0:
            raise ValueError(f"initial_rtt_s must be > 0 seconds, got {initial_rtt_s!r}")
        if not min_window_s > 0.0:
            raise ValueError(f"min_window_s must be > 0 seconds, got {min_window_s!r}")
        self.initial_rtt_s = float(initial_rtt_s)
        self.min_window_s = float(min_window_s)
        self.has_sample = False
        self.sampled_at = 0.0  # when the latest sample was taken (meaningful once has_sample)
        # Before the first sample every estimate is the initial RTT (RFC 9002 6.2.2),
        # so callers never have to special-case "unknown".
        self.latest_s = self.initial_rtt_s
        # The latest sample less the peer's ack delay (as the smoothed RTT takes it), for
        # controllers that read queueing delay off single samples (ledbat).
        self.latest_adjusted_s = self.initial_rtt_s
        self.smoothed_s = self.initial_rtt_s
        self.rttvar_s = self.initial_rtt_s / 2.0
        self.min_s = self.initial_rtt_s
        self._recent = RunningMinFilter(self.min_window_s, 0.0, self.initial_rtt_s)

    @property
    def min_recent_s(self) -> float:
        """Minimum RTT over roughly the last ``min_window_s`` seconds."""
        return self._recent.value

    def update(self, latest_rtt_s: float, ack_delay_s: float, now: float) -> None:
        """Take one RTT sample (RFC 9002 5.3).

        ``ack_delay_s`` is the peer's reported delay, already limited to its
        max_ack_delay by the caller; it is subtracted only when that does not
        take the sample below the minimum RTT, and never from ``min_s``.
        Non-positive samples (clock trouble, a confused peer) are ignored.
        """
        if not latest_rtt_s > 0.0:
            return
        self.latest_s = self.latest_adjusted_s = latest_rtt_s
        self.sampled_at = now
        if not self.has_sample:
            self.has_sample = True
            self.min_s = latest_rtt_s
            self.smoothed_s = latest_rtt_s
            self.rttvar_s = latest_rtt_s / 2.0
            self._recent.reset(now, latest_rtt_s)
            return
        if latest_rtt_s < self.min_s:
            self.min_s = latest_rtt_s
        self._recent.update(now, latest_rtt_s)
        adjusted = latest_rtt_s
        if latest_rtt_s >= self.min_s + ack_delay_s:
            adjusted = latest_rtt_s - ack_delay_s
        self.latest_adjusted_s = adjusted
        self.rttvar_s = 0.75 * self.rttvar_s + 0.25 * abs(self.smoothed_s - adjusted)
        self.smoothed_s = 0.875 * self.smoothed_s + 0.125 * adjusted

    def restart(self, now: float) -> None:
        """Keep only the latest sample (the path was rerouted: older ones describe another route)."""
        latest = self.latest_s
        self.min_s = latest
        self.smoothed_s = latest
        self.rttvar_s = latest / 2.0
        self._recent.reset(now, latest)

    def pto_s(self, max_ack_delay_s: float) -> float:
        """Probe timeout duration (RFC 9002 6.2.1, at least MIN_PTO_S), before any backoff."""
        return max(self.smoothed_s + max(4.0 * self.rttvar_s, GRANULARITY_S) + max_ack_delay_s, MIN_PTO_S)
