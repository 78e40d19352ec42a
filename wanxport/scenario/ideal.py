"""The ideal completion times of DESIGN.md section 4: a transfer, and an all-reduce among the sites.

Every run report divides a bound by the measured completion time, so each is
computed exactly as the contract says, the same for the simulator and for
real emulation. A transfer's ideal is

    smallest T with  sum_i integral_0^(T - d_i) (bw_i(t)/8) (1 - loss_i(t)) up_i(t) dt >= B

over the paths joining its two sites. Each path's delivery rate is piecewise
constant (it changes only at events), so the left side is a piecewise-linear,
non-decreasing function of T with breakpoints at d_i + event time. We sweep
the breakpoints in order and solve the linear piece that crosses B: exact, no
numeric stepping.

Between N sites a pair may also be reached through other sites; the relayed
bound (``pair_ideal_time_s`` with ``relay=True``) adds one more term of the
same shape: the max-flow through the other sites (``wanxport.scenario.flow``)
arriving after the smallest relayed one-way delay.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from wanxport.scenario.flow import egress_ingress_Bps, max_flow_Bps, path_rate_Bps, relay_delay_s
from wanxport.scenario.model import Scenario

#: One source of delivered bytes: its delay, and its rate from each time on (ascending times, first 0).
_Source = tuple[float, Sequence[tuple[float, float]]]


def _earliest(sources: Sequence[_Source], size_bytes: int) -> float:
    # Breakpoints: (arrival-side time, source index, rate from then on). A source
    # contributes nothing before its delay, then each timeline segment's rate shifted by it.
    changes = sorted(((delay + at_s, i, rate) for i, (delay, timeline) in enumerate(sources)
                      for at_s, rate in timeline), key=lambda c: c[0])
    rates = [0.0] * len(sources)
    total_rate = 0.0
    delivered = 0.0
    now = 0.0
    index = 0
    while index < len(changes):
        at = changes[index][0]
        if total_rate > 0 and delivered + total_rate * (at - now) >= size_bytes:
            return now + (size_bytes - delivered) / total_rate
        delivered += total_rate * (at - now)
        now = at
        while index < len(changes) and changes[index][0] == at:
            rates[changes[index][1]] = changes[index][2]
            index += 1
        total_rate = math.fsum(rates)  # exact re-sum: no drift over many breakpoints
    if total_rate <= 0:
        return math.inf
    return now + (size_bytes - delivered) / total_rate


def _direct_sources(scenario: Scenario, src: str, dst: str) -> list[_Source]:
    sources: list[_Source] = []
    for spec in scenario.paths_between(src, dst):
        delay_s = spec.params_at(0.0, spec.direction_from(src)).rtt_ms / 2000.0
        timeline = [(at_s, path_rate_Bps(spec, src, at_s)) for at_s in (0.0, *spec.change_times())]
        sources.append((delay_s, timeline))
    return sources


def _relay_source(scenario: Scenario, src: str, dst: str) -> list[_Source]:
    delay_s = relay_delay_s(scenario, src, dst)
    if math.isinf(delay_s):
        return []
    times = sorted({0.0, *(at for spec in scenario.paths for at in spec.change_times())})
    return [(delay_s, [(at_s, max_flow_Bps(scenario, src, dst, at_s, direct=False)) for at_s in times])]


def _check_sites(scenario: Scenario, src: str, dst: str) -> None:
    for site in (src, dst):
        if site not in scenario.sites:
            raise ValueError(f"unknown site {site!r}; sites: {', '.join(scenario.sites)}")
    if src == dst:
        raise ValueError(f"a transfer needs two different sites, got {src!r} twice")


def pair_ideal_time_s(scenario: Scenario, src: str, dst: str, size_bytes: int, relay: bool = False) -> float:
    """Ideal seconds to move ``size_bytes`` from site ``src`` to ``dst`` (``math.inf``: never all arrive).

    ``relay=False``: the section-4 bound over the paths joining the two
    directly (what a transfer on those paths can reach; inf when there are
    none). ``relay=True``: the network's bound, adding routes through the
    other sites (their max-flow, after the smallest relayed one-way delay).
    """
    _check_sites(scenario, src, dst)
    if size_bytes <= 0:
        return 0.0
    sources = _direct_sources(scenario, src, dst)
    if relay:
        sources += _relay_source(scenario, src, dst)
    return _earliest(sources, size_bytes)


def relayed_ideal_time_s(scenario: Scenario, src: str, dst: str, size_bytes: int,
                         direction: str = "a->b") -> float:
    """The network's bound for a transfer between two sites, relaying allowed (``pair_ideal_time_s``).

    ``direction`` as for ``ideal_time_s``, with ``src`` as the first site:
    "both" is the larger of the two ways.
    """
    forward = pair_ideal_time_s(scenario, src, dst, size_bytes, relay=True)
    if direction == "a->b":
        return forward
    backward = pair_ideal_time_s(scenario, dst, src, size_bytes, relay=True)
    return backward if direction == "b->a" else max(forward, backward)


def ideal_time_s(scenario: Scenario, size_bytes: int | None = None, direction: str | None = None) -> float:
    """Ideal seconds of the scenario's transfer; ``math.inf`` if the bytes can never all arrive.

    ``size_bytes`` and ``direction`` default to the scenario's ``[transfer]``.
    ``direction`` is "a->b" (from the transfer's first site to its second:
    ``a`` to ``b`` in a v1 file), "b->a" or "both" (the larger of the two
    one-way ideals; each side sends ``size_bytes``, the b->a one over the
    ``reverse`` parameters). Only the paths joining the two sites count.
    """
    size = scenario.transfer.size_bytes if size_bytes is None else size_bytes
    which = scenario.transfer.direction if direction is None else direction
    if which not in ("a->b", "b->a", "both"):
        raise ValueError(f"direction must be 'a->b', 'b->a' or 'both', got {which!r}")
    if size <= 0:
        return 0.0
    first, second = scenario.transfer_pair
    forward = _earliest(_direct_sources(scenario, first, second), size)
    if which == "a->b":
        return forward
    backward = _earliest(_direct_sources(scenario, second, first), size)
    return backward if which == "b->a" else max(forward, backward)


def allreduce_ideal_time_s(scenario: Scenario, size_bytes: int) -> float:
    """The all-reduce bound of section 4 for ``size_bytes`` per site among all the scenario's sites.

    Two sites: the ``direction = "both"`` ideal between them. N sites: every
    site sends and receives at least 2·S·(N−1)/N bytes over the paths touching
    it, so the bound is the largest such share over min(egress, ingress), plus
    the smallest one-way delay of any path. Rates and delays are those in force
    at the start (bandwidth x (1 - loss), 0 while down); ``math.inf`` when some
    site has no capacity.
    """
    if size_bytes <= 0:
        return 0.0
    sites = scenario.sites
    if len(sites) == 2:
        return max(_earliest(_direct_sources(scenario, sites[0], sites[1]), size_bytes),
                   _earliest(_direct_sources(scenario, sites[1], sites[0]), size_bytes))
    share = 2.0 * size_bytes * (len(sites) - 1) / len(sites)
    slowest = 0.0
    for site in sites:
        rate = min(egress_ingress_Bps(scenario, site))
        if rate <= 0.0:
            return math.inf
        slowest = max(slowest, share / rate)
    delays = [spec.params_at(0.0, direction).rtt_ms / 2000.0 for spec in scenario.paths
              for direction in ("a->b", "b->a") if not spec.params_at(0.0, direction).down]
    return slowest + min(delays)
