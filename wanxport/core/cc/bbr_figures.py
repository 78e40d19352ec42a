"""BBR's metrics as captured fields and the function that names them (``metrics_figures``).

A statistics snapshot asks every path's controller for its figures, and building
BBR's dict was about half of a path's share of a snapshot; capturing them in one
C-level ``attrgetter`` call and naming them only when someone reads them
(``core.stats``) leaves the capture. Kept beside ``core.cc.bbr``: these are its
private fields.
"""

from __future__ import annotations

import math
from operator import attrgetter
from typing import Any

#: The fields ``metrics()`` reports, captured in one C-level call (``metrics_figures``).
capture_figures = attrgetter("_cwnd", "_pacing_rate", "_has_bw", "_bw_filter.value", "_bw_cap",
                             "_pacing_gain", "_cwnd_gain", "_round_count", "_min_rtt_s")


def named_figures(figures: tuple[Any, ...]) -> dict[str, float]:
    """BBR's metrics from its captured fields: the common three first, then the model's."""
    cwnd, pacing_rate, has_bw, max_bw, bw_cap, pacing_gain, cwnd_gain, round_count, min_rtt_s = figures
    named = {
        "cwnd_bytes": float(cwnd),
        "pacing_rate_bps": pacing_rate,
        "bandwidth_bps": min(max_bw, bw_cap) if has_bw else pacing_rate,  # as ``bandwidth_bps``
        "max_bw_bps": max_bw,
        "pacing_gain": pacing_gain,
        "cwnd_gain": cwnd_gain,
        "round_count": float(round_count),
    }
    if bw_cap < math.inf:
        named["bw_cap_bps"] = bw_cap
    if min_rtt_s < math.inf:
        named["min_rtt_s"] = min_rtt_s
    return named
