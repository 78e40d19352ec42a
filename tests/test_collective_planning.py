"""The planner's messages without sessions: reports reach the decider and plans reach every site
through sites that forward them (a line 0-1-2-3), windows are published ahead, and a
deterministic plan covers every call with the sessions alone."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from wanxport.collective.costmodel import NO_SESSION
from wanxport.collective.message import HEADER_BYTES, Header, pack, unpack
from wanxport.collective.planning import WINDOW, Planner

N = 4


def line_planners(deterministic: bool = False, measured: list[bool] | None = None,
                  ) -> tuple[list[Planner], list[tuple[int, int, str]]]:
    """Planners of a line 0-1-2-3; every message goes through the wire format, delivered on the
    next loop turn. Returns them and the log of (from, to, op). ``measured[0]``: whether the
    sessions report rates yet (0 otherwise: no bulk data carried), changeable meanwhile."""
    measured = measured if measured is not None else [True]
    planners: list[Planner] = []
    sent: list[tuple[int, int, str]] = []
    loop = asyncio.get_running_loop()

    def sender(site: int):  # type: ignore[no-untyped-def]
        def send(peer: int, header: Header, payload: npt.NDArray[np.uint8]) -> None:
            payload[:HEADER_BYTES] = np.frombuffer(pack(header), dtype=np.uint8)
            got = unpack(payload.tobytes(), str(site))
            sent.append((site, peer, got.call.op))
            loop.call_soon(planners[peer].receive, site, got, payload[HEADER_BYTES:])
        return send

    def measure(site: int):  # type: ignore[no-untyped-def]
        return lambda: ([(1e6 * (site + 1) if measured[0] else 0.0) if abs(site - k) == 1 else NO_SESSION
                         for k in range(N)],
                        [0.01 if abs(site - k) == 1 else 0.0 for k in range(N)])

    for site in range(N):
        neighbours = [k for k in (site - 1, site + 1) if 0 <= k < N]
        planners.append(Planner(7, site, N, neighbours, sender(site), measure(site),
                                deterministic=deterministic))
    return planners, sent


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_reports_and_plans_cross_sites_without_a_session() -> None:
    planners, sent = line_planners()
    waiting = asyncio.ensure_future(planners[3].plan_for(1))  # site 3 has no session with the decider
    for p in planners:
        p.report(force=True)
    first = await asyncio.wait_for(waiting, 5)
    await settle()
    assert all(p.covering(0) == first for p in planners)  # site 3 heard it through 2 and 1
    assert {(frm, to) for frm, to, op in sent if op == "plan"} >= {(0, 1), (1, 2), (2, 3)}
    assert first.mesh.rate[3][2] == 4e6 and first.mesh.rate[0][3] == NO_SESSION
    assert (first.start, first.until) == (0, WINDOW)
    planners[0].on_take(WINDOW - 1)  # the decider takes window 0's last call: window 1 goes out
    await settle()
    assert all(p.covering(WINDOW) is not None and p.covering(WINDOW).start == WINDOW for p in planners)
    assert planners[2].covering(2 * WINDOW) is None


async def test_deterministic_plan_covers_every_call_without_rates() -> None:
    planners, _ = line_planners(deterministic=True)
    for p in planners:
        p.report(force=True)
    await settle()
    plan = planners[2].covering(10_000)
    assert plan is not None and plan.start == 0
    assert not plan.mesh.measured() and plan.mesh.links[1][2] and not plan.mesh.links[0][2]
    planners[0].on_take(WINDOW - 1)
    await settle()
    assert set(planners[3].plans) == {0}


async def test_a_stopped_planner_fails_its_waiters() -> None:
    from wanxport.collective.errors import CollectiveError

    planners, _ = line_planners()
    waiting = asyncio.ensure_future(planners[1].plan_for(0))
    await settle()
    planners[1].fail(CollectiveError("gone"))
    try:
        await waiting
    except CollectiveError as exc:
        assert "gone" in str(exc)
    else:
        raise AssertionError("the waiter did not fail")


async def test_a_plan_on_a_guess_covers_one_call_and_measured_ones_a_window() -> None:
    """Until every pair has carried bulk data the mesh is a guess: its plan covers one call,
    so the next call's plan comes with what the first measured; then whole windows."""
    measured = [False]
    planners, _ = line_planners(measured=measured)
    for p in planners:
        p.report(force=True)
    await settle()
    first = planners[3].covering(0)
    assert first is not None and (first.start, first.until) == (0, 1) and not first.mesh.measured()
    assert planners[3].covering(1) is None
    measured[0] = True
    for p in planners:
        p.report(force=True)
    await settle()
    planners[0].on_take(0)  # the decider takes the guess's only call: the next plan goes out
    await settle()
    second = planners[3].covering(1)
    assert second is not None and (second.start, second.until) == (1, 1 + WINDOW) and second.mesh.measured()
    assert planners[3].covering(1 + WINDOW) is None
