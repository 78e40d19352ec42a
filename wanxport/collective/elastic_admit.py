"""Admitting a site without stopping the members: the sessions first, then the epoch.

A site that asks to join (a ticket in the store) is admitted only once every member
has a session with it. A member starts setting its session up in the background at the
first boundary where it sees the ticket and keeps stepping meanwhile; once the session
is up it records so in the store. The joiner sets up its sessions with every member at
the same time. A member that finds every member's record at a boundary proposes the
epoch that admits the joiner from its next step, and entering that epoch costs no
session setup. A joiner the members cannot reach (blackholed, or on a partition's other
side) is never proposed, so the members never stop for it: their attempts end in the
background, and the joiner asks again when its own attempt ends.
"""

from __future__ import annotations

import asyncio
import logging
import time

from .membership import Membership
from .mesh import Sites, connect_pair
from .world import World

log = logging.getLogger("wanxport.collective.elastic")


class Reaching:
    """A member's background sessions with the sites asking to join."""

    def __init__(self, world: World, sites: Sites, membership: Membership) -> None:
        self.world = world
        self.sites = sites
        self.membership = membership
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._latest: dict[int, int] = {}  # a site asking to join -> its latest ticket seen
        self._marked: dict[int, int] = {}  # ... -> the latest ticket recorded as reached from here

    def alive(self, site: int) -> bool:
        return site in self.world.links and site not in self.world.gone

    def pending(self) -> set[int]:
        """Sites asking to join that this member has a live session with: kept across epochs."""
        return {site for site in self._latest if self.alive(site)}

    async def start(self, asking: dict[int, int]) -> None:
        """Reach each site in ``asking`` (site -> its latest ticket), unless under way or done."""
        for site in [s for s in self._latest if s not in asking]:
            del self._latest[site]
        for site, ticket in asking.items():
            self._latest[site] = ticket
            if self.alive(site):
                await self._mark(site)
            elif site not in self._tasks or self._tasks[site].done():
                self._tasks[site] = asyncio.ensure_future(self._reach(site))

    async def reached(self, asking: dict[int, int], members: tuple[int, ...]) -> list[int]:
        """``start``, then the sites every one of ``members`` has a session with, for that ticket."""
        await self.start(asking)
        return [site for site, ticket in asking.items() if await self.membership.reached_by(ticket, members)]

    def admitted(self, sites: tuple[int, ...]) -> None:
        """``sites`` are members now: no longer asking."""
        for site in sites:
            self._latest.pop(site, None)
            self._marked.pop(site, None)

    async def _mark(self, site: int) -> None:
        ticket = self._latest.get(site)
        if ticket is not None and self._marked.get(site) != ticket:
            await self.membership.mark_reached(ticket, self.sites.site)
            self._marked[site] = ticket

    async def _reach(self, site: int) -> None:
        sites = self.sites
        deadline = time.monotonic() + sites.connect_s  # as long as a joiner waits for us
        try:
            result = await connect_pair(sites.site, site, sites.names, sites.paths[site], sites.identity,
                                        sites.ca, sites.options, deadline)
        except Exception as exc:  # noqa: BLE001 - it asks again; each try costs us nothing
            log.info("site %s: no session with %s, which asks to join (%s: %s)", sites.names[sites.site],
                     sites.names[site], type(exc).__name__, exc)
            return
        if site not in self._latest:  # admitted or gone meanwhile
            session, listener, _ = result
            await session.close("not needed")
            if listener is not None:
                listener.close()
            return
        await self.world.replace_link(site, *result)
        await self._mark(site)

    async def settle(self, sites: tuple[int, ...], timeout: float) -> None:
        """Let the background setups with ``sites`` (being admitted now) finish, for up to
        ``timeout``; then stop them, so the epoch's own setup does not run beside them."""
        running = [self._tasks[s] for s in sites if s in self._tasks and not self._tasks[s].done()]
        if running:
            await asyncio.wait(running, timeout=timeout)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()
