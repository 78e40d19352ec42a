"""Site-to-site capacity of a scenario's mesh: per-direction rates and max-flow through relays.

Why: between N sites a pair's best rate is not only its direct paths; a route
through a third site adds whatever the cut between the two allows. The ideal
bounds (``wanxport.scenario.ideal``) and anything that plans routes through
the mesh need the same numbers, computed the same way: a path's rate in one
direction is bandwidth x (1 - loss) of the parameters in force, 0 while down
(DESIGN.md section 4).
"""

from __future__ import annotations

from collections import deque

from wanxport.scenario.model import PathSpec, Scenario


def path_rate_Bps(spec: PathSpec, src: str, at_s: float = 0.0) -> float:
    """Payload bytes per second ``spec`` can carry leaving site ``src`` at ``at_s`` (events applied)."""
    params = spec.params_at(at_s, spec.direction_from(src))
    if params.down:
        return 0.0
    return params.bandwidth_mbps * 1e6 / 8.0 * (1.0 - params.effective_loss)


def capacities_Bps(scenario: Scenario, at_s: float = 0.0) -> dict[tuple[str, str], float]:
    """(from site, to site) -> summed rate of the direct paths in that direction.

    Pairs with no direct path are absent.
    """
    caps: dict[tuple[str, str], float] = {}
    for spec in scenario.paths:
        one, other = spec.between
        caps[(one, other)] = caps.get((one, other), 0.0) + path_rate_Bps(spec, one, at_s)
        caps[(other, one)] = caps.get((other, one), 0.0) + path_rate_Bps(spec, other, at_s)
    return caps


def egress_ingress_Bps(scenario: Scenario, site: str, at_s: float = 0.0) -> tuple[float, float]:
    """Summed rate of the paths touching ``site``: leaving it, and arriving at it."""
    caps = capacities_Bps(scenario, at_s)
    egress = sum(rate for (one, _), rate in caps.items() if one == site)
    ingress = sum(rate for (_, other), rate in caps.items() if other == site)
    return egress, ingress


def max_flow_Bps(scenario: Scenario, src: str, dst: str, at_s: float = 0.0, direct: bool = True) -> float:
    """Largest rate from ``src`` to ``dst`` over all routes (relaying at other sites) at ``at_s``.

    ``direct=False`` leaves out the paths joining the two directly: what relaying
    adds on top of them (every direct path crosses every cut between the two, so
    the max-flow is exactly the direct rate plus this).
    """
    for site in (src, dst):
        if site not in scenario.sites:
            raise ValueError(f"unknown site {site!r}; sites: {', '.join(scenario.sites)}")
    if src == dst:
        raise ValueError(f"a flow needs two different sites, got {src!r} twice")
    residual = capacities_Bps(scenario, at_s)
    if not direct:
        residual.pop((src, dst), None)
    neighbours: dict[str, list[str]] = {site: [] for site in scenario.sites}
    for one, other in residual:
        neighbours[one].append(other)
        neighbours.setdefault(other, [])
    total = 0.0
    floor = 1e-12 * max(residual.values(), default=0.0)  # below this a residual is rounding, not capacity
    while True:
        parent = _augmenting_route(residual, neighbours, src, dst, floor)
        if parent is None:
            return total
        route: list[tuple[str, str]] = []
        node = dst
        while node != src:
            route.append((parent[node], node))
            node = parent[node]
        push = min(residual[edge] for edge in route)
        for one, other in route:
            residual[(one, other)] -= push
            residual[(other, one)] = residual.get((other, one), 0.0) + push
            if one not in neighbours[other]:
                neighbours[other].append(one)
        total += push


def _augmenting_route(residual: dict[tuple[str, str], float], neighbours: dict[str, list[str]],
                      src: str, dst: str, floor: float) -> dict[str, str] | None:
    """Breadth-first: each reached site's predecessor on a shortest route with spare capacity, or None."""
    parent: dict[str, str] = {}
    queue = deque([src])
    while queue:
        node = queue.popleft()
        for nxt in neighbours[node]:
            if nxt != src and nxt not in parent and residual.get((node, nxt), 0.0) > floor:
                parent[nxt] = node
                if nxt == dst:
                    return parent
                queue.append(nxt)
    return None


def relay_delay_s(scenario: Scenario, src: str, dst: str, direct: bool = False) -> float:
    """The smallest one-way delay from ``src`` to ``dst`` over routes through other sites (inf if none).

    A hop's delay is half the smallest ``rtt_ms`` at the start among the
    paths joining its two sites in that direction; ``direct=True`` also
    admits the one-hop route.
    """
    hop: dict[tuple[str, str], float] = {}
    for spec in scenario.paths:
        for one in spec.between:
            other = spec.between[1] if one == spec.between[0] else spec.between[0]
            delay = spec.params_at(0.0, spec.direction_from(one)).rtt_ms / 2000.0
            hop[(one, other)] = min(delay, hop.get((one, other), delay))
    if not direct:
        hop.pop((src, dst), None)
    best = {site: float("inf") for site in scenario.sites}
    best[src] = 0.0
    unsettled = set(scenario.sites)
    while unsettled:
        node = min(unsettled, key=lambda site: best[site])
        unsettled.discard(node)
        for (one, other), delay in hop.items():
            if one == node and best[node] + delay < best[other]:
                best[other] = best[node] + delay
    return best[dst]
