"""How a striped collective splits one array over several routes: in proportion to capacity.

A careful operator without a multipath transport stripes: one process group per
route, each route given the share of the array it can carry in the same time, all
stripes in flight together, so every route finishes at about the same moment.
Shares are whole elements (largest remainder), sum to the array's length, and no
route with capacity is left without a stripe (an idle route is capacity thrown
away); a route without capacity (down, or all loss) gets nothing.
"""

from __future__ import annotations

import math

from wanxport.scenario import Scenario


def route_capacity_bps(scenario: Scenario, index: int) -> float:
    """What route ``index`` delivers per second at t = 0, the lesser of its two directions:
    bandwidth x (1 - loss), nothing while down (docs/design.md section 4's rate)."""
    rates = []
    for direction in ("a->b", "b->a"):
        params = scenario.paths[index].params_at(0.0, direction)
        rates.append(0.0 if params.down else params.bandwidth_mbps * 1e6 * (1.0 - params.effective_loss))
    return min(rates)


def capacity_split(count: int, capacities: list[float]) -> list[tuple[int, int]]:
    """(offset, length) per route: contiguous, tiling [0, count), lengths in proportion to
    ``capacities``; ValueError (one line) for capacities that cannot split anything."""
    if count < 0:
        raise ValueError(f"cannot split {count} elements")
    if not capacities or any(not math.isfinite(c) or c < 0 for c in capacities):
        raise ValueError(f"capacities must be finite and >= 0, got {capacities}")
    total = sum(capacities)
    if total <= 0:
        raise ValueError("no route has capacity: nothing can carry a stripe")
    exact = [count * c / total for c in capacities]
    lengths = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(capacities)), key=lambda k: (lengths[k] - exact[k], k))
    for k in by_remainder[:count - sum(lengths)]:
        lengths[k] += 1
    # A route with capacity but a share below one element still gets one, from the longest.
    for k, c in enumerate(capacities):
        if c > 0 and lengths[k] == 0 and count >= sum(1 for x in capacities if x > 0):
            lengths[max(range(len(lengths)), key=lambda j: lengths[j])] -= 1
            lengths[k] = 1
    out, offset = [], 0
    for length in lengths:
        out.append((offset, length))
        offset += length
    return out
