"""Calls both ends agree on before data moves, and point-to-point between sites.

A call refused at one site (a bad argument of any kind) takes its sequence number
and tells the others, so the others' matching call fails naming the site and the
reason, and the next call still pairs; a call whose signature differs (op, dtype,
shape, compression, reduction, root; for point-to-point dtype and shape) fails at
every site naming both sides' values. Point-to-point messages match by (source,
destination, tag, order), any size.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import CollectiveError, Group

pytestmark = pytest.mark.timeout(120)

Call = Callable[[Group], Coroutine[Any, Any, Any]]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


def good_all_reduce(g: Group) -> Coroutine[Any, Any, Any]:
    return g.all_reduce(np.ones(12, np.float32))


# One site's bad call of every kind against the others' good call of the same op.
REFUSALS: dict[str, tuple[Call, Call, str]] = {
    "reduce op": (lambda g: g.all_reduce(np.ones(12, np.float32), op="max"), good_all_reduce, "'max'"),
    "codec for the dtype": (lambda g: g.all_reduce(np.ones(12, np.float64), compress="int8"),
                            lambda g: g.all_reduce(np.ones(12, np.float64)), "compress"),
    "mean of integers": (lambda g: g.all_reduce(np.ones(12, np.int64), op="mean"),
                         lambda g: g.all_reduce(np.ones(12, np.int64)), "mean"),
    "not an array": (lambda g: g.all_reduce("twelve"), good_all_reduce, "str"),
    "root": (lambda g: g.broadcast(np.ones(3), root=9), lambda g: g.broadcast(np.ones(3), root=0), "root"),
    "gather out": (lambda g: g.all_gather(np.ones(3), out=np.empty((2, 3))),
                   lambda g: g.all_gather(np.ones(3)), "out"),
    "scatter array": (lambda g: g.reduce_scatter(object()), lambda g: g.reduce_scatter(np.ones(9)), "object"),
}


@pytest.mark.parametrize("kind", list(REFUSALS))
async def test_a_call_refused_at_one_site_fails_everywhere_with_the_reason_and_the_next_pairs(
        pki: Path, kind: str) -> None:
    bad, good, reason = REFUSALS[kind]
    groups = await join_all(pki, 3, timeout=60.0)
    try:
        results = await asyncio.gather(good(groups[0]), bad(groups[1]), good(groups[2]),
                                       return_exceptions=True)
        assert isinstance(results[1], ValueError) and reason in str(results[1]), results
        for k in (0, 2):
            error = results[k]
            assert isinstance(error, CollectiveError), results
            assert error.site == "site-1" and "refused" in str(error) and reason in str(error), str(error)
        arrays = [np.full(5, 10.0 ** k, np.float32) for k in range(3)]  # the next call pairs with the next
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        assert all(a.tolist() == [111.0] * 5 for a in arrays)
    finally:
        await close_all(groups)


async def test_the_issue_case_a_refused_call_never_pairs_with_the_next_one(pki: Path) -> None:
    """Site 0's refused call and then a call of the same element count: site 1's first call
    must fail (not sum with site 0's second call), and the second calls sum correctly."""
    groups = await join_all(pki, 2, timeout=60.0)
    try:
        first = await asyncio.gather(groups[0].all_reduce(np.ones(4, np.float32), op="product"),
                                     groups[1].all_reduce(np.full(4, 1.0, np.float32)),
                                     return_exceptions=True)
        assert isinstance(first[0], ValueError) and isinstance(first[1], CollectiveError), first
        second = [np.full(4, 100.0, np.float32), np.full(4, 1.0, np.float32)]
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, second, strict=True)))
        assert second[0].tolist() == second[1].tolist() == [101.0] * 4
    finally:
        await close_all(groups)


MISMATCHES: dict[str, tuple[Call, Call, str]] = {
    "shape": (lambda g: g.all_reduce(np.ones((3, 4), np.float32)),
              lambda g: g.all_reduce(np.ones((4, 3), np.float32)), "shape (3, 4) here vs (4, 3)"),
    "dtype": (lambda g: g.all_gather(np.ones(4, np.float32)),
              lambda g: g.all_gather(np.ones(4, np.int32)), "dtype '<f4' here vs '<i4'"),
    "op": (lambda g: g.barrier(), lambda g: g.broadcast(np.ones(0, np.uint8)),
           "op 'barrier' here vs 'broadcast'"),
    "compression": (lambda g: g.all_reduce(np.ones(8, np.float32), compress="bf16"),
                    lambda g: g.all_reduce(np.ones(8, np.float32)), "compress 'bf16' here vs None"),
    "reduction": (lambda g: g.all_reduce(np.ones(8, np.float32), op="mean"),
                  lambda g: g.all_reduce(np.ones(8, np.float32)), "reduce 'mean' here vs 'sum'"),
    "root": (lambda g: g.broadcast(np.ones(2), root=0), lambda g: g.broadcast(np.ones(2), root=1),
             "root 0 here vs 1"),
}


@pytest.mark.parametrize("kind", list(MISMATCHES))
async def test_a_signature_mismatch_names_both_values_at_both_sites(pki: Path, kind: str) -> None:
    mine, theirs, message = MISMATCHES[kind]
    groups = await join_all(pki, 2, timeout=60.0)
    try:
        results = await asyncio.gather(mine(groups[0]), theirs(groups[1]), return_exceptions=True)
        assert all(isinstance(r, CollectiveError) for r in results), results
        assert message in str(results[0]) and results[0].site == "site-1", str(results[0])
        field, _, rest = message.partition(" ")
        here, _, there = rest.partition(" here vs ")
        assert f"{field} {there} here vs {here}" in str(results[1]), str(results[1])
        arrays = [np.full(3, 2.0, np.float32), np.full(3, 5.0, np.float32)]  # the group goes on
        await asyncio.gather(*(g.all_reduce(a) for g, a in zip(groups, arrays, strict=True)))
        assert arrays[0].tolist() == arrays[1].tolist() == [7.0] * 3
    finally:
        await close_all(groups)


