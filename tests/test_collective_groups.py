"""Groups of any subset of sites on the world's sessions: ids agreed without a message,
created in any order, isolated from each other, no ports of their own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import CollectiveError, GroupState

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


async def test_groups_of_one_two_and_three_sites_share_the_world_sessions_in_any_order(pki: Path) -> None:
    world = await join_all(pki, 3)
    try:
        sessions = {k: {id(link.session) for link in g.links.values()} for k, g in enumerate(world)}
        # Each site creates its groups in its own order; site 2 is no member of [0, 1] and may skip it.
        pair0 = world[0].new_group([0, 1])
        trio0 = world[0].new_group([2, 1, 0])
        alone0 = world[0].new_group([0])
        trio1 = world[1].new_group([0, 1, 2])
        pair1 = world[1].new_group([1, 0])
        trio2 = world[2].new_group([0, 1, 2])
        assert world[2].new_group([0, 1]) is None
        assert pair0 and pair1 and trio0 and trio1 and trio2 and alone0
        assert pair0.gid == pair1.gid and trio0.gid == trio1.gid == trio2.gid
        assert len({pair0.gid, trio0.gid, alone0.gid, world[0].gid}) == 4
        for k, g in ((0, pair0), (0, trio0), (1, pair1), (2, trio2)):
            assert {id(link.session) for link in g.links.values()} <= sessions[k]  # no session of its own
        assert (pair1.site, pair1.size, trio2.site, alone0.size) == (1, 2, 2, 1)

        pairs = [np.full(6, 1.0, np.float32), np.full(6, 2.0, np.float32)]
        trios = [np.full(5, 10.0 ** k) for k in range(3)]
        whole = [np.full(4, k + 1, np.int64) for k in range(3)]
        single = np.arange(3.0)
        # All four groups at once, their calls interleaved on the same sessions.
        await asyncio.gather(pair1.all_reduce(pairs[1]), trio2.all_reduce(trios[2]),
                             world[1].all_reduce(whole[1]), trio0.all_reduce(trios[0]),
                             world[2].all_reduce(whole[2]), alone0.all_reduce(single),
                             world[0].all_reduce(whole[0]), trio1.all_reduce(trios[1]),
                             pair0.all_reduce(pairs[0]))
        assert all(p.tolist() == [3.0] * 6 for p in pairs)
        assert all(t.tolist() == [111.0] * 5 for t in trios)
        assert all(w.tolist() == [6] * 4 for w in whole)
        assert single.tolist() == [0.0, 1.0, 2.0]
        got = await asyncio.gather(pair0.all_gather(np.array([7])), pair1.all_gather(np.array([8])))
        assert [g.tolist() for g in got] == [[[7], [8]]] * 2
        await asyncio.gather(pair0.send(np.arange(4), dst=1), pair1.recv(box := np.zeros(4, np.int64), src=0))
        assert box.tolist() == [0, 1, 2, 3]
    finally:
        await close_all(world)


async def test_a_mismatch_or_refusal_in_one_group_leaves_the_others_working(pki: Path) -> None:
    world = await join_all(pki, 3, timeout=60.0)
    try:
        pairs = [world[k].new_group([0, 1]) for k in range(2)]
        trios = [world[k].new_group([0, 1, 2]) for k in range(3)]
        whole = [np.full(2, k, np.int32) for k in range(3)]
        results = await asyncio.gather(
            pairs[0].all_reduce(np.ones((2, 3), np.float32)),
            pairs[1].all_reduce(np.ones((3, 2), np.float32)),
            trios[0].all_reduce(np.ones(4), op="max"), trios[1].all_reduce(np.ones(4)),
            trios[2].all_reduce(np.ones(4)),
            *(world[k].all_reduce(a) for k, a in enumerate(whole)),
            return_exceptions=True)
        assert isinstance(results[0], CollectiveError) and "shape" in str(results[0]), results
        assert isinstance(results[1], CollectiveError) and "shape" in str(results[1]), results
        assert isinstance(results[2], ValueError), results
        assert all(isinstance(r, CollectiveError) and "refused" in str(r) for r in results[3:5]), results
        assert all(w.tolist() == [3, 3] for w in whole)  # the world group never noticed
        for g in (*pairs, *trios, *world):
            assert g.state is GroupState.OPEN
        after = [np.full(3, 1.0) for _ in range(3)]
        await asyncio.gather(*(t.all_reduce(a) for t, a in zip(trios, after, strict=True)),
                             pairs[0].barrier(), pairs[1].barrier())
        assert all(a.tolist() == [3.0] * 3 for a in after)
        await pairs[0].close()  # closing a subgroup leaves the sessions to the others
        assert pairs[0].state is GroupState.CLOSED and world[0].state is GroupState.OPEN
        await asyncio.gather(*(g.barrier() for g in world))
    finally:
        await close_all(world)


async def test_a_call_on_a_group_a_peer_has_not_created_yet_waits_for_it(pki: Path) -> None:
    world = await join_all(pki, 2)
    try:
        arrived = asyncio.Event()
        link = world[1].links[0]
        deliver = link._deliver

        def noting(*args: object) -> bool:
            kept = deliver(*args)
            arrived.set()
            return kept

        link._deliver = noting
        early = world[0].new_group([0, 1])
        first = np.full(3, 4.0)
        started = asyncio.ensure_future(early.all_reduce(first))
        await arrived.wait()  # its message reached site 1, which has no such group yet
        assert early.gid in world[1].world._early and not started.done()
        late = world[1].new_group([0, 1])
        second = np.full(3, 5.0)
        await asyncio.gather(started, late.all_reduce(second))
        assert first.tolist() == second.tolist() == [9.0] * 3
    finally:
        await close_all(world)


def test_the_state_table_answers_every_pair_and_only_closing_ends_it() -> None:
    from wanxport.collective.state import TRANSITIONS, GroupEvent, advance

    assert set(TRANSITIONS) == {(s, e) for s in GroupState for e in GroupEvent}
    assert advance(GroupState.OPEN, GroupEvent.MEMBER_LOST) is GroupState.MEMBER_GONE
    assert advance(GroupState.MEMBER_GONE, GroupEvent.POISON) is GroupState.POISONED
    assert advance(GroupState.POISONED, GroupEvent.MEMBER_LOST) is GroupState.POISONED
    assert all(advance(GroupState.CLOSED, e) is GroupState.CLOSED for e in GroupEvent)
    assert all(advance(s, GroupEvent.CLOSE) is GroupState.CLOSED for s in GroupState)
