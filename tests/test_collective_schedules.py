"""The all-reduce schedules' shapes and the cost model that chooses among them (pure, no I/O)."""

from __future__ import annotations

import pytest

from wanxport.collective.costmodel import (
    MARGIN,
    NO_SESSION,
    Mesh,
    choose,
    chunks_for,
    predict,
    relay_plan,
    unmeasured,
)
from wanxport.collective.schedule import (
    NO_PARENT,
    Plan,
    Tree,
    check_tree,
    direct,
    nearest_tree,
    ring,
    ring_orders,
)


def wire(elements: int) -> int:
    return 128 + 4 * elements


def mesh(rates: list[list[float]], delay_s: float = 0.01) -> Mesh:
    n = len(rates)
    rate = tuple(tuple(NO_SESSION if i == j else float(rates[i][j]) for j in range(n)) for i in range(n))
    return Mesh(rate, tuple(tuple(0.0 if i == j else delay_s for j in range(n)) for i in range(n)))


def uniform(n: int, rate: float = 100e6) -> Mesh:
    return mesh([[rate] * n for _ in range(n)])


MIB64 = 16 << 20  # float32 elements


def test_every_plan_spans_every_site_over_existing_sessions() -> None:
    thin = mesh([[0, 25e6, 100e6, 100e6], [25e6, 0, 100e6, 100e6], [100e6] * 4, [100e6] * 4])
    links = thin.links
    for plan in (direct(4), ring((0, 2, 1, 3)), relay_plan(thin, MIB64, wire),
                 Plan("tree", (nearest_tree(2, thin.delay, links),))):
        for tree in plan.trees:
            check_tree(tree, links)
    assert [t.root for t in ring((0, 2, 1, 3)).trees] == [0, 1, 2, 3]


def test_check_tree_refuses_cycles_and_missing_sessions() -> None:
    links = [[i != j for j in range(3)] for i in range(3)]
    with pytest.raises(ValueError, match="cycle"):
        check_tree(Tree((NO_PARENT, 2, 1)), links)
    links[0][2] = links[2][0] = False
    with pytest.raises(ValueError, match="no session"):
        check_tree(Tree((2, 0, NO_PARENT)), links)


def test_ring_is_a_chain_ending_at_each_owner() -> None:
    plan = ring((0, 1, 2, 3))
    assert plan.trees[0].parent == (NO_PARENT, 2, 3, 0)  # 1 -> 2 -> 3 -> 0
    assert [plan.trees[0].depth(s) for s in range(4)] == [0, 3, 2, 1]


def test_uniform_mesh_keeps_direct_for_large_and_small_arrays() -> None:
    for count in (1, 1000, MIB64):
        plan, predicted = choose(uniform(4), count, wire)
        assert plan.kind == "direct" and predicted is not None


def test_thin_pair_is_relayed_and_predicted_faster_than_direct() -> None:
    """The direct pair at a quarter of the two-hop route's capacity: its shares go through the
    third site."""
    thin = mesh([[0, 25e6, 100e6], [25e6, 0, 100e6], [100e6, 100e6, 0]])
    plan, predicted = choose(thin, MIB64, wire)
    assert plan.kind == "relay"
    assert {(site, owner) for site, owner, _ in plan.relayed()} == {(0, 1), (1, 0)}
    assert {via for _, _, via in plan.relayed()} == {2}
    assert predicted is not None and predicted < (1 - MARGIN) * predict(direct(3), thin, MIB64, wire)


def test_missing_pair_must_relay_and_direct_is_refused() -> None:
    links = [[i != j and {i, j} != {0, 3} for j in range(4)] for i in range(4)]
    topology = unmeasured(4, links)
    plan, predicted = choose(topology, 1000, wire)
    assert plan.kind == "relay" and predicted is None
    assert {(s, o) for s, o, _ in plan.relayed()} >= {(0, 3), (3, 0)}  # and whatever rebalances their load
    for tree in plan.trees:
        check_tree(tree, links)
    with pytest.raises(ValueError, match="not possible"):
        choose(topology, 1000, wire, "direct")


