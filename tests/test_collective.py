"""wanxport.collective over loopback: results against numpy, identical sites, mismatches, failures."""

from __future__ import annotations

import asyncio
from functools import reduce
from pathlib import Path

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import CollectiveError, Group, error_bound, part_bounds
from wanxport.gateway.config import GatewayOptions
from wanxport.presets import COLLECTIVE

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


def inputs(n: int, count: int, seed: int = 5, dtype: type = np.float32) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(count) * 10 ** rng.uniform(-3, 3, count)).astype(dtype) for _ in range(n)]


def fixed_order_sum(xs: list[np.ndarray]) -> np.ndarray:
    return reduce(np.add, xs)


@pytest.mark.parametrize("n", [2, 3])
async def test_all_reduce_equals_numpy_in_site_order_bitwise_everywhere(pki: Path, n: int) -> None:
    groups = await join_all(pki, n)
    try:
        xs = inputs(n, 100_003)
        arrays = [x.copy() for x in xs]
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        expected = fixed_order_sum(xs)
        for a in arrays:
            assert a.tobytes() == expected.tobytes()
        means = [x.reshape(7, -1, 1).copy() for x in (y[:100_002] for y in xs)]  # shaped, in place
        await asyncio.gather(*(g.all_reduce(m, op="mean") for g, m in zip(groups, means, strict=True)))
        mean = fixed_order_sum([x[:100_002] for x in xs]) / np.float32(n)
        for m in means:
            assert m.shape == (7, 14_286, 1) and m.reshape(-1).tobytes() == mean.tobytes()
    finally:
        await close_all(groups)


async def test_other_collectives_on_three_sites(pki: Path) -> None:
    groups = await join_all(pki, 3)
    try:
        xs = inputs(3, 1_001, seed=9, dtype=np.float64)
        gathered = await asyncio.gather(*(g.all_gather(x) for g, x in zip(groups, xs, strict=True)))
        for got in gathered:
            np.testing.assert_array_equal(got, np.stack(xs))
        scattered = [x.copy() for x in xs]
        parts = await asyncio.gather(*(g.reduce_scatter(s) for g, s in zip(groups, scattered, strict=True)))
        total = fixed_order_sum(xs)
        for k, part in enumerate(parts):
            a, b = part_bounds(1_001, 3)[k]
            assert part.tobytes() == total[a:b].tobytes()
            assert scattered[k][:a].tobytes() == xs[k][:a].tobytes()  # other parts unchanged
        ints = [np.arange(12, dtype=np.int32).reshape(3, 4) * (k + 1) for k in range(3)]
        await asyncio.gather(*(g.broadcast(i, root=1) for g, i in zip(groups, ints, strict=True)))
        for i in ints:
            np.testing.assert_array_equal(i, np.arange(12, dtype=np.int32).reshape(3, 4) * 2)
        await asyncio.gather(*(g.barrier() for g in groups))
        assert [s.op for s in groups[0].stats()] == ["all_gather", "reduce_scatter", "broadcast", "barrier"]
        assert all(s.ok and s.elapsed_s > 0 for s in groups[0].stats())
    finally:
        await close_all(groups)


@pytest.mark.parametrize("compress", ["bf16", "int8"])
async def test_compressed_identical_within_bound_with_error_feedback(pki: Path, compress: str) -> None:
    groups = await join_all(pki, 2)
    try:
        xs = inputs(2, 50_000, seed=3)
        steps = 4
        transmitted = [np.zeros(50_000, dtype=np.float64) for _ in range(2)]
        for step in range(steps):
            arrays = [x.copy() for x in xs]
            await asyncio.gather(*(g.all_reduce(a, compress=compress, name="w")
                                   for g, a in zip(groups, arrays, strict=True)))
            assert arrays[0].tobytes() == arrays[1].tobytes()  # every site decodes the same bytes
            if step == 0:
                bound = sum(error_bound(compress, x) for x in xs)
                assert np.all(np.abs(arrays[0] - fixed_order_sum(xs)) <= bound)
            for k, g in enumerate(groups):
                residual = g.feedback.residual("w")
                assert residual is not None and np.any(residual != 0)
                # what site k has transmitted so far is (steps x input) minus the residual still owed
                transmitted[k] = (step + 1) * xs[k].astype(np.float64) - residual
        # Error feedback: the sum of transmitted values over the steps converges to steps x input;
        # what is left is one step's residual, bounded by one quantisation error, not `steps` of them.
        for k in range(2):
            drift = np.abs(transmitted[k] - steps * xs[k].astype(np.float64))
            assert np.all(drift <= error_bound(compress, xs[k]) * 1.01 + 1e-30)
        cross = groups[0].stats()[-1].sent_bytes
        assert cross < 50_000 * 4 / (3.5 if compress == "int8" else 1.9)
    finally:
        await close_all(groups)


