"""How much data a path's core packets carry: more on fast paths, so per-packet work shrinks per byte.

The core's work is per core packet (numbering, the sent-packet record, the ACK
that covers it, the controller's update) and costs tens of microseconds of
Python at each end whatever the packet holds. A packet sized for a 100 Mb/s
route is 0.2 ms of a 6 Gb/s host's traffic, so on fast paths that work, not
the bytes, bounded the host. A path's packet therefore
grows, in powers of two of the configured one (``SessionConfig.chunk_bytes``),
while its measured bandwidth fills it within ``budget_s``; it never grows in
Startup, where the rate is still a guess, and it shrinks back when the
bandwidth falls to less than half of what the packet needs (hysteresis, so a
rate sample near a boundary does not flip it every ACK). Nor does it grow on a
lossy path: there a packet of f times the size is hit by a loss f times as
often, and each hit is a lost packet to the controllers and the loss detector
(on validate-3path's 0.5 %-loss 200 Mb/s path, fourfold packets cost 1.7 % of
the simulated efficiency). Congestion control still counts bytes, and a grown
packet's round trip is measured as a configured-size packet's would be
(``Transmitter._sample_from``), so a larger packet does not read as a longer path.
"""

from __future__ import annotations

#: A grown packet may be hit by a loss about this often at most: growth f needs f times the
#: path's share of lost packets (at the sizes it used so far) to stay below it.
MAX_GROWN_LOSS = 0.02


class PacketSizer:
    """One path's core packet size: ``base`` bytes times a power of two up to ``max_factor``."""

    __slots__ = ("base", "budget_s", "max_factor", "factor")

    def __init__(self, base: int, budget_s: float, max_factor: int) -> None:
        self.base = base
        self.budget_s = budget_s
        self.max_factor = max_factor
        self.factor = 1

    @property
    def packet_bytes(self) -> int:
        return self.base * self.factor

    def update(self, bandwidth_bps: float, in_startup: bool, loss_ratio: float) -> int:
        """Resize for the path's bandwidth estimate and its share of lost packets (spurious
        losses left out); return the packet's data bytes."""
        if in_startup or bandwidth_bps <= 0.0:
            self.factor = 1
            return self.packet_bytes
        fits = bandwidth_bps / 8.0 * self.budget_s / self.base  # packets of base size within the budget
        most = self.max_factor
        while most > 1 and most * loss_ratio > MAX_GROWN_LOSS:
            most //= 2
        factor = self.factor
        while factor < most and fits >= 2 * factor:
            factor *= 2
        while factor > 1 and (fits < factor / 2 or factor > most):
            factor //= 2
        self.factor = factor
        return self.packet_bytes
