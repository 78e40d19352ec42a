"""Who may start a QUIC handshake on a path's port: address validation and handshake limits.

A gateway's path ports face long-haul links that anyone on the path can reach,
and a QUIC Initial is cheap to forge (its keys derive from its own header). Left
alone, aioquic builds a connection, TLS state and a certificate flight for every
full-size Initial from any source address. Three limits keep that bounded:

* **Retry under load** (as WireGuard sends cookie replies only when under load):
  while fewer than ``retry_above`` handshakes are half open, an Initial is
  answered directly, so an ordinary (re)connect costs no extra round trip, which
  on a 150 ms path is what a control-channel failover waits for. Once that many
  are half open, a token-less Initial gets a stateless Retry (RFC 9000 §8.1.2)
  and only a client that proves it receives at its source address gets state.
  Forged sources never return the token, so they can hold at most
  ``retry_above`` half-open handshakes between them. ``retry_above = 0`` means
  Retry always. An Initial that carries a token is always validated.
* **A cap on half-open handshakes** (``max_half_open``): beyond it, new
  Initials are dropped (counted ``half_open_cap``), validated or not.
* **A per-source rate limit** of handshake attempts (WireGuard's 20 per second
  per source): a token bucket per source IP, in a table of at most
  ``max_sources`` entries (least recently seen evicted), so a spray from many
  spoofed addresses costs bounded memory. Drops are counted ``rate_limited``.

Before validation aioquic itself sends at most 3x the bytes received from an
address (RFC 9000 §8.1); a Retry is smaller than the Initial it answers.
tests/test_control_admission.py checks the policy, tests/test_admission_netns.py
the bytes and the cap under a spray of spoofed Initials.
"""

from __future__ import annotations

import enum
from collections import Counter, OrderedDict
from dataclasses import dataclass

DEFAULT_MAX_HALF_OPEN = 64
DEFAULT_RETRY_ABOVE = 8
DEFAULT_SOURCE_RATE = 20.0  # handshake attempts per second per source IP (WireGuard's figure)
DEFAULT_SOURCE_BURST = 20
DEFAULT_MAX_SOURCES = 4096


@dataclass(frozen=True)
class AdmissionLimits:
    """The knobs of ``Admission``; the defaults suit two gateways reconnecting now and then."""

    max_half_open: int = DEFAULT_MAX_HALF_OPEN
    retry_above: int = DEFAULT_RETRY_ABOVE
    source_rate: float = DEFAULT_SOURCE_RATE
    source_burst: int = DEFAULT_SOURCE_BURST
    max_sources: int = DEFAULT_MAX_SOURCES

    def __post_init__(self) -> None:
        if self.max_half_open < 1:
            raise ValueError(f"max_half_open: {self.max_half_open} is not valid; use >= 1")
        if not 0 <= self.retry_above <= self.max_half_open:
            raise ValueError(f"retry_above: {self.retry_above} is not valid; use 0..max_half_open "
                             f"({self.max_half_open}); 0 means Retry always")
        if self.source_rate <= 0 or self.source_burst < 1:
            raise ValueError("source_rate must be > 0 and source_burst >= 1")
        if self.max_sources < 1:
            raise ValueError(f"max_sources: {self.max_sources} is not valid; use >= 1")


class Verdict(enum.Enum):
    ADMIT = "admit"  # let aioquic create the connection
    RETRY = "retry"  # answer with a stateless Retry
    RATE_LIMITED = "rate_limited"
    HALF_OPEN_CAP = "half_open_cap"


class Admission:
    """Decides, per Initial that would open a connection, what happens to it."""

    def __init__(self, limits: AdmissionLimits | None = None) -> None:
        self.limits = limits or AdmissionLimits()
        # source IP -> (tokens, time of last refill), least recently seen first
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.verdicts: Counter[Verdict] = Counter()  # for metrics and tests
        self.max_half_open_seen = 0

    @property
    def tracked_sources(self) -> int:
        return len(self._buckets)

    def decide(self, source_ip: str, has_token: bool, half_open: int, now: float) -> Verdict:
        """``half_open``: handshakes started and not yet complete on this server."""
        verdict = self._verdict(source_ip, has_token, half_open, now)
        self.verdicts[verdict] += 1
        if verdict is Verdict.ADMIT:
            self.max_half_open_seen = max(self.max_half_open_seen, half_open + 1)
        return verdict

    def _verdict(self, source_ip: str, has_token: bool, half_open: int, now: float) -> Verdict:
        if not self._take(source_ip, now):
            return Verdict.RATE_LIMITED
        if half_open >= self.limits.max_half_open:
            return Verdict.HALF_OPEN_CAP
        if not has_token and half_open >= self.limits.retry_above:
            return Verdict.RETRY
        return Verdict.ADMIT

    def _take(self, source_ip: str, now: float) -> bool:
        limits = self.limits
        tokens, last = self._buckets.pop(source_ip, (float(limits.source_burst), now))
        tokens = min(float(limits.source_burst), tokens + max(0.0, now - last) * limits.source_rate)
        allowed = tokens >= 1.0
        self._buckets[source_ip] = (tokens - 1.0 if allowed else tokens, now)
        if len(self._buckets) > limits.max_sources:
            self._buckets.popitem(last=False)
        return allowed
