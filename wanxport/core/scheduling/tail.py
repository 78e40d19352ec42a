"""The tail: the last round trip's worth of data, where a slow path's lateness shows.

While plenty of data remains, every path with room is kept busy and the order
of arrival does not matter: each path's share is set by its rate. Once the
bytes left fall below what the paths move in ``threshold_rtts`` of the longest
smoothed round trips, the transfer is *in the tail*. There the scheduler
water-fills: given the bytes left R, it finds the time T at which the paths,
starting in order of expected arrival, would together deliver R; a path whose
next packet would arrive after T is held back, so all paths run dry together
instead of a slow path delivering the last byte late.

The tail state is re-evaluated at most every ``recheck_s`` (or at once after
data was re-queued), not on every call: with hundreds of paths the
water-filling sort would dominate the sender's time.
"""

from __future__ import annotations

from wanxport.core.paths import Path
from wanxport.core.scheduling.order import expected_arrival


def water_fill_cutoff(paths: list[Path], now: float, remaining_bytes: int) -> float:
    """Latest expected arrival at which a path should still take new data.

    Paths are added in order of expected arrival; with the first k of them
    sending at their rates from their arrival times, the bytes are all
    delivered at (R + sum(rate_i * arrival_i)) / sum(rate_i). The first k
    whose finish comes before the next path's first arrival is the answer.
    """
    starts = sorted((expected_arrival(p, now), p.send_rate_Bps()) for p in paths)
    rate_sum = 0.0
    weighted = 0.0
    for i, (arrival, rate) in enumerate(starts):
        rate_sum += rate
        weighted += rate * arrival
        finish = (remaining_bytes + weighted) / rate_sum if rate_sum > 0 else float("inf")
        if i + 1 == len(starts) or finish <= starts[i + 1][0]:
            return finish
    return float("inf")


def tail_threshold_bytes(usable: list[Path], threshold_rtts: float) -> float:
    """Bytes the paths move in ``threshold_rtts`` of the longest round trips."""
    longest = max(p.rtt.smoothed_s for p in usable)
    return sum(p.send_rate_Bps() for p in usable) * longest * threshold_rtts


class Tail:
    """Whether the transfer is in its tail, and (with ``water_fill``) which paths wait there.

    ``water_fill=False`` keeps the tail's detection (other parts change their
    behaviour in the tail: stripes are given back, hedging starts) without
    holding any path back.
    """

    def __init__(self, recheck_s: float, *, water_fill: bool = True, threshold_rtts: float = 1.5) -> None:
        self.recheck_s = recheck_s
        self.water_fill = water_fill
        self.threshold_rtts = threshold_rtts
        self.in_tail = False
        self.cutoff = float("inf")
        self._checked_at = -1.0
        self._stale = True

    def due(self, now: float) -> bool:
        return self._stale or now >= self._checked_at + self.recheck_s

    def mark_stale(self) -> None:
        """Something changed the bytes left (data re-queued, a path held): look again soon."""
        self._stale = True

    def update(self, usable: list[Path], now: float, remaining_bytes: int) -> bool:
        """Re-evaluate; returns whether the transfer has just entered its tail."""
        self._checked_at = now
        self._stale = False
        was_in_tail = self.in_tail
        self.in_tail = bool(usable) and remaining_bytes < tail_threshold_bytes(usable, self.threshold_rtts)
        if self.water_fill and self.in_tail and remaining_bytes:
            self.cutoff = water_fill_cutoff(usable, now, remaining_bytes)
        else:
            self.cutoff = float("inf")
        return self.in_tail and not was_in_tail

    def holds(self, path: Path, now: float, remaining_bytes: int) -> bool:
        """Whether ``path`` should take no new data now: it would deliver after the cutoff."""
        return bool(remaining_bytes) and expected_arrival(path, now) > self.cutoff
