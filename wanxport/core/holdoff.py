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

A hold-off never outlasts the data it waits for. A message's last datagram
would otherwise wait up to a whole interval (2.5 ms on a 20 ms path, nearly
8 ms on a 62 ms one) after everything is in: per message, that is most of what
a small message's latency has beyond the path's. So after a held pass the next
hold-off ends when the open shards' missing bytes should have arrived at the
recent rate of arrival, and when no open shard lacks a byte, the next burst's
first wake holds only the configured floor: its pass learns the sizes, and the
hold-off after it ends with the burst.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.core.incoming import IncomingData
from wanxport.core.paths import Path
from wanxport.core.windowed_filter import RoundMaxFilter

HOLDOFF_RTT_RATIO = 8  # a path's smoothed RTT is at least this many hold-offs, or none
# After a pass found a socket pressed, the hold-off stays off this long: a flood or a burst
# larger than the socket buffer would otherwise fill it again while held.
HOLDOFF_YIELD_S = 0.5
# The arrival rate a hold-off's end is computed from: the largest of the last this many
# held passes' (bytes placed / time held). A pass whose hold began with a control datagram
# and whose data came later undersells the rate; the largest recent one does not.
ARRIVAL_RATE_PASSES = 8


class ReceiveHoldoff:
    """The hold-off a waking path waits out (``holdoff_s`` while ``holding``, else none)."""

    __slots__ = ("holdoff_s", "max_s", "interval_s", "next_s", "holding", "yields", "passes", "shortened",
                 "_paths", "_incoming", "_placed", "_rate", "_rate_samples", "_yield_until")

    def __init__(self, holdoff_s: float, incoming: IncomingData, paths: Sequence[Path] = (),
                 max_s: float | None = None) -> None:
        """``holdoff_s``: the shortest hold-off (0: none) but for one that ends with its data;
        ``incoming``: the session's incoming shards, whose missing bytes end it early;
        ``max_s``: the longest (default ``holdoff_s``: a fixed hold-off); ``paths``: the
        session's, whose smoothed RTTs bound it."""
        if not holdoff_s >= 0.0:
            raise ValueError(f"a receive hold-off must be >= 0 s, got {holdoff_s!r}")
        self.holdoff_s = holdoff_s
        self.max_s = holdoff_s if max_s is None else max(holdoff_s, max_s)
        self.interval_s = holdoff_s  # the control interval: recomputed after each pass
        self.next_s = holdoff_s  # the next hold-off: the interval, or less to end with the data
        self.holding = holdoff_s > 0.0  # no RTT sample yet: a receiver holds from the start
        self.yields = 0  # passes that found a socket pressed and turned the hold-off off
        self.passes = 0  # receive passes reported (one drain of one or more paths)
        self.shortened = 0  # hold-offs set to end with the data they wait for
        self._paths = paths
        self._incoming = incoming
        self._placed = 0  # ``incoming.placed_total`` at the last pass
        self._rate = RoundMaxFilter(ARRIVAL_RATE_PASSES)  # bytes/s placed while held
        self._rate_samples = 0
        self._yield_until = 0.0

    def shortest_srtt_s(self) -> float:
        """The smallest smoothed RTT among the paths measured so far (inf before any)."""
        return min((p.rtt.smoothed_s for p in self._paths if p.rtt.has_sample), default=float("inf"))

    def after_pass(self, now: float, pressed: bool, held_s: float = 0.0) -> None:
        """A receive pass ended at ``now``; ``pressed``: a socket it drained was full;
        ``held_s``: how long it was held (what it drained arrived within that time).

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
        self.next_s = self._until_the_data(held_s)

    def _until_the_data(self, held_s: float) -> float:
        """The next hold-off: the interval, or less where the open shards should be complete
        sooner at the recent arrival rate; the floor when none lacks a byte, or while no
        rate is known (the next pass measures one)."""
        placed = self._incoming.placed_total
        arrived, self._placed = placed - self._placed, placed
        # Only a pass held at least the floor: what a shorter one drains had partly waited
        # in the socket before its wake, and would oversell the rate.
        if held_s >= self.holdoff_s and arrived > 0:
            self._rate_samples += 1
            self._rate.update(self._rate_samples, arrived / held_s)
        rate, interval = self._rate.value, self.interval_s
        limit = rate * interval
        missing = self._incoming.missing_bytes(int(limit) + 1)
        if missing == 0 or rate == 0.0:
            return self.holdoff_s  # never above the interval, which starts there and only grows
        if missing < limit:
            self.shortened += 1
            return missing / rate
        return interval

    def wait_s(self) -> float:
        """How long a path that wakes now waits before it is drained (0.0: drain at once)."""
        return self.next_s if self.holding else 0.0