# -- point-to-point --------------------------------------------------------------


@pytest.mark.parametrize("nbytes", [0, 1, 64 << 10, 1 << 20])
async def test_send_recv_sizes_arrive_exactly(pki: Path, nbytes: int) -> None:
    groups = await join_all(pki, 2)
    try:
        data = np.random.default_rng(nbytes).integers(0, 256, nbytes, dtype=np.uint8)
        into = np.zeros(nbytes, np.uint8)
        await asyncio.gather(groups[0].send(data, dst=1, tag=3), groups[1].recv(into, src=0, tag=3))
        assert into.tobytes() == data.tobytes()
        assert [s.op for s in groups[0].stats()] == ["send"] and groups[1].stats()[0].op == "recv"
    finally:
        await close_all(groups)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_send_recv_256_mib(pki: Path) -> None:
    groups = await join_all(pki, 2)
    try:
        data = np.random.default_rng(256).standard_normal(64 << 20).astype(np.float32)  # 256 MiB
        into = np.empty_like(data)
        await asyncio.gather(groups[0].send(data, dst=1), groups[1].recv(into, src=0))
        assert into.tobytes() == data.tobytes()
    finally:
        await close_all(groups)


async def test_tags_match_by_source_tag_and_order_whatever_order_receives_are_posted(pki: Path) -> None:
    groups = await join_all(pki, 3)
    try:
        sends = [groups[0].isend(np.full(4, 10 * tag + i, np.int64), dst=2, tag=tag)
                 for i in range(2) for tag in (1, 2, 3)]
        sends += [groups[1].isend(np.full(4, 100 + i, np.int64), dst=2, tag=1) for i in range(2)]
        # Site 2 posts its receives in another order than the sends: tag 3 first, then 1 from site 1.
        order = [(0, 3), (1, 1), (0, 1), (0, 2), (1, 1), (0, 3), (0, 2), (0, 1)]
        boxes = [np.zeros(4, np.int64) for _ in order]
        receives = [groups[2].irecv(box, src=src, tag=tag)
                    for box, (src, tag) in zip(boxes, order, strict=True)]
        for handle in (*sends, *receives):
            await handle
        assert [int(b[0]) for b in boxes] == [30, 100, 10, 20, 101, 31, 21, 11]
    finally:
        await close_all(groups)


P2P_MISMATCHES = {
    "dtype": (np.zeros(6, np.float32), np.zeros(6, np.int32), "dtype '<f4' here vs '<i4'"),
    "shape": (np.zeros((2, 3), np.float32), np.zeros((3, 2), np.float32), "shape (2, 3) here vs (3, 2)"),
    "count": (np.zeros(6, np.float32), np.zeros(7, np.float32), "count 6 here vs 7"),
}


@pytest.mark.parametrize("kind", list(P2P_MISMATCHES))
async def test_a_send_and_receive_that_disagree_fail_at_both_ends_naming_both(pki: Path, kind: str) -> None:
    sent, into, message = P2P_MISMATCHES[kind]
    groups = await join_all(pki, 2, timeout=60.0)
    try:
        results = await asyncio.gather(groups[0].send(sent, dst=1, tag=5), groups[1].recv(into, src=0, tag=5),
                                       return_exceptions=True)
        assert all(isinstance(r, CollectiveError) for r in results), results
        assert message in str(results[0]) and results[0].site == "site-1", str(results[0])
        assert not into.any()  # nothing was copied
        field, _, rest = message.partition(" ")
        here, _, there = rest.partition(" here vs ")
        assert f"{field} {there} here vs {here}" in str(results[1]) and results[1].site == "site-0"
        ok = np.zeros(2, np.float64)
        await asyncio.gather(groups[0].send(np.ones(2), dst=1, tag=5), groups[1].recv(ok, src=0, tag=5))
        assert ok.tolist() == [1.0, 1.0]  # the next message of the same tag pairs with the next receive
    finally:
        await close_all(groups)


async def test_a_refused_send_or_receive_tells_the_other_end_and_order_holds(pki: Path) -> None:
    groups = await join_all(pki, 2, timeout=60.0)
    try:
        into = np.zeros(3)
        results = await asyncio.gather(groups[0].send("not an array", dst=1), groups[1].recv(into, src=0),
                                       return_exceptions=True)
        assert isinstance(results[0], ValueError), results
        assert isinstance(results[1], CollectiveError) and "refused" in str(results[1]) \
            and results[1].site == "site-0", results
        frozen = np.zeros(3)
        frozen.flags.writeable = False
        results = await asyncio.gather(groups[0].send(np.ones(3), dst=1), groups[1].recv(frozen, src=0),
                                       return_exceptions=True)
        assert isinstance(results[1], ValueError) and "read-only" in str(results[1]), results
        assert isinstance(results[0], CollectiveError) and "read-only" in str(results[0]) \
            and results[0].site == "site-1", results
        await asyncio.gather(groups[0].send(np.full(3, 7.0), dst=1), groups[1].recv(into, src=0))
        assert into.tolist() == [7.0] * 3
        with pytest.raises(ValueError, match="dst"):
            await groups[0].send(np.ones(3), dst=0)  # itself: no other site is involved
    finally:
        await close_all(groups)
