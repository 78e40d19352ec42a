"""The sessions a site holds with every other site, and the groups multiplexed on them.

``join`` makes one ``World`` per site: one persistent session per pair of sites that
has paths (``mesh``; a pair without is relayed by the all-reduce), and the
whole-world group. Any subset of the sites that includes this
one forms another group with ``world.new_group(members)`` (or ``group.new_group``):
it has no ports or sessions of its own — its messages carry its group id in the
header and travel on the world's sessions, and the world hands each arriving
message to its group by that id.

Group ids are agreed without a message: the id of the k-th group a site creates
with a given member set is a hash of (the sorted members, k), so the members get the
same id however the program interleaves groups of other member sets, and sites that
are not members need not create it at all. A message for a group this site has not
created yet waits until it is (a peer may start a call on a new group first).

A member's session failing (it died, closed, or went silent past its liveness
bound) is recorded here once and fails every group containing it, now and later;
groups without it are untouched. A mismatch or refusal in one group is that
group's business only.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession

from .errors import CollectiveError
from .link import LIVENESS_MIN_S, PING, SiteLink
from .message import Header, new_payload
from .pool import ReceivePool

if TYPE_CHECKING:
    from .group import Group

log = logging.getLogger(__name__)

HEARD_POLL_S = 0.02  # while waiting to hear from sites (``heard_from``)
EARLY_KEPT = 4096  # messages held for groups not created here yet (beyond: the link fails)


def group_id(members: Sequence[int], index: int | str) -> int:
    """The id of the ``index``-th group created with ``members`` (sorted world ranks), or of
    the one tagged ``index``."""
    text = ",".join(map(str, members)) + f"/{index}"
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=4).digest(), "little")


class World:
    """This site (``site``, an index of ``names``) and its links to every other site."""

    def __init__(self, site: int, names: Sequence[str], timeout_s: float,
                 liveness_min_s: float = LIVENESS_MIN_S, schedule: str = "auto",
                 deterministic: bool = False) -> None:
        self.site = site
        self.schedule = schedule  # the groups' all-reduce schedule ("auto" or one of schedule.SCHEDULES)
        self.deterministic = deterministic  # ... and whether it stays one for each group's life
        self.names = list(names)
        self.timeout_s = timeout_s
        self.liveness_min_s = liveness_min_s
        self.links: dict[int, SiteLink] = {}
        self.groups: dict[int, Group] = {}
        self.root_gid: int | None = None  # the whole world's group (``join`` returns it)
        self.gone: dict[int, CollectiveError] = {}  # world rank -> why it is gone
        self.stale_messages = 0  # messages for groups closed here (dropped)
        # world rank -> bytes/s its last ended link carried to it (a site that restarts comes
        # back on the same network: the best-connected holder sends it the state)
        self.carried_bps: dict[int, float] = {}
        self._created: dict[tuple[int, ...], int] = {}
        self._retired: set[int] = set()
        self._early: dict[int, list[tuple[int, Header, npt.NDArray[np.uint8]]]] = {}
        self._early_count = 0
        self._closed = False

    def add_link(self, peer: int, session: GatewaySession, listener: GatewayListener | None,
                 pool: ReceivePool | None = None) -> None:
        """``pool``: the one whose ``allocate`` the session was set up with (buffers reused)."""
        self.links[peer] = SiteLink(peer, self.names[peer], session, self._deliver, self._link_failed,
                                    listener, pool, self.liveness_min_s)

    def new_group(self, members: Iterable[int], timeout_s: float | None = None, tag: str | None = None,
                  ) -> Group | None:
        """A group of the world ranks ``members`` (this site among them), on the world's sessions;
        None where this site is not a member (it may skip the call: ids do not depend on it).
        ``tag`` names the group instead of the count of groups of ``members`` made here (an
        elastic epoch: a site that restarted has made none yet)."""
        from .group import Group

        ranks = tuple(sorted(set(members)))
        if not ranks or any(not (isinstance(r, int) and 0 <= r < len(self.names)) for r in ranks):
            raise ValueError(f"members: {list(members)} must be world ranks 0..{len(self.names) - 1}")
        if self.site not in ranks:
            return None
        if self._closed:
            raise CollectiveError("the world is closed")
        index = self._created.get(ranks, 0)
        if tag is None:
            self._created[ranks] = index + 1
        gid = group_id(ranks, index if tag is None else tag)
        if gid in self.groups or gid in self._retired:
            raise CollectiveError(f"group id {gid:#x} of {list(ranks)} #{index} collides with another "
                                  "group's")
        group = Group(self, gid, ranks, self.timeout_s if timeout_s is None else timeout_s)
        self.groups[gid] = group
        for rank, error in self.gone.items():
            if rank in ranks:
                group.member_lost(error)
        for peer, header, body in self._early.pop(gid, []):
            self._early_count -= 1
            group.deliver(group.rank_of[peer], header, body)
        return group

    async def replace_link(self, peer: int, session: GatewaySession, listener: GatewayListener | None,
                           pool: ReceivePool) -> None:
        """A new session with ``peer`` (it restarted, or came back after a cut): the old link
        ends and ``peer`` is no longer gone for groups made from now on."""
        await self.drop_link(peer)
        self.gone.pop(peer, None)
        self.add_link(peer, session, listener, pool)

    async def drop_link(self, peer: int) -> None:
        """End the session with ``peer`` (gone, or left out of the membership); its ports go back."""
        link = self.links.pop(peer, None)
        if link is not None:
            carried = link.carried_bps()
            if carried > 0:
                self.carried_bps[peer] = carried
            await link.close()

    async def heard_from(self, members: tuple[int, ...]) -> tuple[int, ...]:
        """The sites of ``members`` heard from after now (each pinged), within their liveness
        bound; this site is kept. A site cut off from every other sees its sessions fail
        one by one: without fresh word it would count a peer it has lost too as live."""
        links = {m: self.links[m] for m in members if m != self.site and m in self.links}
        since = {m: link.session.endpoint.clock() for m, link in links.items()}
        for link in links.values():
            link.send(PING, new_payload(0))
        deadline = time.monotonic() + max((link.liveness_bound_s() for link in links.values()), default=0.0)
        waiting = set(links)
        while waiting and time.monotonic() < deadline:
            waiting = {m for m in waiting
                       if links[m].failure is None and links[m].last_heard()[1] <= since[m]}
            if waiting:
                await asyncio.sleep(HEARD_POLL_S)
        return tuple(m for m in members if m not in waiting and m not in self.gone)

    def retire(self, group: Group) -> None:
        """``group`` is closed here: later messages for it are dropped."""
        self.groups.pop(group.gid, None)
        self._retired.add(group.gid)

    async def close(self, drain_s: float = 5.0) -> None:
        """Close every group, let our last messages land (bounded), end every session."""
        if not self._closed:
            await asyncio.gather(*(link.drain(drain_s) for link in self.links.values()))
        self._closed = True
        for group in list(self.groups.values()):
            group.closed_by_world()
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)

    def _deliver(self, link: SiteLink, header: Header, body: npt.NDArray[np.uint8]) -> bool:
        gid = header.call.group
        group = self.groups.get(gid)
        if group is not None:
            return group.deliver(group.rank_of[link.index], header, body)
        if gid in self._retired:
            self.stale_messages += 1
            return False
        if self._early_count >= EARLY_KEPT:
            raise CollectiveError(f"site {link.name}: more than {EARLY_KEPT} messages for groups never "
                                  f"created here (latest: group {gid:#x})", link.name)
        self._early.setdefault(gid, []).append((link.index, header, body))
        self._early_count += 1
        return True

    def _link_failed(self, link: SiteLink, error: CollectiveError) -> None:
        if self.links.get(link.index) is not link:
            return  # a link replaced or dropped already
        self.gone.setdefault(link.index, error)
        for group in list(self.groups.values()):
            if link.index in group.rank_of:
                group.member_lost(error)
