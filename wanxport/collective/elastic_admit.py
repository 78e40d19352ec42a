"""Admitting a site without stopping the members: the sessions first, then the epoch.

A site that asks to join (a ticket in the store) is admitted only once every member
has a session with it. A member starts setting its session up in the background as soon
as it sees the ticket (it looks every 0.25 s) and keeps stepping meanwhile; once the session
is up it records so in the store. The joiner sets up its sessions with every member at
the same time. A member that finds every member's record at a boundary proposes the
epoch that admits the joiner from its next step, and entering that epoch costs no
session setup. A joiner the members cannot reach (blackholed, or on a partition's other
side) is never proposed, so the members never stop for it: their attempts end in the
background, and the joiner asks again when its own attempt ends.

``Reaching`` holds a member's background sessions; the functions below are the group's
steps: the tickets a member watches and answers, and the asking and waiting of a site
left out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .membership import Epoch, Membership
from .mesh import Sites
from .state import ElasticEvent, ElasticState
from .world import World

if TYPE_CHECKING:
    from .elastic import ElasticGroup

log = logging.getLogger("wanxport.collective.elastic")

ADMIT_RETRY_S = 1.0  # a site asked and not admitted asks again after this (doubling) ...
ADMIT_RETRY_MAX_S = 30.0  # ... up to this
TICKET_POLL_S = 0.25  # a member looks for sites asking to join this often, between boundaries too


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

    async def _mark(self, site: int) -> None:
        ticket = self._latest.get(site)
        if ticket is not None and self._marked.get(site) != ticket:
            await self.membership.mark_reached(ticket, self.sites.site)
            self._marked[site] = ticket

    async def _reach(self, site: int) -> None:
        sites = self.sites
        deadline = time.monotonic() + sites.connect_s  # as long as a joiner waits for us
        try:
            result = await sites.connect(site, deadline)
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

    async def admit(self, members: tuple[int, ...], admitted: tuple[int, ...], timeout: float) -> None:
        """Entering an epoch of ``members`` that admits ``admitted``: let the background setups
        with those sites finish, for up to ``timeout``, then stop those still running (the
        epoch's own setup does not run beside them), and only then stop asking for the members.

        In that order, each setup that finishes installs its session as the link. The other
        way round, a setup still under way when the epoch came found its site no longer
        asked for and closed its session as not needed, while the joiner had taken that
        session as its link to us: it was left with no majority and waited, and the members
        waited for it until their timeout."""
        running = [self._tasks[s] for s in admitted if s in self._tasks and not self._tasks[s].done()]
        if running:
            await asyncio.wait(running, timeout=timeout)
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        for site in members:
            self._latest.pop(site, None)
            self._marked.pop(site, None)

    def close(self) -> None:
        for task in self._tasks.values():
            task.cancel()


# -- a member: the sites asking to join -------------------------------------------

async def sites_asking(group: ElasticGroup, current: Epoch) -> dict[int, int]:
    """Sites asking to join ``current`` -> their latest ticket."""
    return {site: ticket for ticket, site in await group.membership.tickets(current.answered)
            if site not in current.members}


async def watch_tickets(group: ElasticGroup) -> None:
    """Start the sessions with a site asking to join as soon as it asks, not at the next
    boundary: by then they are up, and the boundary admits it."""
    while True:
        await asyncio.sleep(TICKET_POLL_S)
        if group.state is ElasticState.RUNNING and group._current and group._due is None:
            try:
                await group._reaching.start(await sites_asking(group, group.epoch))
            except Exception as exc:  # noqa: BLE001 - the boundary looks again; never lose the watch
                log.warning("site %s: looking for sites asking to join failed (%s: %s)", group.name,
                            type(exc).__name__, exc)


async def answer_tickets(group: ElasticGroup, current: Epoch) -> None:
    """Admit, from the next step, the sites asking to join that every member has a session
    with (``Reaching`` sets the sessions up in the background)."""
    asking = await sites_asking(group, current)
    joining = sorted(await group._reaching.reached(asking, current.members))
    if not joining:
        return
    proposal = Epoch(current.number + 1, tuple(sorted({*current.members, *joining})), group._step + 1,
                     tuple(joining), max(asking[site] for site in joining))
    adopted = await group.membership.propose(current, proposal)
    if adopted.number > group.epoch.number:
        group._due = adopted

# -- a site left out: asking to join ----------------------------------------------

async def wait_for_admission(group: ElasticGroup, target: Epoch) -> Epoch:
    """Left out of ``target``: stop, drop every session, ask to join; the epoch that admits us."""
    group._event(ElasticEvent.CANNOT_CONTINUE)
    log.warning("site %s: not a member of epoch %d (%s): waiting to be admitted", group.name,
                target.number, group._names(target.members))
    group._current = False
    await group._close_group()
    for peer in list(group.world.links):
        await group.world.drop_link(peer)
    group.world.gone.clear()
    group.epoch = target
    while True:
        if group._asked:  # asked before and not admitted: the sessions could not be set up
            await asyncio.sleep(group._backoff)
            group._backoff = min(2 * group._backoff, ADMIT_RETRY_MAX_S)
        group._asked = True
        ticket = await group.membership.file_ticket(group.site)
        target = await ask(group, target, ticket)
        if group.site in target.members:
            return target


async def ask(group: ElasticGroup, target: Epoch, ticket: int) -> Epoch:
    """Set up sessions with ``target``'s members (which set theirs up with us in the
    background once they see ``ticket``) while waiting for the epoch that answers it; the
    latest epoch seen: one that admits this site, or not (then ask again)."""
    peers = [m for m in target.members if m != group.site and not group._reaching.alive(m)]
    connecting = asyncio.ensure_future(group._connect(peers, joining=True))
    answer = asyncio.ensure_future(answered(group, target, ticket))
    try:
        await asyncio.wait({connecting, answer}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            await connecting
            if any(m in group.world.gone for m in peers):
                return target  # a member could not be reached: it will not admit us on this ticket
        target = await answer
        await connecting
        return target
    finally:
        for task in (connecting, answer):
            task.cancel()


async def answered(group: ElasticGroup, target: Epoch, ticket: int) -> Epoch:
    while group.site not in target.members and not (target.answered >= ticket):
        target = await group.membership.newer_than(target.number)
    return target
