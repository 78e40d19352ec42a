"""The state a joiner receives, over a real 3-site group on loopback: arrays declared shared
come in ranges from every member as far along as the sender (sized by what their links
carried), the rest from the sender alone, bit for bit; members that declare shared arrays
they do not hold alike make the copy fail with nothing loaded."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from collective_helpers import close_all, join_all, make_pki

from wanxport.collective import ArrayState, CollectiveError, elastic_state
from wanxport.collective.elastic_state import shared_ranges, transfer_state

pytestmark = pytest.mark.timeout(120)


class SharedState(ArrayState):
    shared_arrays = ("params", "momentum")


def state_of(site: int, params: np.ndarray) -> SharedState:
    return SharedState({"params": params.copy(), "momentum": params[::2] * np.float32(0.5),
                        "adam": np.full(1000, site, np.float32), "step": np.array([7])})


def agreement(carried: list[int]) -> np.ndarray:
    """Sites 0 and 1 current at step 7, site 2 a joiner; the last column what each member's
    links to the joiner carried."""
    return np.array([[1, 7, 0, 0, carried[0]], [1, 7, 0, 0, carried[1]], [0, 0, 0, 0, 0]], dtype=np.int64)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_pki(tmp_path_factory.mktemp("pki"), 3)


def test_the_shared_bytes_are_split_so_every_helper_ends_together() -> None:
    table = agreement([300, 200])
    ranges = shared_ranges(1000, 200, table, 0, [0, 1])
    assert ranges == {0: (0, 520), 1: (520, 1000)}  # (520 + 200) / 300 == 480 / 200
    assert shared_ranges(1000, 200, agreement([0, 100]), 0, [0, 1]) == {0: (0, 400), 1: (400, 1000)}
    assert shared_ranges(100, 5000, table, 0, [0, 1]) == {0: (0, 0), 1: (0, 100)}  # private alone is longer
    assert shared_ranges(0, 200, table, 0, [0, 1]) == {0: (0, 0), 1: (0, 0)}
    slow = agreement([300, 149])  # under half the best: its share would be the last to arrive
    assert shared_ranges(1000, 200, slow, 0, [0, 1]) == {0: (0, 1000), 1: (1000, 1000)}
    assert shared_ranges(1000, 5000, slow, 0, [0, 1]) == {0: (0, 1000), 1: (1000, 1000)}


@pytest.mark.parametrize(("carried", "sending"), [([200, 100], 2), ([100, 300], 1)])
async def test_a_joiner_gets_the_shared_arrays_from_every_helper_and_the_rest_from_the_source(
        pki: Path, monkeypatch: pytest.MonkeyPatch, carried: list[int], sending: int) -> None:
    """Both helpers send a part; or the lower-ranked one, whose links carried under half the
    source's, sends none (its empty range starts where the source's does)."""
    sent: dict[int, tuple[int, int]] = {}
    original = elastic_state.shared_ranges

    def recording(*args: Any) -> dict[int, tuple[int, int]]:
        ranges = original(*args)
        sent.update(ranges)
        return ranges

    monkeypatch.setattr(elastic_state, "shared_ranges", recording)
    params = np.random.default_rng(3).standard_normal(100_003).astype(np.float32)
    groups = await join_all(pki, 3)
    try:
        states = [state_of(0, params), state_of(1, params), state_of(2, np.zeros(5, np.float32))]
        table = agreement(carried)
        steps = await asyncio.gather(*(transfer_state(g, table, s, 7 if k < 2 else 0)
                                       for k, (g, s) in enumerate(zip(groups, states, strict=True))))
        assert steps == [7, 7, 7]
        got = states[2].arrays
        assert got["params"].tobytes() == params.tobytes()
        assert got["momentum"].tobytes() == states[0].arrays["momentum"].tobytes()
        source = int(np.argmax(carried))
        assert got["adam"].tobytes() == states[source].arrays["adam"].tobytes()  # the source's own, whole
        assert int(got["step"][0]) == 7
        assert len(sent) == 2 and sum(end > start for start, end in sent.values()) == sending
    finally:
        await close_all(groups)


async def test_helpers_that_hold_the_shared_arrays_differently_load_nothing(pki: Path) -> None:
    params = np.random.default_rng(4).standard_normal(10_001).astype(np.float32)
    other = params.copy()
    other[-1] += 1  # one element differs, in the range the second helper sends
    groups = await join_all(pki, 3)
    try:
        joiner = state_of(2, np.zeros(5, np.float32))
        before = dict(joiner.arrays)
        results = await asyncio.gather(transfer_state(groups[0], agreement([1, 1]), state_of(0, params), 7),
                                       transfer_state(groups[1], agreement([1, 1]), state_of(1, other), 7),
                                       transfer_state(groups[2], agreement([1, 1]), joiner, 0),
                                       return_exceptions=True)
        assert results[:2] == [7, 7]
        assert isinstance(results[2], CollectiveError) and "declares shared" in str(results[2])
        assert joiner.arrays == before
    finally:
        await close_all(groups)
