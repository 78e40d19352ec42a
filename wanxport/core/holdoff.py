"""Receive coalescing policy: whether a path that wakes now waits before it is drained, and how long.

Like a NIC's interrupt moderation: the first datagram arms a hold-off and
whatever arrives on any path until it ends is handed to the session in one
pass, so the per-wake costs are paid once per hold-off instead of once per
datagram or two. The hold-off is the session's control interval: at least the
configured one, growing to 1/HOLDOFF_RTT_RATIO of the shortest smoothed RTT and
never past the ACK delay the protocol allows. The session then runs once per
interval whatever the packet rate (a path of 100 Mb/s and 60 ms hands it ~60
datagrams a pass instead of 7-8), its acknowledgements leave once per interval
(a pass owes the ACK of everything it held), and the peer's loop hears them at
that cadence too. It adds at most one interval to a round trip, so the decision
belongs with the round-trip estimates, here in the core, where the simulator
runs it too; the driver only holds and drains (``aio.intake``, ``sim.runner``).
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.core.paths import Path

HOLDOFF_RTT_RATIO = 8  # a path's smoothed RTT is at least this many hold-offs, or none
# After a pass found a socket pressed, the hold-off stays off this long: a flood or a burst
# larger than the socket buffer would otherwise fill it again while held.
HOLDOFF_YIELD_S = 0.5


class ReceiveHoldoff:
    """The hold-off a waking path waits out (``holdoff_s`` while ``holding``, else none)."""

    __slots__ = ("holdoff_s", "max_s", "interval_s", "holding", "yields", "passes", "_paths", "_yield_until")

    def __init__(self, holdoff_s: float, paths: Sequence[Path] = (), max_s: float | None = None) -> None:
        """``holdoff_s``: the shortest hold-off (0: none); ``max_s``: the longest (default
        ``holdoff_s``: a fixed hold-off); ``paths``: the session's, whose smoothed RTTs bound it."""
        if not holdoff_s >= 0.0:
            raise ValueError(f"a receive hold-off must be >= 0 s, got {holdoff_s!r}")
        self.holdoff_s = holdoff_s
        self.max_s = holdoff_s if max_s is None else max(holdoff_s, max_s)
        self.interval_s = holdoff_s  # the hold-off while holding: recomputed after each pass
        self.holding = holdoff_s > 0.0  # no RTT sample yet: a receiver holds from the start
        self.yields = 0  # passes that found a socket pressed and turned the hold-off off
        self.passes = 0  # receive passes reported (one drain of one or more paths)
        self._paths = paths
        self._yield_until = 0.0

    def shortest_srtt_s(self) -> float:
        """The smallest smoothed RTT among the paths measured so far (inf before any)."""
        return min((p.rtt.smoothed_s for p in self._paths if p.rtt.has_sample), default=float("inf"))

    def after_pass(self, now: float, pressed: bool) -> None:
        """A receive pass ended at ``now``; ``pressed``: a socket it drained was full.

        Hold only while the hold-off is at most 1/HOLDOFF_RTT_RATIO of every measured
        path's smoothed RTT (paths not yet measured do not count): a WAN path's
        acknowledgements then come a few per cent later, while a sub-millisecond path
        (a LAN, loopback) would see its round trip multiplied and gain nothing (its
        wakes find full batches already). And not for HOLDOFF_YIELD_S after a pass found
        a socket pressed: a socket that fills while held drops datagrams (under a
        datagram flood a 1 ms hold-off halved a transfer's goodput), and a wake that
        finds a full batch has nothing left to coalesce.
        """
        self.passes += 1
        if self.holdoff_s <= 0.0:
            return
        if pressed:
            self.yields += 1
            self._yield_until = now + HOLDOFF_YIELD_S
        shortest = self.shortest_srtt_s()
        self.holding = now >= self._yield_until and shortest >= self.holdoff_s * HOLDOFF_RTT_RATIO
        if shortest < float("inf"):
            self.interval_s = min(max(self.holdoff_s, shortest / HOLDOFF_RTT_RATIO), self.max_s)

    def wait_s(self) -> float:
        """How long a path that wakes now waits before it is drained (0.0: drain at once)."""
        return self.interval_s if self.holding else 0.0
