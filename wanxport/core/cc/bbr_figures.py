"""BBR's metrics as captured fields and the function that names them (``metrics_figures``).

A statistics snapshot asks every path's controller for its figures, and building
BBR's dict was about half of a path's share of a snapshot; the controller hands
over its fields as a tuple (``BbrCongestionController.metrics_figures``) and this
names them only when someone reads them (``core.stats``). Kept beside
``core.cc.bbr``: these are its private fields, in the order that method reads them.
"""

from __future__ import annotations

import math
from typing import Any


def named_figures(figures: tuple[Any, ...]) -> dict[str, float]:
    """BBR's metrics from its captured fields: the common three first, then the model's."""
    cwnd, pacing_rate, _, has_bw, max_bw, bw_cap, pacing_gain, cwnd_gain, round_count, min_rtt_s = figures
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