async def test_mismatched_collectives_raise_at_every_site_and_the_group_goes_on(pki: Path) -> None:
    groups = await join_all(pki, 3)
    try:
        calls = [groups[0].all_reduce(np.ones(10, np.float32)),
                 groups[1].all_reduce(np.ones(11, np.float32)),
                 groups[2].all_reduce(np.ones(10, np.float32))]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert all(isinstance(r, CollectiveError) for r in results), results
        assert "count 10 here vs 11" in str(results[0]) and "site-1" in str(results[0])
        assert "count 11 here vs 10" in str(results[1])
        results = await asyncio.gather(groups[0].all_reduce(np.ones(4, np.float32)),
                                       groups[1].barrier(), groups[2].all_reduce(np.ones(4, np.float64)),
                                       return_exceptions=True)
        assert all(isinstance(r, CollectiveError) for r in results), results
        # Site 0 names whichever mismatch it hears of first: site 1's op or site 2's dtype.
        assert ("op 'all_reduce' here vs 'barrier'" in str(results[0])
                or "site-2 (rank 2) called a different collective: dtype '<f4' here vs '<f8'"
                in str(results[0]))
        assert "dtype" in str(results[2]) or "op" in str(results[2])
        arrays = [np.full(5, k, np.float32) for k in range(3)]  # the same group still works
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        assert all(a.tolist() == [3.0] * 5 for a in arrays)
    finally:
        await close_all(groups)


