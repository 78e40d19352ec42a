"""Elastic groups, in one process over loopback: a member lost mid-call (the survivors
finish it with the mean over the live sites), a restarted site admitted at a step
boundary with the state bit-identical, a 2 | 1 partition (the 2 go on, the 1 waits and
rejoins when healed), a site cut off from the store (it stops and waits), and a plain
group, which still fails."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import make_pki, mesh_paths, paths_of, site_names
from elastic_helpers import (
    CutStore,
    MemoryStore,
    cut_sessions,
    digest,
    epoch_members,
    epoch_number,
    fresh_state,
    grad,
    joiner,
    train,
)
from prometheus_client import CollectorRegistry, generate_latest

from wanxport.collective import (
    ArrayState,
    CollectiveError,
    ElasticGroup,
    ElasticState,
    GroupEnded,
    GroupState,
    MembershipChanged,
    codec,
    join,
)
from wanxport.collective.metrics import CollectiveMetrics
from wanxport.control import Bye

pytestmark = pytest.mark.timeout(120)

N = 3


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), N)


async def _form(pki: Path, stores: list) -> tuple[list, dict, list[str]]:
    names, pairs = site_names(N), mesh_paths(N)
    groups = list(await asyncio.gather(*(joiner(stores[k], pki, names, paths_of(k, N, pairs), k)
                                         for k in range(N))))
    return groups, pairs, names


def _record_sent(channel) -> list:  # type: ignore[no-untyped-def]
    """Every control message ``channel`` sends from now on."""
    sent: list = []
    send = channel.send

    async def recording(message):  # type: ignore[no-untyped-def]
        sent.append(message)
        return await send(message)

    channel.send = recording
    return sent


async def _close(groups: list) -> None:
    await asyncio.gather(*(g.close() for g in groups), return_exceptions=True)


async def test_a_member_lost_mid_call_the_survivors_finish_it_with_the_mean_over_live_sites(pki: Path,
                                                                                          ) -> None:
    store = MemoryStore()
    groups, _, _ = await _form(pki, [store] * N)
    metrics = CollectorRegistry()
    collector = CollectiveMetrics()
    collector.watch(groups[0])
    metrics.register(collector)
    try:
        assert [g.epoch.members for g in groups] == [(0, 1, 2)] * N
        refused = await asyncio.gather(*(g.all_reduce(np.ones(3), op="max") for g in groups),
                                       return_exceptions=True)
        assert all(isinstance(e, ValueError) and "max" in str(e) for e in refused), refused
        arrays = [grad(k, 0) for k in range(2)]
        pending = [asyncio.ensure_future(g.all_reduce(a, op="mean"))
                   for g, a in zip(groups, arrays, strict=False)]
        said = _record_sent(groups[0].world.links[2].session.channel)
        cut_sessions(groups[2])  # site 2 never calls: both survivors wait on it when it goes
        await asyncio.gather(*pending)
        assert not [m for m in said if isinstance(m, Bye)], said  # no goodbye waited on from the dead
        expected = (grad(0, 0) + grad(1, 0)) / np.float32(2)
        assert arrays[0].tobytes() == arrays[1].tobytes() == expected.tobytes()
        assert [g.epoch.members for g in groups[:2]] == [(0, 1)] * 2
        assert [g.changes for g in groups[:2]] == [1, 1]  # site 2 gone
        text = generate_latest(metrics).decode()
        assert 'wanxport_collective_epoch{group="elastic"} 1.0' in text
        assert 'wanxport_collective_membership_changes_total{group="elastic"} 1.0' in text
        assert f'wanxport_collective_members{{group="{groups[0].group.gid:08x}",state="live"}} 2.0' in text
        assert all(g.state is ElasticState.RUNNING for g in groups[:2])
    finally:
        await _close(groups)


async def test_a_compressed_call_retried_among_the_survivors_keeps_its_error_feedback(pki: Path) -> None:
    """The retry encodes the input plus the residual from before the failed attempt (whose
    own compression error was of a value nobody applied), and the residual outlives the epoch."""
    groups, _, _ = await _form(pki, [MemoryStore()] * N)
    try:
        await asyncio.gather(*(g.all_reduce(grad(k, 0), op="mean", compress="int8", name="w")
                               for k, g in enumerate(groups)))
        before = [g.feedback.residual("w") for g in groups[:2]]
        assert all(r is not None and r.any() for r in before)
        arrays = [grad(k, 1) for k in range(2)]
        pending = [asyncio.ensure_future(g.all_reduce(a, op="mean", compress="int8", name="w"))
                   for g, a in zip(groups, arrays, strict=False)]
        cut_sessions(groups[2])  # the first attempt waits on site 2, which is gone
        await asyncio.gather(*pending)
        assert [g.epoch.members for g in groups[:2]] == [(0, 1)] * 2
        sent = []
        for k in range(2):
            target = grad(k, 1) + before[k]
            sent.append(codec.decode("int8", codec.encode("int8", target), target.size))
            assert np.array_equal(groups[k].feedback.residual("w"), target - sent[k]), k
        assert arrays[0].tobytes() == arrays[1].tobytes() == ((sent[0] + sent[1]) / np.float32(2)).tobytes()
    finally:
        await _close(groups)


async def test_a_restarted_site_is_admitted_at_a_step_boundary_with_the_state_bit_identical(pki: Path,
                                                                                          ) -> None:
    store = MemoryStore()
    groups, pairs, names = await _form(pki, [store] * N)
    states = [fresh_state() for _ in range(N)]
    rejoined = None
    try:
        first = await asyncio.gather(*(train(g, s, 0, 3) for g, s in zip(groups, states, strict=True)))
        assert first == [3] * N
        cut_sessions(groups[2])
        await groups[2].close()  # the old process is gone
        survivors = [asyncio.ensure_future(train(g, s, 3, 5))
                     for g, s in zip(groups[:2], states[:2], strict=True)]
        rejoined = await joiner(store, pki, names, paths_of(2, N, pairs), 2)  # waits until they notice
        state = fresh_state()
        last = await asyncio.gather(train(rejoined, state, 0, 5), *survivors)
        admitted = rejoined.epoch
        assert admitted.admitted == (2,) and admitted.members == (0, 1, 2)
        assert last == [admitted.start + 3] * N  # it took part from the step it was admitted at
        assert digest(state) == digest(states[0]) == digest(states[1])
        assert int(state.arrays["step"][0]) == last[0]
    finally:
        await _close([*groups[:2], *([rejoined] if rejoined else [])])


class _SharedW(ArrayState):
    shared_arrays = ("w",)


async def test_a_joiner_whose_copy_fails_leaves_and_the_members_go_on(pki: Path) -> None:
    """The members declare an array shared but hold it differently: the joiner loads nothing
    and raises; it leaves without the closing barrier (which would pair with the members'
    step and fail them), so they count it gone and go on."""
    store = MemoryStore()
    groups, pairs, names = await _form(pki, [store] * N)
    states = [_SharedW({"w": np.zeros(257, np.float32), "step": np.array([0])}) for _ in range(N)]
    rejoined = None
    try:
        await asyncio.gather(*(train(g, s, 0, 3) for g, s in zip(groups, states, strict=True)))
        cut_sessions(groups[2])
        await groups[2].close()
        states[1].arrays["w"] = states[1].arrays["w"] + np.float32(1)  # no longer alike at the members
        survivors = [asyncio.ensure_future(_steps(g, s, 3, 3, changes=3))
                     for g, s in zip(groups[:2], states[:2], strict=True)]
        rejoined = await joiner(store, pki, names, paths_of(2, N, pairs), 2)
        state = _SharedW({"w": np.zeros(257, np.float32), "step": np.array([0])})
        with pytest.raises(CollectiveError, match="declares shared"):
            await rejoined.boundary(0, state)
        assert not state.arrays["w"].any()  # nothing loaded
        await rejoined.close()
        await asyncio.gather(*survivors)
        assert [g.epoch.members for g in groups[:2]] == [(0, 1)] * 2
    finally:
        await _close([*groups[:2], *([rejoined] if rejoined else [])])


async def test_a_site_restarted_after_the_members_closed_the_group_is_told_it_ended(pki: Path) -> None:
    """The survivors finish and close while the restarted site is still starting: it gets
    ``GroupEnded`` naming where the group ended, not a wait for an admission nobody gives."""
    store = MemoryStore()
    groups, pairs, names = await _form(pki, [store] * N)
    states = [fresh_state() for _ in range(N)]

    try:
        await asyncio.gather(*(train(g, s, 0, 2) for g, s in zip(groups, states, strict=True)))
        cut_sessions(groups[2])
        await groups[2].close()
        assert "wanxport/elastic/ended" not in store.data  # one site leaving alone ends nothing
        last = await asyncio.gather(*(_steps(groups[k], states[k], 2, 4) for k in range(2)))
        assert epoch_members(store.data) == (0, 1)
        await _close(groups[:2])
        assert json.loads(store.data["wanxport/elastic/ended"]) == {"epoch": 1, "step": last[0] - 1}
        with pytest.raises(GroupEnded, match=f"closed it at epoch 1, step {last[0] - 1}"):
            await asyncio.wait_for(joiner(store, pki, names, paths_of(2, N, pairs), 2), 30.0)
    finally:
        await _close(groups)


async def test_two_survivors_that_each_counted_the_other_gone_set_up_again_and_go_on(pki: Path) -> None:
    """Site 2 is gone, then the session between the two survivors breaks (each counts the
    other gone: neither holds a majority alone). They must not wait for each other for ever:
    each sets its session up again, they agree a new epoch of the two and step on equal."""
    store = MemoryStore()
    groups, _, _ = await _form(pki, [store] * N)
    states = [fresh_state() for _ in range(N)]

    try:
        await asyncio.gather(*(_steps(g, s, 0, 2) for g, s in zip(groups, states, strict=True)))
        cut_sessions(groups[2])
        await groups[2].close()
        assert await asyncio.gather(*(_steps(groups[k], states[k], 2, 4) for k in range(2))) == [4, 4]
        assert epoch_members(store.data) == (0, 1)
        before = epoch_number(store.data)
        cut_sessions(groups[0])  # the survivors' own session breaks, at both ends
        done = await asyncio.wait_for(asyncio.gather(*(_steps(groups[k], states[k], 4, 8) for k in range(2))),
                                      60.0)
        assert done == [8, 8]
        assert epoch_number(store.data) > before and epoch_members(store.data) == (0, 1)
        assert digest(states[0]) == digest(states[1])
    finally:
        await _close(groups)


async def test_a_minority_site_waits_and_rejoins_when_healed(pki: Path) -> None:
    """2 | 1: site 2's sessions are cut and no new one can form (it listens and dials on
    ports nobody uses) while the store stays reachable: the 2 go on, the 1 waits (it never
    takes a step alone) and asks to be admitted, which the 2 never stop for while they
    cannot reach it; healed (its ports back), it is admitted and catches up."""
    store = MemoryStore()
    groups, pairs, _ = await _form(pki, [store] * N)
    states = [fresh_state() for _ in range(N)]
    minority = groups[2]
    tasks: list[asyncio.Future] = []
    try:
        await asyncio.gather(*(train(g, s, 0, 2) for g, s in zip(groups, states, strict=True)))
        real = minority.sites.paths
        minority.sites.paths = {p: [(h, int(port)) for h, port in (a.rsplit(":", 1) for a in far)]
                                for p, far in paths_of(2, N, mesh_paths(N)).items()}
        redone: list[int] = []
        waiting = asyncio.ensure_future(train(minority, states[2], 2, 3, redone))
        ahead = asyncio.Event()
        cut_sessions(minority)
        survivors = [asyncio.ensure_future(train(g, s, 2, 8, reached=(8, ahead)))
                     for g, s in zip(groups[:2], states[:2], strict=True)]
        tasks = [waiting, *survivors]
        await ahead.wait()  # the 2 went on ...
        await store.until(lambda data: int(data.get("wanxport/elastic/tickets", b"0")) >= 1)  # it asked
        asked_at = int(states[0].arrays["step"][0])
        while int(states[0].arrays["step"][0]) < asked_at + 5:  # the 2 step on past its request ...
            await asyncio.sleep(0.01)
        assert epoch_number(store.data) == 1 and epoch_members(store.data) == (0, 1)  # ... never admitting it
        assert not waiting.done() and int(states[2].arrays["step"][0]) == 2  # ... the 1 did not step
        assert minority.state is not ElasticState.RUNNING
        minority.sites.paths = real  # healed
        tasks = [waiting, *survivors]
        last = await asyncio.gather(*tasks)
        assert last[0] == last[1] == last[2] >= 8
        assert digest(states[0]) == digest(states[1]) == digest(states[2])
        assert redone == [2]  # its call in flight when cut off was redone after the state came
        assert minority.epoch.members == (0, 1, 2) and 2 in minority.epoch.admitted
    finally:
        for task in tasks:
            task.cancel()
        await _close(groups)


async def test_a_site_cut_off_from_the_store_stops_and_waits(pki: Path) -> None:
    shared = MemoryStore()
    views = [CutStore(shared) for _ in range(N)]
    groups, _, _ = await _form(pki, views)
    states = [fresh_state() for _ in range(N)]
    metrics = CollectorRegistry()
    collector = CollectiveMetrics()
    collector.watch(groups[0])
    metrics.register(collector)
    try:
        await asyncio.gather(*(train(g, s, 0, 1) for g, s in zip(groups, states, strict=True)))
        views[0].cut = True
        stopped = asyncio.ensure_future(groups[0].boundary(1, states[0]))
        await views[0].retried.wait()
        assert not stopped.done() and groups[0].membership.waiting_for_store
        text = generate_latest(metrics).decode()
        assert 'wanxport_collective_waiting_for_store{group="elastic"} 1.0' in text
        (line,) = [x for x in text.splitlines() if x.startswith("wanxport_collective_store_failures_total")]
        assert 1 <= float(line.split()[-1]) <= groups[0].membership.store_failures
        views[0].cut = False
        assert await stopped == 1
        text = generate_latest(metrics).decode()
        assert 'wanxport_collective_waiting_for_store{group="elastic"} 0.0' in text
        assert 'wanxport_collective_elastic_state{group="elastic",state="running"} 1.0' in text
        done = await asyncio.gather(*(train(g, s, 1, 3) for g, s in zip(groups, states, strict=True)))
        assert done == [3] * N
        assert digest(states[0]) == digest(states[1]) == digest(states[2])
        assert groups[0].membership.store_failures >= 1 and not groups[0].membership.waiting_for_store
    finally:
        await _close(groups)


async def test_a_plain_group_still_fails_when_a_member_is_lost(pki: Path) -> None:
    names, pairs = site_names(N), mesh_paths(N)
    groups = list(await asyncio.gather(*(
        join(k, names, identity=pki / names[k], ca=pki / "ca.pem", paths=paths_of(k, N, pairs), timeout=30.0,
             liveness_min_s=1.0) for k in range(N))))
    try:
        pending = [asyncio.ensure_future(g.all_reduce(np.ones(8, np.float32))) for g in groups[:2]]
        for link in groups[2].world.links.values():
            link.session.endpoint.abort()
        for error in await asyncio.gather(*pending, return_exceptions=True):
            assert isinstance(error, CollectiveError) and error.site == "site-2", error
        assert all(g.state is GroupState.MEMBER_GONE for g in groups[:2])
    finally:
        await asyncio.gather(*(g.close(drain_s=0.0) for g in groups), return_exceptions=True)


async def _steps(group: ElasticGroup, state: ArrayState, step: int, until: int, changes: int = 0) -> int:
    """Steps ``step`` to ``until`` (a step redone on ``MembershipChanged``), whoever is live;
    with ``changes``, also until the group has seen that many membership changes and ran
    3 steps after."""
    seen_at = None
    while step < until or (changes and (seen_at is None or step < seen_at + 3)):
        step = await group.boundary(step, state)
        g = grad(group.site, step)
        try:
            await group.all_reduce(g, op="mean")
        except MembershipChanged:
            continue
        state.arrays["w"] = state.arrays["w"] + g
        step += 1
        if changes and seen_at is None and group.changes >= changes:
            seen_at = step
    return step
