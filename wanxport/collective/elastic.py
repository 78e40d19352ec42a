"""An elastic group: the sites that are alive go on when one dies or is cut off.

A training run across datacenters outlives its links. A plain group fails every
call once a member is gone (``state``); an elastic group (opt-in: ``elastic_join``)
moves its survivors to a group of the next *epoch* instead. Epochs are agreed
through the job's c10d store (``membership``) and detected by the sessions'
liveness (``link``), nothing else:

- A member gone (its session ended or went silent past the liveness bound): a
  survivor proposes epoch N+1 without it by compare-and-set; every survivor adopts
  the highest epoch. Only a majority of the *configured* sites may continue (so at
  least three sites): a site that cannot form one, is left out of the epoch, or
  cannot reach the store stops and waits to be admitted again.
- Each epoch runs on its own group on the world's sessions (its id is the epoch's
  number), so calls of two epochs never pair. Its first call is an *agreement*:
  every member's [state is current, step, first call not done, calls done beyond
  it]. Where every survivor stopped at the same call, the calls in flight are
  retried among the survivors (their inputs restored; "mean" divides by the live
  count); otherwise they raise ``MembershipChanged`` and the next ``boundary``
  copies the state from the member that got furthest.
- Joining (a restarted site, or one cut off and healed): the site files a ticket
  in the store; every member sets up a session with it in the background
  (``elastic_admit``), and at the first step boundary where all have, a survivor
  proposes an epoch that admits it from the next step on; ``boundary`` sends it the
  state (``elastic_state``) bit-identical, so it takes part from that step on.

Each step must run at least one collective of the group and call ``boundary`` once
before it: that keeps every survivor within one step of the others, so an epoch that
starts at "the proposer's step + 1" is adopted by all before they reach it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from .buffers import as_array
from .codec import ErrorFeedback
from .elastic_admit import ADMIT_RETRY_S, Reaching, answer_tickets, wait_for_admission, watch_tickets
from .elastic_call import ElasticCall
from .elastic_state import StateHolder, transfer_state
from .errors import CollectiveError, MembershipChanged
from .group import Group
from .membership import Epoch, Membership
from .mesh import Sites
from .state import ElasticEvent, ElasticState, GroupState, elastic_advance
from .world import World

log = logging.getLogger("wanxport.collective.elastic")

REGROUP_S = 1.0  # without a majority: how long to wait for a newer epoch before reconnecting the lost



class ElasticGroup:
    """This site's member of an elastic group (``elastic_join``). ``members``: the live sites
    of the current epoch (configured indices); ``all_reduce`` and ``boundary`` are the step
    loop's calls; ``changes`` counts the membership changes seen here."""

    def __init__(self, world: World, membership: Membership, sites: Sites, prefix: str) -> None:
        self.world = world
        self.membership = membership
        self.sites = sites
        self.prefix = prefix
        self.state = ElasticState.RECONFIGURING
        self.epoch = Epoch(-1, ())
        self.group: Group | None = None
        self.feedback = ErrorFeedback()  # error-feedback residuals, kept across epochs
        self.changes = 0  # membership changes seen here since the group formed
        self.on_epoch: list[Callable[[Group], None]] = []  # told each epoch's group (metrics)
        self._calls: dict[int, ElasticCall] = {}  # calls not done, by index
        self._done_ahead: set[int] = set()  # calls done while an earlier one was not
        self._next = 0  # the next call's index
        self._step = 0  # the step of the last boundary (a joiner's: the one it received)
        self._current = True  # this site's state is the run's (False: restarted, excluded, or mid-copy)
        self._table: npt.NDArray[np.int64] | None = None  # the current epoch's agreement
        self._resync = False
        self._due: Epoch | None = None  # an adopted epoch that starts at a later step
        self._recovery: asyncio.Task[None] | None = None
        self._asked = False  # this site asked to be admitted since it last entered an epoch
        self._backoff = ADMIT_RETRY_S
        self._reaching = Reaching(world, sites, membership)  # sessions with sites asking to join
        self._watcher: asyncio.Task[None] | None = None

    @property
    def site(self) -> int:
        return self.sites.site

    @property
    def members(self) -> tuple[int, ...]:
        return self.epoch.members

    @property
    def size(self) -> int:
        return len(self.epoch.members)

    @property
    def name(self) -> str:
        return self.sites.names[self.site]

    # -- calls -------------------------------------------------------------------

    async def all_reduce(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> Any:
        """``Group.all_reduce`` over the live sites; retried among the survivors when a member
        goes (``MembershipChanged`` where it cannot be)."""
        return await self.all_reduce_async(array, op, compress, timeout, name)

    def all_reduce_async(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> asyncio.Future[Any]:
        """Start it now (its place in the sequence is this call's); a future of the result."""
        arr = as_array(array)
        call = ElasticCall(self._next, array, arr.copy(), op, compress, timeout, name)
        self._next += 1
        self._calls[call.index] = call
        if self._resync:
            call.failed = MembershipChanged(f"site {self.name}: the state is copied at the next boundary; "
                                            "redo the step after it")
        elif self._recovery is None and self.state is ElasticState.RUNNING:
            self._issue(call)
        return asyncio.ensure_future(self._drive(call))

    def refuse(self, op: str, reason: str) -> ValueError:
        """``Group.refuse`` on the current epoch's group; the refused call takes its index here
        as its matching calls do at the other sites."""
        self._next += 1
        if self.group is None:
            return ValueError(reason)
        return self.group.refuse(op, reason)

    def _issue(self, call: ElasticCall) -> None:
        assert self.group is not None
        call.begin_attempt(self.feedback)
        call.group, call.handle, call.failed = self.group, None, None
        try:
            call.handle = self.group.all_reduce_async(call.array, call.op, call.compress, call.timeout,
                                                      call.name)
        except (CollectiveError, ValueError) as exc:  # refused here and at every member: raised
            call.failed = exc

    async def _drive(self, call: ElasticCall) -> Any:
        """The call's result, across epochs: an attempt that fails because a member went waits
        for the next epoch, which retries the call (a new attempt) or fails it."""
        ok = False
        try:
            while True:
                handle = call.handle
                if handle is not None:
                    try:
                        result = await handle
                    except CollectiveError:
                        if call.handle is not handle:
                            continue  # a newer attempt replaced this one
                        if not self._lost(call.group):
                            raise
                    else:
                        if call.handle is not handle:
                            continue
                        self._done(call)
                        ok = True
                        return result
                elif call.failed is not None and (isinstance(call.failed, MembershipChanged)
                                                  or not self._lost(call.group)):
                    raise call.failed
                await self._recovered()
        finally:
            if not ok:
                call.undo(self.feedback)
            self._calls.pop(call.index, None)
            if not self._calls:
                self._done_ahead.clear()

    def _done(self, call: ElasticCall) -> None:
        del self._calls[call.index]
        if self._calls and min(self._calls) < call.index:
            self._done_ahead.add(call.index)

    def _lost(self, group: Group | None) -> bool:
        """Whether a failure on ``group`` is a membership change (not a stall or a mismatch)."""
        return group is None or group is not self.group or group.state is GroupState.MEMBER_GONE \
            or self.state is not ElasticState.RUNNING

    async def _recovered(self) -> None:
        if self._recovery is None:
            self._recovery = asyncio.ensure_future(self._recover())
        recovery = self._recovery
        try:
            await asyncio.shield(recovery)
        finally:
            if self._recovery is recovery and recovery.done():
                self._recovery = None

    async def _recover(self) -> None:
        """Move to the next epoch; then retry the calls not done, or fail them."""
        self._event(ElasticEvent.MEMBER_GONE)
        await self._advance(None)
        for index in sorted(self._calls):
            call = self._calls[index]
            if self._resync:
                call.handle, call.failed = None, MembershipChanged(
                    f"{call.op} #{index}: the membership changed to epoch {self.epoch.number} "
                    f"({self._names(self.members)}) and the survivors had not all reached this call; "
                    "redo the step after boundary()", None)
            else:
                self._issue(call)

    # -- the step boundary -------------------------------------------------------

    async def boundary(self, step: int, state: StateHolder) -> int:
        """Call before every step, at every site: admits sites that asked to join (from the
        next step), adopts an epoch another site proposed, and copies ``state`` from the
        member furthest along to any member whose state is stale (a joiner, or a survivor
        that lost a step). Returns the step to run (a joiner's: the survivors')."""
        if self._recovery is not None:
            await self._recovered()
        if self._current:
            self._step = step
        current = await self.membership.read()
        if current is None:
            raise CollectiveError("the store has no epoch record: was it reset?")
        if current.number > self.epoch.number and (self._due is None or current.number > self._due.number):
            self._due = current
        if self._due is not None and (self._due.start <= self._step or self.site not in self._due.members):
            due, self._due = self._due, None
            await self._advance(due)
        elif self._due is None:
            await answer_tickets(self, current)
        if self._resync:
            assert self.group is not None and self._table is not None
            self._current = False
            self._step = await transfer_state(self.group, self._table, state, self._step)
            self._current, self._resync = True, False
            self._calls.clear()  # every call in flight failed: numbering starts again everywhere
            self._done_ahead.clear()
            self._next = 0
        return self._step

    # -- epochs ------------------------------------------------------------------

    async def _advance(self, target: Epoch | None) -> None:
        """Enter ``target`` (or the epoch after this one's losses), waiting out any epoch that
        leaves this site out, until one opens with this site in it."""
        while True:
            if target is None:
                target = await self._next_epoch()
            if self.site not in target.members:
                target = await wait_for_admission(self, target)
            if await self._enter(target):
                return
            target = None

    async def _next_epoch(self) -> Epoch:
        """A newer epoch in the store, else one of the members heard from if they are a majority;
        without one, wait for a newer epoch, setting sessions up again with the members lost
        every ``REGROUP_S`` (two survivors that each counted the other gone would otherwise
        wait for each other for ever)."""
        while True:
            current = await self.membership.read()
            assert current is not None
            if current.number > self.epoch.number:
                return current
            kept = tuple(m for m in self.epoch.members if m not in self.world.gone)
            live = await self.world.heard_from(kept)
            if len(live) >= self.sites.quorum:
                proposal = Epoch(current.number + 1, live, -1, (), current.answered)
                return await self.membership.propose(current, proposal)
            if self.state is not ElasticState.WAITING:
                log.warning("site %s: only %s of %d configured sites are reachable, not a majority: waiting",
                            self.name, self._names(live), len(self.sites.names))
            self._event(ElasticEvent.CANNOT_CONTINUE)
            newer = asyncio.ensure_future(self.membership.newer_than(current.number))
            try:
                await asyncio.wait({newer}, timeout=REGROUP_S)
                if not newer.done():
                    lost = [m for m in self.epoch.members if m != self.site and m not in live]
                    for peer in lost:  # the broken session's ports go back first
                        await self.world.drop_link(peer)
                    connecting = asyncio.ensure_future(self._connect(lost, joining=False))
                    await asyncio.wait({newer, connecting}, return_when=asyncio.FIRST_COMPLETED)
                    connecting.cancel()  # a newer epoch came first: it decides who is in
                    await asyncio.gather(connecting, return_exceptions=True)
                if newer.done():
                    return newer.result()
            finally:
                newer.cancel()

    async def _enter(self, target: Epoch) -> bool:
        """Open ``target``'s group (sessions with members this site has none with) and run its
        agreement; False when a member went meanwhile (the caller moves on)."""
        self._event(ElasticEvent.NEWER_EPOCH)
        await self._close_group()
        await self._reaching.admit(target.members, target.admitted, self.sites.admit_s)
        asking = self._reaching.pending()  # sessions set up for an admission to come: kept
        for peer in [p for p in self.world.links if p not in target.members and p not in asking]:
            await self.world.drop_link(peer)
        stale = [m for m in self.world.gone if m in target.admitted or not self._current]
        await self._connect([m for m in target.members if m != self.site and (
            m not in self.world.links or m in stale)], joining=not self._current)
        previous, self.epoch = self.epoch, target
        group = self.world.new_group(target.members, tag=f"{self.prefix}epoch/{target.number}")
        assert group is not None
        self.group = group
        group.feedback = self.feedback  # what this site owes the sum outlives the epoch
        for tell in self.on_epoch:
            tell(group)
        first = min(self._calls, default=self._next)
        # Last column: what this site's last links to the sites being admitted carried (the
        # slowest of them, bytes/s; 0 unknown), so the state goes out from the best-connected.
        towards = [self.world.carried_bps.get(m, 0.0) for m in target.admitted if m != self.site]
        row = np.array([int(self._current), self._step, first, sum(1 for i in self._done_ahead if i > first),
                        int(min(towards, default=0.0))], dtype=np.int64)
        try:
            table = await group.all_gather(row)
        except CollectiveError:
            if group.state is GroupState.MEMBER_GONE:
                return False
            raise
        self._table = table
        rows = table[table[:, 0] == 1]
        self._resync = len(rows) < len(table) or bool((rows[:, 1:3] != rows[0, 1:3]).any()
                                                      or rows[:, 3].any())
        self.changes += previous.number >= 0
        self._asked, self._backoff = False, ADMIT_RETRY_S
        if self._watcher is None:
            self._watcher = asyncio.ensure_future(watch_tickets(self))
        self._log_change(previous, target)
        self._event(ElasticEvent.OPENED)
        return True

    async def _connect(self, peers: list[int], joining: bool) -> None:
        """Sessions with ``peers``: a joiner waits up to ``connect_s`` for the members to reach
        the epoch's first step; a member admitting a joiner (already waiting) ``admit_s``."""
        sites = self.sites
        deadline = time.monotonic() + (sites.connect_s if joining else sites.admit_s)
        results = await asyncio.gather(*(sites.connect(p, deadline) for p in peers), return_exceptions=True)
        for peer, result in zip(peers, results, strict=True):
            if isinstance(result, BaseException):
                why = result if isinstance(result, CollectiveError) else CollectiveError(
                    f"site {sites.names[peer]}: no session ({type(result).__name__}: {result})",
                    sites.names[peer])
                self.world.gone[peer] = why
            else:
                await self.world.replace_link(peer, *result)

    async def _close_group(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            await group.close()

    def _event(self, event: ElasticEvent) -> None:
        self.state = elastic_advance(self.state, event)

    def _names(self, members: Sequence[int]) -> str:
        return "[" + ", ".join(self.sites.names[m] for m in members) + "]"

    def _log_change(self, previous: Epoch, target: Epoch) -> None:
        left = [m for m in previous.members if m not in target.members]
        came = [m for m in target.members if m not in previous.members]
        why = "; ".join([*(f"{self.sites.names[m]} gone: {self.world.gone.get(m, 'left out by another site')}"
                           for m in left),
                         *(f"{self.sites.names[m]} admitted" for m in came)]) or "formed"
        log.info("site %s: membership epoch %d: live %s (%s)", self.name, target.number,
                 self._names(target.members), why)

    async def close(self, drain_s: float = 5.0) -> None:
        """Leave: a last barrier (so no site leaves while another still finishes the last call,
        which would look like a loss to it; a failure here is ignored, every site is leaving),
        our last messages given time to land (bounded), then every session ends. Once every
        member passed that barrier the store records the group's end, so a site waiting to be
        admitted gets ``GroupEnded`` instead of waiting for an answer that cannot come. A site
        that never got the state (its copy failed) leaves without the barrier: the members are
        in a step, and its barrier would pair with their call."""
        taking_part = self.state is ElasticState.RUNNING and self._current
        if taking_part and self.group is not None and not self._calls:
            with contextlib.suppress(CollectiveError):
                await self.group.barrier(timeout=max(drain_s, 1.0) * 6)
                await self.membership.mark_ended(self.epoch.number, self._step)
        self._event(ElasticEvent.CLOSE)
        if self._watcher is not None:
            self._watcher.cancel()
        self._reaching.close()
        if self._recovery is not None:
            self._recovery.cancel()
        await self.world.close(drain_s)
        await self._close_group()
        self.membership.close()