def test_two_hop_missing_pair_hangs_under_first_hop() -> None:
    """A line 0-1-2-3: site 3's share of part 0 goes 3 -> 2 -> 1 -> 0."""
    links = [[abs(i - j) == 1 for j in range(4)] for i in range(4)]
    plan = relay_plan(unmeasured(4, links).filled(), 1000, wire)
    assert plan.trees[0].parent == (NO_PARENT, 0, 1, 2)
    assert plan.trees[3].parent == (1, 2, 3, NO_PARENT)


def test_forced_kinds_are_honoured() -> None:
    for kind in ("direct", "ring", "tree", "relay"):
        plan, _ = choose(uniform(4), MIB64, wire, kind)
        assert plan.kind == kind
    assert choose(uniform(4), MIB64, wire, "relay")[0].relayed()
    with pytest.raises(ValueError, match="unknown"):
        choose(uniform(4), MIB64, wire, "butterfly")


def test_high_latency_pairs_favour_a_tree_for_tiny_arrays() -> None:
    """Two far sites each near a hub: the single tree through the hub crosses no far pair."""
    delay = [[0.0, 0.2, 0.01], [0.2, 0.0, 0.01], [0.01, 0.01, 0.0]]
    far = Mesh(uniform(3).rate, tuple(tuple(row) for row in delay))
    plan, _ = choose(far, 16, wire)
    assert plan.kind == "tree" and plan.trees[0].root == 2
    assert choose(far, MIB64, wire)[0].kind != "tree"


def test_large_arrays_travel_in_pieces_small_ones_whole() -> None:
    thin = mesh([[0, 25e6, 100e6], [25e6, 0, 100e6], [100e6, 100e6, 0]])
    for kind in ("relay", "ring", "tree"):
        assert choose(thin, 1000, wire, kind)[0].parts == (3 if kind != "tree" else 1)
        pieces = choose(thin, MIB64, wire, kind)[0]
        owners = 3 if kind != "tree" else 1
        assert pieces.parts == owners * chunks_for(owners, MIB64, wire) > 3
        assert [t.root for t in pieces.trees] == sorted(t.root for t in pieces.trees)  # pieces adjoin
    assert chunks_for(16, MIB64 * 16, wire) * 16 <= 127


def test_ring_orders_only_use_sessions() -> None:
    links = [[abs(i - j) in (1, 3) for j in range(4)] for i in range(4)]  # the cycle 0-1-2-3-0
    assert ring_orders(links) == [(0, 1, 2, 3), (0, 3, 2, 1)]
    assert ring_orders([[i != j and {i, j} != {0, 1} for j in range(3)] for i in range(3)]) == []


def test_prediction_is_monotone_in_size_and_infinite_without_a_session() -> None:
    m = uniform(3)
    assert predict(direct(3), m, 1000, wire) < predict(direct(3), m, MIB64, wire)
    cut = mesh([[0, -1, 100e6], [-1, 0, 100e6], [100e6, 100e6, 0]])
    assert predict(direct(3), cut, 1000, wire) == float("inf")


def test_a_direction_left_idle_takes_the_other_directions_rate() -> None:
    """A relay schedule can leave one direction of a pair without traffic (and so without a rate
    estimate): the pair still counts as measured, at its other direction's rate."""
    one_way = mesh([[0, 0, 100e6], [25e6, 0, 100e6], [100e6, 100e6, 0]])
    assert one_way.measured()
    assert one_way.filled().rate[0][1] == 25e6
    plan, predicted = choose(one_way, MIB64, wire)
    assert plan.kind == "relay" and predicted is not None
    assert not mesh([[0, 0, 100e6], [0, 0, 100e6], [100e6, 100e6, 0]]).measured()
