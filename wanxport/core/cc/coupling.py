"""BBR on links shared with other traffic (``bbr`` option ``shared = true``).

Two changes make a session take no more than one flow's share of a link
it shares: its paths are coupled, and its minimum RTT is held.

Coupling. A session whose k paths all cross the same link runs k controllers, and
k uncoupled BBR flows take k shares of that link from a neighbour
(``benchmarks/fairness.py``, ``2path-vs-cubic``). MPTCP's coupled controllers (RFC 6356 LIA, OLIA,
BALIA) cure this for window-growth controllers by sharing one increase
budget among subflows; BBR has no increase rule, so the budget shared here is
what gives BBR its share against other flows: how hard it probes (the 1.25
pacing phase) and how far its window over-fills the pipe (2 x BDP). A
coupled path keeps only its share w of each such gain's excess,

    gain_i = 1 + (gain - 1) * w_i,    w_i = bw_i / sum_j bw_j,

so the session's probing and over-fill sum to one flow's; so do the few
packets the window keeps beyond its target (3 core packets of 16 datagrams
each per path: next to a 200 KB BDP, two paths' extras alone were a flow's
worth). Gains below 1 (the 0.75 drain phase) stay whole: every path still
drains its queue, so a shared queue empties now and then and a session that
joined while it stood still finds the true base RTT (scaling the drain too
left two coupled sessions at 29 % / 71 % of a link). Paths that do not
share a bottleneck still fill their own links — the window stays above one
BDP and the probing phase still rises above 1 — only more slowly, which is
why this is an option for sessions whose paths share links, not the default
for disjoint provisioned paths.

Holding the min RTT. BBR's min-RTT filter expires after 10 s and then takes
the current sample. Next to a loss-based flow that keeps the buffer full,
that sample includes the neighbour's queue: the "base" RTT jumps, the window
(2 x bandwidth x min RTT) doubles, and since wanxport counts loss as
congestion only above a queue measured from that base, the losses stop
counting too: next to a CUBIC flow a session that had held half of a link
took most of it within seconds of the expiry (``benchmarks/fairness.py``,
``vs-cubic``). On shared links the lifetime minimum is
kept instead. The price: after a route change to a longer RTT the session
reads a standing queue, counts its random losses as congestion and runs
below its share — the safe failure next to other people's traffic.
"""

from __future__ import annotations

from collections.abc import Sequence

from wanxport.core.cc.base import CongestionController


def coupled_gain(gain: float, own_bps: float, group: Sequence[CongestionController] | None) -> float:
    """``gain`` reduced to this path's share of the group's bandwidth (``gain`` itself: no group)."""
    if group is None or len(group) < 2 or gain < 1.0:
        return gain
    total = sum(c.bandwidth_bps for c in group)
    if not total > 0.0:
        return gain
    return 1.0 + (gain - 1.0) * own_bps / total
