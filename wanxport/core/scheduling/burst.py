"""Small messages: the whole message goes at once, on the one path that lands it first.

A pipeline's activation or a point-to-point message of 64 KiB is a few core
packets, sent when the path has been idle for a while. Pacing it at the
controller's rate is pacing it at a rate learnt from such messages: a flight
of S bytes can never show a delivery rate above S / RTT, so on a 20 ms,
120 Mb/s route the estimate settled near 1.5 MB/s, 64 KiB took 44 ms to leave
at that pace, and the tail's water-filling (trusting the same rate) put a
third of every message on a 55 ms route. The message arrived after 38 ms in
the simulator where TCP, which sends a window's worth at the line rate, takes
14 ms.

So, as TCP does with its window, a message that fits in a path's congestion
window is sent as one burst: when the bytes waiting and the bytes in flight on
every path together are at most ``BURST_MAX_BYTES`` (small messages, not the
tail of a large transfer), none of them is a retransmission (a loss may mean a
full queue) and the waiting ones fit the window room of a path that is idle (or
already carrying such a burst), that path takes them all, paced at a whole
window per ``BURST_SPAN_RTT`` of its minimum RTT (the bottleneck's queue, which
the window bounds, spreads them at its own rate). The path is the one whose
propagation delay (half its recent minimum RTT) lands the message first; a busy
path that would still land sooner keeps the ordinary schedule. A path keeps its
burst pace while the session's messages stay small (its datagrams may still wait
in the data path's pacer) and drops it as soon as a large transfer or a
retransmission is waiting: large transfers never burst, so their pacing, order
and tail are unchanged.
"""

from __future__ import annotations

from wanxport.core.paths import Path
from wanxport.core.scheduling.order import expected_arrival

#: The most bytes waiting that are sent as one burst (a window bounds it too).
BURST_MAX_BYTES = 256 << 10
#: A burst's window leaves within this share of the path's minimum RTT.
BURST_SPAN_RTT = 0.125
#: The shortest span a burst's window is paced over (a loopback path's RTT is microseconds).
BURST_MIN_SPAN_S = 1e-5


def burst_arrival(path: Path, now: float) -> float:
    """When a burst handed to ``path`` now lands: its departure plus its propagation delay."""
    return max(now, path.next_send_at) + path.rtt.min_recent_s / 2


def can_burst(path: Path, waiting_bytes: int) -> bool:
    """``path`` may take all ``waiting_bytes`` as one burst: usable, idle (less than a packet in
    flight: a shard's announcement may be) or already bursting, and the bytes fit its window room."""
    return (path.usable and waiting_bytes <= path.cwnd_space
            and (path.burst_rate_bps > 0.0 or path.bytes_in_flight < path.mss))


def small_messages(paths: list[Path], waiting_bytes: int) -> bool:
    """Whether the ``waiting_bytes`` and every path's bytes in flight together are small
    (at most ``BURST_MAX_BYTES``): a few small messages, not a large transfer or its tail."""
    return waiting_bytes + sum(p.bytes_in_flight for p in paths) <= BURST_MAX_BYTES


def burst_path(ready: list[Path], paths: list[Path], now: float, waiting_bytes: int) -> Path | None:
    """The path of ``ready`` that takes the ``waiting_bytes`` as one burst, or None: the ordinary
    schedule. ``paths``: all the session's (their bytes in flight count toward the bound)."""
    if waiting_bytes <= 0 or not small_messages(paths, waiting_bytes):
        return None
    best: Path | None = None
    best_at = float("inf")
    for path in ready:
        if can_burst(path, waiting_bytes):
            at = burst_arrival(path, now)
            if at < best_at:
                best, best_at = path, at
    if best is None:
        return None
    for path in ready:
        if path is not best and not can_burst(path, waiting_bytes) and expected_arrival(path, now) < best_at:
            return None  # a busy path lands it sooner: the ordinary schedule decides
    return best


def burst_rate_bps(path: Path) -> float:
    """The pace of a burst on ``path``: its whole window within ``BURST_SPAN_RTT`` of its min RTT."""
    span = max(path.rtt.min_s * BURST_SPAN_RTT, BURST_MIN_SPAN_S)
    return path.cc.cwnd_bytes * 8.0 / span
