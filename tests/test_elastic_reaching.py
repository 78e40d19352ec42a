"""A member's background sessions with a site asking to join (``elastic_admit.Reaching``),
on fakes of the world, the sites and the membership record: which session ends up the link."""

from __future__ import annotations

import asyncio
from typing import Any

from wanxport.collective.elastic_admit import Reaching

JOINER, TICKET = 2, 7


class FakeSession:
    def __init__(self) -> None:
        self.closed_with: str | None = None

    async def close(self, reason: str) -> None:
        self.closed_with = reason


class FakeWorld:
    def __init__(self) -> None:
        self.links: dict[int, FakeSession] = {}
        self.gone: dict[int, Exception] = {}

    async def replace_link(self, peer: int, session: FakeSession, listener: Any, pool: Any) -> None:
        self.links[peer] = session
        self.gone.pop(peer, None)


class FakeSites:
    """Site 0; its setup with the joiner finishes when ``ready`` is set."""

    site, connect_s = 0, 5.0
    names = ["site-0", "site-1", "site-2"]

    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.session = FakeSession()

    async def connect(self, peer: int, deadline: float) -> tuple[FakeSession, None, None]:
        await self.ready.wait()
        return self.session, None, None


class FakeMembership:
    def __init__(self) -> None:
        self.marks: list[tuple[int, int]] = []

    async def mark_reached(self, ticket: int, site: int) -> None:
        self.marks.append((ticket, site))


async def test_a_setup_still_under_way_when_its_site_is_admitted_becomes_the_link() -> None:
    """The epoch admitting the joiner can come before this member's own setup with it ends
    (another member's record proposed it). Entering it waits for that setup, which then
    becomes the link: closed as not needed, it left the joiner, which holds the same
    session as its link to us, without one."""
    world, sites, membership = FakeWorld(), FakeSites(), FakeMembership()
    reaching = Reaching(world, sites, membership)  # type: ignore[arg-type]
    await reaching.start({JOINER: TICKET})
    assert JOINER not in world.links  # under way in the background
    entering = asyncio.ensure_future(reaching.admit((0, 1, JOINER), (JOINER,), timeout=5.0))
    await asyncio.sleep(0)  # one turn of the loop: entering the epoch has begun
    sites.ready.set()  # the setup ends while the epoch is being entered
    await entering
    assert sites.session.closed_with is None
    assert world.links[JOINER] is sites.session
    assert membership.marks == [(TICKET, 0)]
    assert reaching.pending() == set()  # a member now: no longer asking


async def test_a_setup_that_outlasts_the_wait_is_stopped() -> None:
    world, sites, membership = FakeWorld(), FakeSites(), FakeMembership()
    reaching = Reaching(world, sites, membership)  # type: ignore[arg-type]
    await reaching.start({JOINER: TICKET})
    await reaching.admit((0, 1, JOINER), (JOINER,), timeout=0.05)
    sites.ready.set()  # too late: the setup was cancelled
    await asyncio.sleep(0)
    assert JOINER not in world.links and membership.marks == []  # the epoch's own setup follows
