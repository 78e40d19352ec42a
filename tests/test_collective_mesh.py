"""All-reduce schedules among 3-5 sites over loopback: every schedule bitwise identical at every
site and equal to its trees' fixed-order sums, the codec's bound through relays, a pair with no
session, and sites that measured differently still running one schedule."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_helpers import close_all, make_pki, mesh_paths, site_names

from wanxport.collective import CollectiveError, Group, error_bound, join, mesh
from wanxport.collective.costmodel import NO_SESSION, Mesh, choose, part_bounds
from wanxport.collective.pool import ReceivePool
from wanxport.collective.schedule import Plan

pytestmark = pytest.mark.timeout(120)
COUNT = 100_003


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 5)


async def join_mesh(pki: Path, n: int, missing: tuple[tuple[int, int], ...] = (), **kwargs: Any,
                    ) -> list[Group]:
    """n sites on loopback, one path per pair; the pairs in ``missing`` have no session."""
    names = site_names(n)
    pairs = mesh_paths(n, 1)

    def paths(site: int) -> dict[int, list[str]]:
        return {peer: [] if (min(site, peer), max(site, peer)) in missing else pairs[(min(site, peer),
                max(site, peer))] for peer in range(n) if peer != site}

    return list(await asyncio.gather(*(
        join(k, names[:n], identity=pki / names[k], ca=pki / "ca.pem", paths=paths(k), timeout=30.0,
             join_timeout=30.0, **kwargs) for k in range(n))))


def inputs(n: int, seed: int = 3, count: int = COUNT) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(count) * 10 ** rng.uniform(-2, 2, count)).astype(np.float32)
            for _ in range(n)]


def tree_sums(xs: list[np.ndarray], plan: Plan) -> np.ndarray:
    """What the plan's trees compute: each site adds its children's partials to its own value in
    site-index order; the root's total is every site's result."""
    out = np.empty_like(xs[0])
    for k, tree in enumerate(plan.trees):
        a, b = part_bounds(xs[0].size, plan.parts)[k]

        def partial(site: int, tree: Any = tree, a: int = a, b: int = b) -> np.ndarray:
            values = {site: xs[site][a:b], **{c: partial(c) for c in tree.children(site)}}
            total = values[min(values)].copy()
            for key in sorted(values)[1:]:
                np.add(total, values[key], out=total)
            return total

        out[a:b] = partial(tree.root)
    return out


async def all_reduce_everywhere(groups: list[Group], xs: list[np.ndarray], **kwargs: Any) -> list[np.ndarray]:
    arrays = [x.copy() for x in xs]
    await asyncio.gather(*(g.all_reduce(a, **kwargs) for g, a in zip(groups, arrays, strict=True)))
    return arrays


def three_sites(rate: list[list[float]]) -> Mesh:
    rates = tuple(tuple(NO_SESSION if i == j else r for j, r in enumerate(row)) for i, row in enumerate(rate))
    return Mesh(rates, tuple(tuple(0.0 if i == j else 0.01 for j in range(3)) for i in range(3)))


def fake_rows(rows: dict[int, list[float]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each site's measurement of its sessions (bytes/s per peer; 10 ms one way), in place of
    the sessions' own estimates."""
    def measure(self: Group) -> tuple[list[float], list[float]]:
        rates = [r if k in self.links else NO_SESSION for k, r in enumerate(rows[self.world.site])]
        return rates, [0.01 if k in self.links else 0.0 for k in range(self.size)]

    monkeypatch.setattr(Group, "_measure", measure)


@pytest.mark.parametrize(("kind", "n", "count"), [("ring", 3, COUNT), ("tree", 4, COUNT), ("relay", 5, COUNT),
                                                  ("direct", 4, COUNT), ("relay", 3, 2_700_001)])
