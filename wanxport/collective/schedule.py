"""Schedules of an all-reduce among n sites, as reduction trees: pure shapes, no I/O.

Every schedule is a set of parts (the array split with ``part_bounds``), and each part
has a tree over the sites rooted at the part's owner. A site adds its children's
partial sums of the part to its own contribution and sends the result to its parent;
the root ends with the part's total, which then travels back down the same tree
(reversed edges) to every site. One shape covers every schedule the group uses:

- ``direct``: n parts, part k's tree a star on site k (every pair carries S/n each
  way: the least traffic there is, one round of latency each way);
- ``relay``: the direct stars, but some site hangs under a third site instead of
  the owner, so its share (summed into the third site's partial) avoids a thin or
  missing direct path;
- ``ring``: n parts, each a chain along one ring order (bandwidth-optimal on the
  ring's edges only, n-1 hops of latency each way);
- ``tree``: one part, one tree with the fewest one-way delays from the root (for
  small arrays, where latency dominates).

A site with no session to another never sends to it: every edge of every tree is a
pair with a session (``links``).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

SCHEDULES = ("direct", "ring", "tree", "relay")
NO_PARENT = -1


@dataclass(frozen=True)
class Tree:
    """A reduction tree: ``parent[site]`` (``NO_PARENT`` for the root)."""

    parent: tuple[int, ...]

    @property
    def root(self) -> int:
        return self.parent.index(NO_PARENT)

    def children(self, site: int) -> list[int]:
        return [c for c, p in enumerate(self.parent) if p == site]

    def depth(self, site: int) -> int:
        """Hops from ``site`` up to the root."""
        hops = 0
        while self.parent[site] != NO_PARENT:
            site = self.parent[site]
            hops += 1
        return hops

    def edges(self) -> list[tuple[int, int]]:
        """(child, parent) for every site but the root."""
        return [(c, p) for c, p in enumerate(self.parent) if p != NO_PARENT]


@dataclass(frozen=True)
class Plan:
    """A schedule: ``kind`` (one of ``SCHEDULES``) and one tree per part, in part order."""

    kind: str
    trees: tuple[Tree, ...]

    @property
    def parts(self) -> int:
        return len(self.trees)

    def chunked(self, chunks: int) -> Plan:
        """Each part cut into ``chunks`` consecutive pieces on the part's tree: a site then
        forwards one piece while the next arrives (pipelining through relays and chains)."""
        return Plan(self.kind, tuple(t for t in self.trees for _ in range(chunks)))

    def relayed(self) -> list[tuple[int, int, int]]:
        """(site, owner, via): every share that reaches its part's owner through another site."""
        return [(c, t.root, p) for t in self.trees for c, p in t.edges() if p != t.root]


Links = Sequence[Sequence[bool]]  # links[i][j]: sites i and j have a session


def check_tree(tree: Tree, links: Links) -> None:
    """ValueError unless ``tree`` spans every site over sessions that exist, without a cycle."""
    n = len(links)
    if len(tree.parent) != n or tree.parent.count(NO_PARENT) != 1:
        raise ValueError(f"a tree over {n} sites needs {n} parents and one root, got {tree.parent}")
    for child, parent in tree.edges():
        if not 0 <= parent < n or not links[child][parent]:
            raise ValueError(f"tree edge {child}->{parent} has no session")
    for site in range(n):
        seen = {site}
        while tree.parent[site] != NO_PARENT:
            site = tree.parent[site]
            if site in seen:
                raise ValueError(f"tree {tree.parent} has a cycle through site {site}")
            seen.add(site)


def star(n: int, root: int) -> Tree:
    return Tree(tuple(NO_PARENT if k == root else root for k in range(n)))


def full_mesh(links: Links) -> bool:
    n = len(links)
    return all(links[i][j] for i in range(n) for j in range(n) if i != j)


def direct(n: int) -> Plan:
    return Plan("direct", tuple(star(n, k) for k in range(n)))


def ring(order: Sequence[int]) -> Plan:
    """Part k (owned by site k) travels along ``order`` from the site after k, ending at k."""
    n = len(order)
    position = {site: i for i, site in enumerate(order)}
    trees = []
    for owner in range(n):
        parent = [NO_PARENT] * n
        start = position[owner]
        for step in range(1, n):
            parent[order[(start + step) % n]] = order[(start + step + 1) % n]
        trees.append(Tree(tuple(parent)))
    return Plan("ring", tuple(trees))


def ring_orders(links: Links, exhaustive_up_to: int = 7) -> list[tuple[int, ...]]:
    """Ring orders (site 0 first) whose consecutive sites all have sessions: every one for
    small n, else the one a nearest-index walk finds (none when it fails)."""
    n = len(links)

    def closed(order: Sequence[int]) -> bool:
        return all(links[order[i]][order[(i + 1) % n]] for i in range(n))

    if n <= exhaustive_up_to:
        from itertools import permutations
        return [(0, *rest) for rest in permutations(range(1, n)) if closed((0, *rest))]
    order = [0]
    while len(order) < n:
        nxt = [s for s in range(n) if s not in order and links[order[-1]][s]]
        if not nxt:
            return []
        order.append(nxt[0])
    return [tuple(order)] if closed(order) else []


def nearest_tree(root: int, delay: Sequence[Sequence[float]], links: Links) -> Tree:
    """The tree of fewest summed one-way delays from ``root`` (Dijkstra; ties: lower index)."""
    n = len(links)
    best = [float("inf")] * n
    parent = [NO_PARENT] * n
    best[root] = 0.0
    heap = [(0.0, root)]
    done: set[int] = set()
    while heap:
        d, site = heapq.heappop(heap)
        if site in done:
            continue
        done.add(site)
        for other in range(n):
            if other != site and links[site][other] and d + delay[site][other] < best[other]:
                best[other] = d + delay[site][other]
                parent[other] = site
                heapq.heappush(heap, (best[other], other))
    if len(done) != n:
        raise ValueError(f"sites {sorted(set(range(n)) - done)} have no route to site {root}")
    return Tree(tuple(parent))


def with_parent(plan: Plan, part: int, site: int, parent: int, kind: str = "relay") -> Plan:
    """``plan`` with ``site`` hanging under ``parent`` in part ``part``'s tree."""
    tree = list(plan.trees[part].parent)
    tree[site] = parent
    trees = list(plan.trees)
    trees[part] = Tree(tuple(tree))
    return Plan(kind, tuple(trees))
