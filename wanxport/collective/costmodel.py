"""Predicted time of an all-reduce schedule from per-pair rates and delays, and the choice.

Pure and deterministic: every site that evaluates the same ``Mesh`` for the same call
gets the same plan, which is what lets one site's measurements (the decider's, sent
to everyone) fix the schedule without a vote.

The model: each directed pair (i -> j) is a FIFO link of ``rate[i][j]`` bytes per
second and ``delay[i][j]`` seconds one way; pairs are independent (each pair of
sites has its own session over its own paths). A site sends a part's partial sum
to its parent once its children's have arrived; the owner sends the total back
down once every child has reported. The predicted time is the last arrival. It
ignores CPU time and treats a session's paths as one pipe: it ranks schedules, it
does not promise a time.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .schedule import (
    NO_PARENT,
    SCHEDULES,
    Plan,
    Tree,
    direct,
    full_mesh,
    nearest_tree,
    ring,
    ring_orders,
    with_parent,
)

NO_SESSION = -1.0  # a rate below zero: the pair has no session
MARGIN = 0.1  # another schedule replaces the baseline only when predicted this much faster
CHUNK_BYTES = 1 << 20  # a relayed or chained part travels in pieces of about this size ...
MAX_CHUNKS = 8  # ... at most this many per part ...
EVERY_PAIR_UP_TO = 4  # up to this many sites every pair may be relayed; beyond, only thin ones (time)
PART_LIMIT = 127  # ... and at most this many parts in all (a part's two phases fit the header's byte)
Wire = Callable[[int], int]  # elements -> bytes of the message that carries them


@dataclass(frozen=True)
class Mesh:
    """``rate[i][j]``: bytes/s from i to j (0: not measured yet; below 0: no session);
    ``delay[i][j]``: one-way seconds (0 when not measured)."""

    rate: tuple[tuple[float, ...], ...]
    delay: tuple[tuple[float, ...], ...]

    @property
    def n(self) -> int:
        return len(self.rate)

    @property
    def links(self) -> list[list[bool]]:
        return [[i != j and self.rate[i][j] >= 0 and self.rate[j][i] >= 0 for j in range(self.n)]
                for i in range(self.n)]

    def measured(self) -> bool:
        """Every pair with a session measured, at least one way (a schedule may leave one
        direction of a pair idle: its estimate then comes from the other)."""
        links = self.links
        return all(max(self.rate[i][j], self.rate[j][i]) > 0
                   for i in range(self.n) for j in range(self.n) if links[i][j])

    def filled(self) -> Mesh:
        """An unmeasured direction at the pair's other direction's rate, else at the mean
        measured rate (1 byte/s when none is measured): a mesh the model can rank, where
        only the topology is known."""
        links = self.links
        known = [self.rate[i][j] for i in range(self.n) for j in range(self.n)
                 if links[i][j] and self.rate[i][j] > 0]
        fill = sum(known) / len(known) if known else 1.0
        rate = tuple(tuple(r if not links[i][j] or r > 0 else self.rate[j][i] if self.rate[j][i] > 0 else fill
                           for j, r in enumerate(row)) for i, row in enumerate(self.rate))
        return Mesh(rate, self.delay)


def part_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """The element range [start, end) of each of ``n`` parts of a ``count``-element array."""
    return [(k * count // n, (k + 1) * count // n) for k in range(n)]


def predict(plan: Plan, mesh: Mesh, count: int, wire: Wire) -> float:
    """Seconds from every site's start to the last site holding the result (inf when the
    plan uses a pair without a session)."""
    n = mesh.n
    free: dict[tuple[int, int], float] = {}
    heap: list[tuple[float, int, int, int, int, bool]] = []
    sizes = [wire(b - a) for a, b in part_bounds(count, plan.parts)]
    kids = [[t.children(s) for s in range(n)] for t in plan.trees]
    waiting = [[len(kids[k][s]) for s in range(n)] for k in range(plan.parts)]
    ready = [[0.0] * n for _ in plan.trees]
    order = 0
    for k, tree in enumerate(plan.trees):
        for site, parent in tree.edges():
            if not kids[k][site]:
                heap.append((0.0, order, site, parent, k, False))
                order += 1
    heapq.heapify(heap)
    last = 0.0
    while heap:
        at, _, src, dst, k, down = heapq.heappop(heap)
        rate = mesh.rate[src][dst]
        if rate <= 0:
            return float("inf")
        start = max(at, free.get((src, dst), 0.0))
        free[(src, dst)] = start + sizes[k] / rate
        arrive = free[(src, dst)] + mesh.delay[src][dst]
        last = max(last, arrive)
        tree = plan.trees[k]
        if down:
            targets = kids[k][dst]
        else:
            ready[k][dst] = max(ready[k][dst], arrive)
            waiting[k][dst] -= 1
            if waiting[k][dst]:
                continue
            arrive = ready[k][dst]
            targets = kids[k][dst] if tree.parent[dst] < 0 else [tree.parent[dst]]
        for target in targets:
            heapq.heappush(heap, (arrive, order, dst, target, k, down or tree.parent[dst] < 0))
            order += 1
    return last


def chunks_for(n: int, count: int, wire: Wire) -> int:
    """Pieces per part for schedules with relays or chains: about ``CHUNK_BYTES`` each, so a
    site forwards a piece while the next one arrives."""
    return max(1, min(MAX_CHUNKS, PART_LIMIT // n, wire(count) // (n * CHUNK_BYTES)))


def relay_plan(mesh: Mesh, count: int, wire: Wire, force: bool = False, chunks: int = 1) -> Plan:
    """Stars on each owner (``chunks`` pieces of its part, each with its own tree), with a site
    hung under a third site in a piece's tree where that is predicted faster (no slower for
    pairs thinner than half the fattest; the thinnest pairs first; a share can go part
    direct, part relayed), or
    where it has no session with the owner (then under its first hop on a fewest-hop route).
    ``force``: at least one share relayed (the least harmful one)."""
    n, links = mesh.n, mesh.links
    hops = [[1.0 if links[i][j] else 0.0 for j in range(n)] for i in range(n)]
    trees = []
    for owner in range(n):
        near = nearest_tree(owner, hops, links).parent
        trees.append(Tree(tuple(NO_PARENT if s == owner else owner if links[s][owner] else near[s]
                                for s in range(n))))
    plan = Plan("relay", tuple(trees)).chunked(chunks)
    best = predict(plan, mesh, count, wire)

    def thin(s: int, o: int) -> float:
        return min(mesh.rate[s][o], mesh.rate[o][s])

    top = max(thin(s, o) for s in range(n) for o in range(n) if links[s][o])
    pairs = sorted((thin(s, o), s, o) for o in range(n) for s in range(n)
                   if links[s][o] and (force or n <= EVERY_PAIR_UP_TO or thin(s, o) < top / 2))
    forced: tuple[float, Plan] | None = None
    moves = [(site, part, plan.trees[part].root) for _, site, owner in pairs
             for part in range(owner * chunks, (owner + 1) * chunks)]
    for site, part, owner in moves:
        for via in range(n):
            if via in (site, owner) or not links[site][via] or plan.trees[part].parent[via] != owner:
                continue
            candidate = with_parent(plan, part, site, via)
            time = predict(candidate, mesh, count, wire)
            if time < best or time == best and thin(site, owner) < top / 2:
                plan, best = candidate, time  # a tie counts on a thin pair: its two shares need two moves
            elif forced is None or time < forced[0]:
                forced = (time, candidate)
    if force and not plan.relayed() and forced is not None:
        plan = forced[1]
    return plan


def candidates(mesh: Mesh, count: int, wire: Wire, kind: str = "auto") -> dict[str, Plan]:
    """The best plan of each kind the mesh allows (only ``kind`` unless it is "auto")."""
    n, links = mesh.n, mesh.links
    want = SCHEDULES if kind == "auto" else (kind,)
    chunks = chunks_for(n, count, wire)
    out: dict[str, Plan] = {}
    if "direct" in want and full_mesh(links):
        out["direct"] = direct(n)
    if "relay" in want:
        plan = relay_plan(mesh, count, wire, force=kind == "relay", chunks=chunks)
        if plan.relayed():
            out["relay"] = plan
    if "ring" in want:  # orders ranked whole, the best one cut into pieces
        rings = [ring(order) for order in ring_orders(links)]
        if rings:
            out["ring"] = min(rings, key=lambda p: predict(p, mesh, count, wire)).chunked(chunks)
    if "tree" in want:
        trees = [Plan("tree", (nearest_tree(root, mesh.delay, links),)) for root in range(n)]
        best = min(trees, key=lambda p: predict(p, mesh, count, wire))
        out["tree"] = best.chunked(chunks_for(1, count, wire))
    return out


def choose(mesh: Mesh, count: int, wire: Wire, kind: str = "auto") -> tuple[Plan, float | None]:
    """The plan for an all-reduce of ``count`` elements and its predicted seconds (None while
    some pair is unmeasured: then the topology alone decides). ``kind`` forces a schedule
    ("auto": the fastest, but the baseline — direct on a full mesh, else relay — unless
    another is ``MARGIN`` faster). ValueError when the mesh does not allow ``kind``."""
    if kind != "auto" and kind not in SCHEDULES:
        raise ValueError(f"schedule: unknown {kind!r}; valid: 'auto', {', '.join(map(repr, SCHEDULES))}")
    measured = mesh.measured()
    model = mesh.filled()
    plans = candidates(model, count, wire, kind)
    if not plans:
        raise ValueError(f"schedule {kind!r} is not possible on this mesh (sessions: {_pairs(model)})")
    times = {name: predict(plan, model, count, wire) for name, plan in plans.items()}
    if kind == "auto":
        fastest = min(times, key=lambda name: (times[name], SCHEDULES.index(name)))
        base = "direct" if "direct" in plans else "relay" if "relay" in plans else fastest
        name = fastest if measured and times[fastest] < (1 - MARGIN) * times[base] else base
    else:
        name = kind
    return plans[name], (times[name] if measured else None)


def _pairs(mesh: Mesh) -> str:
    links = mesh.links
    return ", ".join(f"{i}-{j}" for i in range(mesh.n) for j in range(i + 1, mesh.n) if links[i][j]) or "none"


def unmeasured(n: int, links: Sequence[Sequence[bool]]) -> Mesh:
    """A mesh where only the sessions are known (every rate unmeasured)."""
    rate = tuple(tuple(0.0 if links[i][j] else NO_SESSION for j in range(n)) for i in range(n))
    return Mesh(rate, tuple(tuple(0.0 for _ in range(n)) for _ in range(n)))