async def test_each_schedule_is_bitwise_identical_everywhere(pki: Path, kind: str, n: int, count: int,
                                                             ) -> None:
    """(The 11 MB array travels in pieces: a relay forwards one while the next arrives.)"""
    groups = await join_mesh(pki, n, schedule=kind)
    try:
        for seed in (1, 2):  # the second call runs on sessions already warm
            xs = inputs(n, seed, count)
            results = await all_reduce_everywhere(groups, xs)
            plans = [g.stats()[-1].plan for g in groups]
            assert all(p == plans[0] and p is not None and p.kind == kind for p in plans)
            expected = tree_sums(xs, plans[0])
            for result in results:
                assert result.tobytes() == expected.tobytes()
        assert plans[0] is not None and (plans[0].parts > n) == (count > COUNT)
        if kind == "relay":
            assert plans[0].relayed()
        means = await all_reduce_everywhere(groups, inputs(n, 9), op="mean")
        assert all(m.tobytes() == means[0].tobytes() for m in means)
        np.testing.assert_allclose(means[0], np.mean(inputs(n, 9), axis=0), rtol=1e-4, atol=1e-5)
    finally:
        await close_all(groups)


@pytest.mark.parametrize("kind", ["relay", "ring"])
async def test_int8_keeps_its_bound_through_relays(pki: Path, kind: str) -> None:
    """Each hop quantises the partial sum it carries: a site's contribution passes one codec
    error per hop to its part's owner and one more on the way down, each within the bound of
    the values summed below it."""
    n = 4
    groups = await join_mesh(pki, n, schedule=kind)
    try:
        xs = inputs(n, 7)
        results = await all_reduce_everywhere(groups, xs, compress="int8", name="w")
        plan = groups[0].stats()[-1].plan
        assert plan is not None and plan.kind == kind and (plan.relayed() or kind == "ring")
        for result in results:
            assert result.tobytes() == results[0].tobytes()
        exact = np.sum([x.astype(np.float64) for x in xs], axis=0)
        bound = np.zeros(COUNT, dtype=np.float64)
        for k, tree in enumerate(plan.trees):
            a, b = part_bounds(COUNT, plan.parts)[k]
            for site in range(n):
                bound[a:b] += (tree.depth(site) + 1) * error_bound("int8", xs[site][a:b])
        slack = 1e-6 * np.sum([np.abs(x) for x in xs], axis=0)  # float32 sums and second-order terms
        error = np.abs(results[0] - exact)
        assert np.all(error <= bound * 1.01 + slack)
        assert np.any(error > 0)  # it did quantise
    finally:
        await close_all(groups)


async def test_pair_without_a_session_still_completes(pki: Path) -> None:
    n = 4
    groups = await join_mesh(pki, n, missing=((0, 3),))
    try:
        assert 3 not in groups[0].links and 0 not in groups[3].links
        xs = inputs(n, 4)
        results = await all_reduce_everywhere(groups, xs)
        plan = groups[0].stats()[-1].plan
        assert plan is not None and plan.kind == "relay"
        assert {(s, o) for s, o, _ in plan.relayed()} >= {(0, 3), (3, 0)}
        for result in results:
            assert result.tobytes() == tree_sums(xs, plan).tobytes()
        outcomes = await asyncio.gather(*(g.all_gather(x) for g, x in zip(groups, xs, strict=True)),
                                        return_exceptions=True)
        assert all(isinstance(o, (ValueError, CollectiveError)) and "session" in str(o) for o in outcomes)
        await asyncio.gather(*(g.barrier() for g in groups))  # up and down one tree
        assert {g.stats()[-1].op for g in groups} == {"barrier"}
        again = await all_reduce_everywhere(groups, xs)  # the refusal shifted nothing
        assert again[1].tobytes() == results[1].tobytes()
    finally:
        await close_all(groups)