async def test_async_handles_overlap_and_complete_in_any_order(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        buckets = [inputs(2, 20_000 * (b + 1), seed=b) for b in range(4)]
        work = [[x.copy() for x in bucket] for bucket in buckets]
        handles = [[g.all_reduce_async(work[b][k], name=f"b{b}") for b in range(4)]
                   for k, g in enumerate(groups)]
        assert all(not h.done() for hs in handles for h in hs)  # all four started, none finished yet
        for hs in handles:
            for h in reversed(hs):
                await h
        for b, bucket in enumerate(buckets):
            expected = fixed_order_sum(bucket).tobytes()
            assert work[b][0].tobytes() == expected and work[b][1].tobytes() == expected
        assert all(h.elapsed_s is not None for hs in handles for h in hs)
    finally:
        await close_all(groups)


async def test_stalled_peer_times_out_naming_it_and_the_group_is_rebuilt(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        with pytest.raises(CollectiveError, match="site-1") as info:
            await groups[0].all_reduce(np.ones(100, np.float32), timeout=0.5)
        assert info.value.site == "site-1"
        with pytest.raises(CollectiveError, match="unusable"):
            await groups[0].barrier()
    finally:
        await close_all(groups)
    groups = await join_all(pki, 2)  # rebuilt in the same process
    try:
        arrays = [np.full(3, 2.0, np.float32), np.full(3, 5.0, np.float32)]
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        assert arrays[0].tolist() == arrays[1].tolist() == [7.0] * 3
    finally:
        await close_all(groups)


async def test_peer_leaving_fails_the_waiting_call_naming_it(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        waiting = asyncio.ensure_future(groups[0].all_reduce(np.ones(100, np.float32), timeout=30))
        await groups[1].close()
        with pytest.raises(CollectiveError, match="site-1"):
            await waiting
    finally:
        await close_all(groups)


async def test_bad_arguments_are_one_line_errors(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        with pytest.raises(ValueError, match="compress"):
            await groups[0].all_reduce(np.ones(3, np.float64), compress="int8")
        with pytest.raises(ValueError, match="op"):
            await groups[0].all_reduce(np.ones(3, np.float32), op="max")
        with pytest.raises(ValueError, match="mean"):
            await groups[0].all_reduce(np.ones(3, np.int64), op="mean")
        with pytest.raises(ValueError, match="root"):
            await groups[0].broadcast(np.ones(3), root=2)
    finally:
        await close_all(groups)


async def test_a_site_with_bad_arguments_fails_its_peers_at_once_naming_it(pki: Path) -> None:
    """The bad site raises ValueError; the others' matching calls fail with CollectiveError
    naming it and the problem long before their timeout, and the group goes on."""
    groups = await join_all(pki, 3, timeout=60.0)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        calls = [groups[0].all_reduce(np.ones(10, np.float32)),
                 groups[1].all_reduce(np.ones(10, np.float32), op="max"),
                 groups[2].all_reduce(np.ones(10, np.float32))]
        results = await asyncio.gather(*calls, return_exceptions=True)
        assert isinstance(results[1], ValueError) and "op" in str(results[1]), results
        for k in (0, 2):
            error = results[k]
            assert isinstance(error, CollectiveError), results
            assert error.site == "site-1" and "bad arguments" in str(error) and "'max'" in str(error)
        later = [groups[0].broadcast(np.ones(3), root=1),
                 groups[1].broadcast(np.ones(3), root=1),
                 groups[2].broadcast(np.ones(3), root=7)]  # site 2 asks for a root that is not there
        results = await asyncio.gather(*later, return_exceptions=True)
        assert isinstance(results[2], ValueError), results
        assert all(isinstance(r, CollectiveError) and r.site == "site-2" and "root" in str(r)
                   for r in results[:2]), results
        assert loop.time() - started < 20.0  # no call waited out its 60 s timeout
        arrays = [np.full(5, k, np.float32) for k in range(3)]  # the same group still works
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        assert all(a.tolist() == [3.0] * 5 for a in arrays)
    finally:
        await close_all(groups)


async def test_group_sessions_acknowledge_at_the_wan_delay_on_both_sides(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        configs = [link.session.endpoint.config.session for g in groups for link in g.links.values()]
        assert [c.max_ack_delay_s for c in configs] == [COLLECTIVE.ack_delay_s] * 2
        assert [c.min_ack_delay_s for c in configs] == [None] * 2  # fixed: WAN paths only
        assert [c.ack_threshold for c in configs] == [COLLECTIVE.segments] * 2  # an ACK per core packet
        # The gateway's own default serves any path: an eighth of the path's RTT, 1 to 10 ms.
        assert (GatewayOptions().min_ack_delay_s, GatewayOptions().ack_delay_s) == (0.001, 0.010)
    finally:
        await close_all(groups)
    with pytest.raises(ValueError, match="ack_delay_s"):
        GatewayOptions(ack_delay_s=0.0)


def per_step_state(group: Group) -> dict[str, int]:
    """Everything a group, its links and their sessions keep that could grow per collective."""
    sizes = {"inbox": len(group._inbox), "waiters": len(group._waiters),
             "finished": sum(len(q.finished) for q in group._sequences.values()),
             "sequences": len(group._sequences),
             "tallies": len(group._tallies), "send_sending": len(group.send_pool._sending),
             "send_over": len(group.send_pool._over)}
    for link in group.links.values():
        session, endpoint = link.session, link.session.endpoint
        for name, size in {"verdicts": len(session._completions), "announced": len(session._announced),
                           "announce_waiters": len(session._announce_waiters), "sends": len(link._sends),
                           "pool_by_shard": len(link.pool._by_shard), "pool_held": len(link.pool._held),
                           "acks": len(endpoint._acks), "rx_buffers": len(endpoint.verifier._buffers),
                           "hashers": len(endpoint.verifier._hashers),
                           "outgoing": len(endpoint.session.outgoing.shards),
                           "incoming": len(endpoint.session.incoming.shards)}.items():
            sizes[name] = sizes.get(name, 0) + size
    return sizes


async def test_per_step_state_stays_bounded_over_many_steps(pki: Path) -> None:
    """A training run calls the same collectives for months: after the first steps, nothing
    a group or its sessions hold may grow with the number of steps (the session's verdicts
    did: the link never forgot them)."""
    groups = await join_all(pki, 2)
    try:
        async def steps(n: int) -> None:
            for _ in range(n):
                arrays = [np.ones(1_000, np.float32) for _ in groups]
                await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
                await asyncio.gather(*(g.barrier() for g in groups))
            await asyncio.gather(*(link.drain(5.0) for g in groups for link in g.links.values()))

        await steps(10)
        early = [per_step_state(g) for g in groups]
        await steps(40)
        late = [per_step_state(g) for g in groups]
        for before, after in zip(early, late, strict=True):
            grown = {k: (before[k], after[k]) for k in after if after[k] > max(before[k], 4)}
            assert not grown, grown  # 100 collectives later: nothing grew
            assert after["verdicts"] <= 2, after
    finally:
        await close_all(groups)


def test_sync_group_from_threads(pki: Path) -> None:
    import threading

    from collective_helpers import mesh_paths, paths_of, site_names

    from wanxport.collective import join_sync

    names, pairs = site_names(2), mesh_paths(2)
    groups: list = [None, None]

    def open_site(k: int) -> None:
        groups[k] = join_sync(k, names, identity=pki / names[k], ca=pki / "ca.pem",
                              paths=paths_of(k, 2, pairs), timeout=30.0)

    threads = [threading.Thread(target=open_site, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    xs = inputs(2, 10_000, seed=1)
    arrays = [x.copy() for x in xs]
    try:
        handles = [g.all_reduce_async(a) for g, a in zip(groups, arrays, strict=True)]
        results = [h.wait(30) for h in handles]
        assert results[0] is arrays[0]
        assert arrays[0].tobytes() == arrays[1].tobytes() == fixed_order_sum(xs).tobytes()
        blocking = [threading.Thread(target=g.barrier) for g in groups]
        for t in blocking:
            t.start()
        for t in blocking:
            t.join(30)
        assert [s.op for s in groups[0].stats()] == ["all_reduce", "barrier"]
        pairs = [g.new_group([0, 1]) for g in groups]  # on the same loop and sessions
        box = np.zeros(5)
        sending = pairs[0].isend(np.arange(5.0), dst=1, tag=2)
        assert pairs[1].irecv(box, src=0, tag=2).wait(30) is box
        sending.wait(30)
        assert box.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
        for pair in pairs:
            pair.close()  # the subgroup only: the world's group goes on
        assert [s.op for s in groups[0].stats()] == ["all_reduce", "barrier"]
        handles = [g.all_reduce_async(np.ones(2)) for g in groups]
        assert [h.wait(30).tolist() for h in handles] == [[2.0, 2.0]] * 2
    finally:
        for g in groups:
            g.close()


async def test_killed_peer_process_raises_naming_it_within_the_timeout(pki: Path) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from collective_helpers import mesh_paths, site_names

    from wanxport.collective import join

    names, pairs = site_names(2), mesh_paths(2)
    spec = {"pki": str(pki), "site": 1, "names": names, "paths": pairs[(0, 1)]}
    peer = subprocess.Popen([sys.executable, str(Path(__file__).with_name("collective_peer.py")),
                             json.dumps(spec)], stdout=subprocess.PIPE, text=True)
    group = None
    try:
        group = await join(0, names, identity=pki / names[0], ca=pki / "ca.pem", paths=pairs[(0, 1)],
                           timeout=30.0, join_timeout=30.0)
        ones = np.ones(1000, dtype=np.float32)
        await group.all_reduce(ones)
        assert ones[0] == 2.0
        assert await asyncio.to_thread(peer.stdout.readline) == "joined\n"
        os.kill(peer.pid, signal.SIGKILL)
        started = time.monotonic()
        with pytest.raises(CollectiveError, match="site-1") as info:
            await group.all_reduce(np.ones(1000, dtype=np.float32), timeout=8.0)
        elapsed = time.monotonic() - started
        # The call's own timeout bounds it (a hang would last the session's 30 s); the
        # margin is the event loop's scheduling on a busy host, not a performance figure.
        assert elapsed < 8.0 + 2.0 and info.value.site == "site-1", (elapsed, str(info.value))
    finally:
        if peer.poll() is None:
            peer.kill()
        peer.wait()
        if group is not None:
            await group.close()


async def test_receive_buffers_are_reused_across_steps_without_mixing_steps(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        for step in range(5):
            xs = inputs(2, 30_000, seed=100 + step)
            arrays = [x.copy() for x in xs]
            await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
            assert arrays[0].tobytes() == arrays[1].tobytes() == fixed_order_sum(xs).tobytes()
        assert all(link.pool.reused >= 3 for g in groups for link in g.links.values())
        assert all(g.send_pool.reused >= 3 for g in groups)
    finally:
        await close_all(groups)


@pytest.mark.parametrize("compress", [None, "int8"])
async def test_send_buffers_are_reused_on_three_sites_without_mixing_steps(pki: Path, compress: str | None,
                                                                          ) -> None:
    """Each step's parts go out of reused buffers (n > 2: one per part); a buffer written
    again too early would put one step's bytes into another's sums."""
    groups = await join_all(pki, 3)
    try:
        for step in range(4):
            xs = inputs(3, 30_001, seed=200 + step)
            arrays = [x.copy() for x in xs]
            await asyncio.gather(*(g.all_reduce(a, compress=compress) for g, a in zip(groups, arrays,
                                                                                     strict=True)))
            assert arrays[0].tobytes() == arrays[1].tobytes() == arrays[2].tobytes()
            if compress is None:
                assert arrays[0].tobytes() == fixed_order_sum(xs).tobytes()
        assert all(g.send_pool.reused >= 2 for g in groups)
    finally:
        await close_all(groups)
