"""Per-path delivered rates of a baseline, and the rule that marks a run ``suspect``.

A baseline's completion time says how long the transfer took; it does not say
whether the baseline was limited by the network or by our harness (a socket
bound to the wrong route, a stream left in slow start, a buffer too small). A
path's *delivered rate* answers that: the payload it delivered divided by the
time its connection had payload not yet acknowledged (``active_s``), so a
connection that finished its slice early is not charged for the time it then
sat idle.

A clean path (no loss in that direction, no events) has nothing that should keep
a competent transport below its capacity for long. One that delivered under
half its capacity while it had data to send points at the harness, not at the
transport: the run is ``suspect``, to be investigated and re-run, not published.
A path judged so needs enough time to leave slow start behind
(``MIN_JUDGED_RTTS`` round trips), or the rule would only measure slow start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wanxport.scenario import PathSpec

SUSPECT_FRACTION = 0.5
MIN_JUDGED_RTTS = 50  # slow start to a few thousand packets takes about a dozen round trips


@dataclass(frozen=True)
class Delivery:
    """What one path delivered in one direction, and for how long it had data to send."""

    path: str
    direction: str  # "a->b" | "b->a"
    delivered_bytes: int
    active_s: float
    capacity_bps: float
    rtt_s: float
    clean: bool

    @property
    def rate_bps(self) -> float | None:
        """Delivered payload bits per second while the path had data; None if it never had."""
        return self.delivered_bytes * 8 / self.active_s if self.active_s > 0 else None

    @property
    def judged(self) -> bool:
        """Long enough with data to send for its rate to say more than slow start does."""
        return self.active_s >= MIN_JUDGED_RTTS * self.rtt_s

    def to_dict(self) -> dict[str, Any]:
        rate = self.rate_bps
        return {"direction": self.direction, "delivered_bytes": self.delivered_bytes,
                "active_s": round(self.active_s, 4),
                "rate_bps": round(rate) if rate is not None else None,
                "capacity_bps": round(self.capacity_bps), "clean": self.clean}


def is_clean(spec: PathSpec, direction: str) -> bool:
    """No random or bursty loss in ``direction`` and no events on the timeline."""
    params = spec.forward if direction == "a->b" else spec.reverse
    return not spec.events and params.loss == 0 and params.burst_loss is None and not params.down


def delivery(spec: PathSpec, direction: str, delivered_bytes: int, active_s: float) -> Delivery:
    """``spec``'s delivery in ``direction`` (its capacity and RTT from the scenario at t = 0)."""
    params = spec.params_at(0.0, direction)
    return Delivery(spec.name, direction, int(delivered_bytes), float(active_s),
                    params.bandwidth_mbps * 1e6, params.rtt_ms / 1000.0, is_clean(spec, direction))


def suspect(deliveries: list[Delivery]) -> dict[str, str] | None:
    """``{"reason": ...}`` naming every clean path that delivered under half its capacity
    while it had data to send; None when there is none."""
    slow = []
    for d in deliveries:
        rate = d.rate_bps
        if d.clean and d.judged and rate is not None and rate < SUSPECT_FRACTION * d.capacity_bps:
            slow.append(f"{d.path} ({d.direction}, clean, {d.capacity_bps / 1e6:g} Mb/s) delivered "
                        f"{rate / 1e6:.1f} Mb/s over the {d.active_s:.1f} s it had data to send")
    if not slow:
        return None
    return {"reason": "; ".join(slow) + f": under {SUSPECT_FRACTION:g} x capacity on a clean path "
                                         "points at the harness, not the transport"}