async def test_sites_that_measured_differently_run_the_decider_schedule(
        pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Site 1 sees its pair with site 0 as thin, site 0 sees it fat: alone they would choose
    different schedules; the decider's mesh (every site's own row) decides for all."""
    fat, thin = 100e6, 2e6  # a thin pair that matters at this size (latency does not hide it)
    rows = {0: [0, fat, fat], 1: [thin, 0, fat], 2: [fat, fat, 0]}
    fake_rows(rows, monkeypatch)
    local = []
    for site in range(3):
        rate = [[fat] * 3 for _ in range(3)]
        for peer in range(3):
            rate[site][peer] = rate[peer][site] = rows[site][peer]
        local.append(choose(three_sites(rate), COUNT, lambda e: 128 + 4 * e)[0].kind)
    assert len(set(local)) > 1  # measured alone, the sites would disagree
    groups = await join_mesh(pki, 3)
    try:
        xs = inputs(3, 5)
        results = await all_reduce_everywhere(groups, xs)
        stats = [g.stats()[-1] for g in groups]
        assert len({s.plan for s in stats}) == 1 and stats[0].predicted_s is not None
        decided = three_sites([rows[i] for i in range(3)])
        assert stats[0].plan == choose(decided, COUNT, lambda e: 128 + 4 * e)[0]
        for result in results:
            assert result.tobytes() == results[0].tobytes()
    finally:
        await close_all(groups)


async def test_a_site_choosing_otherwise_is_a_mismatch_not_a_wrong_sum(
        pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    groups = await join_mesh(pki, 3)
    try:
        assert groups[2].planner is not None

        def other(*args: Any) -> tuple[Plan, float | None]:
            return choose(args[0].mesh.filled(), args[1], args[2], "ring")[0], None

        monkeypatch.setattr(groups[2].planner, "choose", other)
        outcomes = await asyncio.gather(*(g.all_reduce(x) for g, x in zip(groups, inputs(3), strict=True)),
                                        return_exceptions=True)
        assert all(isinstance(o, CollectiveError) and "schedule" in str(o) for o in outcomes)
    finally:
        await close_all(groups)


async def test_deterministic_keeps_the_topology_schedule(pki: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_rows({0: [0, 2e6, 100e6], 1: [2e6, 0, 100e6], 2: [100e6, 100e6, 0]}, monkeypatch)
    for deterministic in (True, False):
        groups = await join_mesh(pki, 3, deterministic=deterministic)
        try:
            for _ in range(6):  # past the first plan's window
                await all_reduce_everywhere(groups, inputs(3, 6)[:3])
            kinds = {s.schedule for g in groups for s in g.stats()}
            assert len(kinds) == 1 and (kinds == {"direct"}) == deterministic  # measured: the pair is avoided
            assert all((s.predicted_s is None) == deterministic for g in groups for s in g.stats())
        finally:
            await close_all(groups)


async def test_a_pair_counts_as_measured_once_it_carried_bulk_data_and_is_remembered_when_dropped(
        pki: Path) -> None:
    """Fresh sessions have only app-limited delivery-rate estimates: each site reports them as
    not measured (so the first plan covers one call, not a window); after a bulk all-reduce
    every pair has a rate, and a link that ends leaves what it carried to the world."""
    groups = await join_mesh(pki, 3)
    try:
        assert all(g._measure()[0][peer] == 0.0 for g in groups for peer in g.links)
        assert groups[0].planner is not None
        first = await asyncio.wait_for(groups[0].planner.plan_for(0), 10)
        assert first.until == 1 and not first.mesh.measured()
        xs = inputs(3, count=2 << 20)  # 8 MiB each: every pair carries more than the meter's 1 MiB
        await asyncio.gather(*(g.all_reduce(x) for g, x in zip(groups, xs, strict=True)))
        rows = [g._measure()[0] for g in groups]  # a schedule may leave one direction idle
        assert all(max(rows[i][j], rows[j][i]) > 0.0 for i in range(3) for j in range(3) if i != j), rows
        world = groups[0].world
        await world.drop_link(1)

        class Busy:  # a link that was busy long enough for its meter (loopback rarely is 50 ms)
            def carried_bps(self) -> float:
                return 12.5e6

            async def close(self) -> None:
                pass

        world.links[1] = Busy()  # type: ignore[assignment]
        await world.drop_link(1)
        assert world.carried_bps[1] == 12.5e6 and 1 not in world.links
    finally:
        await close_all(groups)


async def test_a_handshake_attempt_that_hangs_is_abandoned_for_a_fresh_one(monkeypatch: pytest.MonkeyPatch,
                                                                            ) -> None:
    """A handshake begun while the paths were down backs off; the dialer starts a fresh one
    after ``DIAL_ATTEMPT_S`` rather than waiting out the old one's growing probe timeout."""
    attempts: list[bool] = []
    session = object()

    async def initiate(*args: Any, **kwargs: Any) -> object:
        attempts.append(True)
        if len(attempts) == 1:
            await asyncio.sleep(3600)  # its flights were lost: the peer never answers it
        return session

    monkeypatch.setattr(mesh, "initiate", initiate)
    monkeypatch.setattr(mesh, "DIAL_ATTEMPT_S", 0.2)
    got = await mesh.dial([("127.0.0.1", 9)], "id", "ca", None, time.monotonic() + 30.0, "b", ReceivePool())
    assert got is session and len(attempts) == 2  # waiting the first out would end at the deadline
