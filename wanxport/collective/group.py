"""A group of sites and its calls: all-reduce, reduce-scatter, all-gather, broadcast, barrier,
and point-to-point (``p2p``).

Every collective is a fixed sequence of phases; in each phase every site sends one
message to every peer (a header-only one when it has no data for it) and waits for
one from every peer. So every site sees every peer's header in every phase and a
mismatched call is caught everywhere (``message.mismatch``), and a missing message
is a peer that died (its session's liveness says so within seconds: ``link``) or
stalled (``CollectiveError`` at the call's timeout). A call refused at its own site
still takes its sequence number and tells every peer why, so calls never shift
how they pair: a silent wrong result cannot happen. The group's state (open, a
member gone, poisoned, closed) is an explicit machine (``state``).

Schedules: with two sites an all-reduce is one exchange of the whole array each way
(the least there is: S bytes each way, one round of latency). With n > 2 sites it is
a reduce-scatter (site k sums part k) followed by an all-gather, so each site sends
and receives about 2 S (n-1)/n bytes instead of S (n-1).

Reduction order is fixed by site index: every site (or the part's owner) computes
``((c0 + c1) + c2) + ...`` over the decoded contributions, its own included, so
results are bitwise identical across sites and equal numpy's sum in that order.
Heavy numpy work runs in a worker thread (numpy drops the GIL) so the event loop
keeps serving every path's acknowledgements meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Coroutine, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from wanxport.core.stats import PathStats

from . import codec
from .arrays import check_body, check_reduce, encode_part, fixed_sum, off_loop, refusing
from .buffers import as_array, flat_work, write_back
from .calls import CallSequence, CallStats, Handle, Tally
from .costmodel import part_bounds
from .errors import CollectiveError
from .inflight import InFlight
from .link import METER_MIN_BYTES, METER_MIN_S, SiteLink
from .message import (
    ABORTS,
    COLLECTIVE,
    HEADER_BYTES,
    PLANNING,
    Call,
    Header,
    body_of,
    fill_payload,
    mismatch,
    new_payload,
    payload_of,
    text_payload,
    wire_shape,
)
from .p2p import PointToPoint
from .planning import Planner, session_row
from .pool import SendPool, slot_of
from .schedule import Plan, full_mesh, nearest_tree
from .state import GroupEvent, GroupState, advance
from .trees import TreeSchedules

if TYPE_CHECKING:
    from .world import World

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
STATS_KEPT = 10_000
ABORT_REASON_BYTES = 1024  # an abort message's body: why the call was refused, UTF-8
Got = tuple[int, Header, npt.NDArray[np.uint8]]
Channel = tuple[int, int, int]  # (kind, tag, peer rank): one sequence of calls
Key = tuple[int, int, int, int, int]  # (peer rank, kind, tag, seq, phase): one expected message
COLLECTIVES: Channel = (COLLECTIVE, 0, -1)
__all__ = ["DEFAULT_TIMEOUT_S", "CallStats", "Group", "Handle", "part_bounds"]


class Group(PointToPoint, TreeSchedules):
    """This site's view of a group of sites; made by ``join`` (the world) or ``new_group``.

    ``site`` is this site's rank in the group and ``names`` the members' names in rank
    order (ranks follow world ranks, ascending). ``links`` maps each other member's rank
    to the world's session with it (a pair without a session has none: its traffic is
    relayed). ``state`` is a ``GroupState``: calls run while it is OPEN; ``error`` says
    why it is not. With three or more members ``planner`` chooses each all-reduce's
    schedule (``planning``).
    """

    def __init__(self, world: World, gid: int, members: Sequence[int], timeout_s: float = DEFAULT_TIMEOUT_S,
                 ) -> None:
        self.world = world
        self.gid = gid
        self.members = list(members)
        self.rank_of = {m: r for r, m in enumerate(self.members)}
        self.site = self.rank_of[world.site]
        self.names = [world.names[m] for m in self.members]
        self.size = len(self.members)
        self.timeout_s = timeout_s
        self.links: dict[int, SiteLink] = {self.rank_of[m]: world.links[m] for m in self.members
                                           if m != world.site and m in world.links}
        self.state = GroupState.OPEN
        self.error: CollectiveError | None = None
        self.gone: dict[int, CollectiveError] = {}  # rank -> why that member is gone
        self.feedback = codec.ErrorFeedback()
        self.stale_messages = 0  # messages of calls already over here (dropped)
        self._collectives = CallSequence()
        self._sequences: dict[Channel, CallSequence] = {COLLECTIVES: self._collectives}
        self._inbox: dict[Key, Got] = {}
        self._waiters: dict[Key, asyncio.Future[Got]] = {}
        self._stats: deque[CallStats] = deque(maxlen=STATS_KEPT)
        self._tallies: dict[int, Tally] = {}
        self._running: dict[int, tuple[Call, float]] = {}  # seq -> (call, its start): collectives in flight
        self.send_pool = SendPool()
        self.planner: Planner | None = None
        self._meters: dict[int, tuple[int, float]] = {}  # peer -> its link's meter at the last row
        if self.size > 2:
            self.planner = Planner(gid, self.site, self.size, list(self.links), self._send_planning,
                                   self._measure, world.schedule, world.deterministic)
            self.planner.report(force=True)

    @property
    def name(self) -> str:
        return self.names[self.site]

    @property
    def broken(self) -> CollectiveError | None:
        """Why calls fail at once here (None while the group is open)."""
        return self.error if self.state is not GroupState.OPEN else None

    def new_group(self, members: Sequence[int], timeout_s: float | None = None) -> Group | None:
        """A group of the world ranks ``members`` on the same sessions (``World.new_group``)."""
        return self.world.new_group(members, timeout_s)

    def _send_planning(self, peer: int, header: Header, payload: npt.NDArray[np.uint8]) -> None:
        if self.state is GroupState.OPEN:
            self.links[peer].send(header, payload)

    def _measure(self) -> tuple[list[float], list[float]]:
        """This site's row for the planner: its sessions' rates and one-way delays, now. A
        rate is the larger of two floors of the pair's capacity: the session's delivery-rate
        estimate and what the link carried while it had bulk data since the last row. A link
        that has carried under ``METER_MIN_BYTES`` of bulk data has only app-limited
        estimates, far below its capacity: it reports what the site's last link to that
        peer carried (a site that restarted comes back on the same network), else 0, not
        measured."""
        rates, delays = session_row(self.size, {peer: link.path_stats() for peer, link in self.links.items()})
        for peer, link in self.links.items():
            meter = link.busy_meter()
            if meter[0] < METER_MIN_BYTES:
                rates[peer] = self.world.carried_bps.get(self.members[peer], 0.0)
                continue
            sent, busy = (a - b for a, b in zip(meter, self._meters.get(peer, (0, 0.0)), strict=True))
            if busy >= METER_MIN_S and sent >= METER_MIN_BYTES:
                rates[peer] = max(rates[peer], sent / busy)
                self._meters[peer] = meter
        return rates, delays

    # -- collectives -----------------------------------------------------------

    async def all_reduce(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> Any:
        """Reduce ``array`` over all sites in place (numpy array or CPU tensor); returns it.

        ``op``: "sum" or "mean" (divided after the fixed-order sum). ``compress``: None,
        "bf16", "int8" or "int4" (float32 only): contributions travel encoded and keep an
        error-feedback residual keyed by ``name`` (else by the buffer).
        """
        return await self.all_reduce_async(array, op, compress, timeout, name)

    def all_reduce_async(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> Handle:
        """Start an all-reduce now (its place in the sequence is this call's) and return its
        handle; several may run at once (e.g. one per gradient bucket). Sites must start
        their collectives in the same order."""
        with self._refusing("all_reduce"):
            arr = as_array(array)
            check_reduce(op, arr.dtype)
            codec.check_codec(compress, arr.dtype)
        call = self._call("all_reduce", arr, compress=compress, reduce=op)
        work = self._all_reduce(call, arr, array, name)
        return Handle(call, self._run(call, work, timeout))

    async def reduce_scatter(self, array: Any, op: str = "sum", compress: str | None = None,
                             timeout: float | None = None, name: str | None = None) -> npt.NDArray[Any]:
        """Site k ends with part k (``part_bounds``) of the reduction, written into that part of
        ``array`` and returned (a view when ``array`` is contiguous); other parts unchanged."""
        with self._refusing("reduce_scatter"):
            self._need_full_mesh("reduce_scatter")
            arr = as_array(array)
            check_reduce(op, arr.dtype)
            codec.check_codec(compress, arr.dtype)
        call = self._call("reduce_scatter", arr, compress=compress, reduce=op)
        result: npt.NDArray[Any] = await self._run(call, self._reduce_scatter(call, arr, name), timeout)
        return result

    async def all_gather(self, array: Any, out: Any = None, timeout: float | None = None) -> npt.NDArray[Any]:
        """Every site's ``array`` (same shape and dtype everywhere), stacked in site order:
        ``out[k]`` is site k's. ``out`` (shape ``(n, *array.shape)``) is filled when given."""
        with self._refusing("all_gather"):
            self._need_full_mesh("all_gather")
            arr = as_array(array)
            result = None if out is None else as_array(out, "out")
            if result is not None and (result.shape != (self.size, *arr.shape) or result.dtype != arr.dtype):
                raise ValueError(f"out: need shape {(self.size, *arr.shape)} {arr.dtype}, "
                                 f"got {result.shape} {result.dtype}")
        call = self._call("all_gather", arr)
        gathered: npt.NDArray[Any] = await self._run(call, self._all_gather(call, arr, result), timeout)
        return gathered

    async def broadcast(self, array: Any, root: int = 0, timeout: float | None = None) -> Any:
        """Site ``root``'s ``array`` into every site's ``array`` (in place); returns it."""
        with self._refusing("broadcast"):
            self._need_full_mesh("broadcast")
            if not 0 <= root < self.size:
                raise ValueError(f"root: {root} is not a site index (0..{self.size - 1})")
            arr = as_array(array)
        call = self._call("broadcast", arr, root=root)
        await self._run(call, self._broadcast(call, arr), timeout)
        return array

    async def barrier(self, timeout: float | None = None) -> None:
        """Returns once every site has called it (the same number of collectives in). Where
        some pair has no session it runs as an empty all-reduce on one tree (up, then down)."""
        call = self._call("barrier", np.empty(0, dtype=np.uint8))
        await self._run(call, self._barrier(call), timeout)

    def _need_full_mesh(self, op: str) -> None:
        """ValueError (refused at every site: ``refusing``) where this site lacks a session
        with some member: only the all-reduce relays through a third site."""
        if len(self.links) < self.size - 1:
            missing = [self.names[k] for k in range(self.size) if k != self.site and k not in self.links]
            raise ValueError(f"{op} needs a session between every pair of sites; site {self.name} has "
                             f"none with {', '.join(missing)} (all_reduce relays)")

    def refuse(self, op: str, reason: str) -> ValueError:
        """A collective ``op`` refused by its caller before it reached the group (a wrapper's
        own check): it takes its place in the sequence and every member's matching call fails
        with ``reason``, so later calls still pair. Returns the ValueError to raise."""
        error = ValueError(reason)
        self._refuse_collective(op, error)
        return error

    # -- figures ---------------------------------------------------------------

    def stats(self) -> list[CallStats]:
        """The calls this site ran, oldest first (the last ``STATS_KEPT``)."""
        return list(self._stats)

    def in_flight(self) -> list[InFlight]:
        """The collectives running here now, oldest first: what they have received so far and
        which members they still wait for. Safe to call from another thread (a metrics
        scrape): it copies the loop's containers with one C-level call each."""
        tallies = dict(self._tallies)
        waiting = list(self._waiters)
        out = []
        for seq, (call, started) in sorted(dict(self._running).items()):
            tally = tallies.get(seq)
            sent, received = (tally.sent, tally.received) if tally else (0, 0)
            peers = tuple(sorted({k[0] for k in waiting if k[1:4] == (COLLECTIVE, 0, seq)}))
            out.append(InFlight(call, started, sent, received, peers))
        return out

    def path_stats(self) -> dict[str, tuple[PathStats, ...]]:
        """Per peer site name: its session's paths (bytes we sent on each, RTT, state)."""
        return {link.name: link.path_stats() for link in self.links.values()}

    def part_bounds(self, count: int) -> list[tuple[int, int]]:
        return part_bounds(count, self.size)

    # -- lifecycle -------------------------------------------------------------

    async def close(self, drain_s: float = 5.0) -> None:
        """Close this group. The world's group closes the world too (every group, every
        session); another group only leaves the sessions to the others. Idempotent."""
        if self.gid == self.world.root_gid:
            await self.world.close(drain_s)
            return
        self._transition(GroupEvent.CLOSE, CollectiveError("the group is closed"))
        self.world.retire(self)
        for peer, kind, tag, seq, _ in self._inbox:  # messages never received: their buffers go back
            self.links[peer].pool.release((self.gid, kind, tag, seq))
        self._inbox.clear()

    def closed_by_world(self) -> None:
        self._transition(GroupEvent.CLOSE, CollectiveError("the group is closed"))

    def member_lost(self, error: CollectiveError) -> None:
        """A member's session ended or went silent: every pending and later call fails with
        ``error`` (it names the site, its rank and where it was last heard)."""
        rank = self.world.names.index(error.site) if error.site in self.world.names else None
        if rank is not None:
            self.gone.setdefault(self.rank_of.get(rank, -1), error)
        self._transition(GroupEvent.MEMBER_LOST, error)

    def _poison(self, error: CollectiveError) -> None:
        self._transition(GroupEvent.POISON, error)

    def _transition(self, event: GroupEvent, error: CollectiveError) -> None:
        self.state = advance(self.state, event)
        if self.error is None:
            self.error = error
        for fut in self._waiters.values():
            _fail(fut, self.error)
        self._waiters.clear()
        if self.planner is not None:
            self.planner.fail(self.error)

    async def __aenter__(self) -> Group:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- schedules ---------------------------------------------------------------
    # Array work (copies, codecs, sums) goes through ``off_loop``: a worker thread for
    # large arrays, so the loop keeps acknowledging and pacing meanwhile.

    async def _all_reduce(self, call: Call, arr: npt.NDArray[Any], original: Any, name: str | None,
                          ) -> Any:
        flat = flat_work(arr)
        key = self.feedback.key(name, arr)
        if self.planner is not None:
            call, plan = await self._planned(call, flat.itemsize)
            if plan.kind != "direct":
                await self._all_reduce_trees(call, flat, key, plan)
                write_back(arr, flat)
                self.planner.report()
                return original
        if self.size == 2:
            bounds = [(0, call.count)] * 2
            payloads, mine = await off_loop(flat.nbytes, self._prepare, call.compress, key, flat, bounds,
                                        self._take_buffers(call.compress, flat, bounds))
            got = await self._exchange(call, 0, {p: (0, call.count, payloads[p]) for p in self.links})
            await off_loop(flat.nbytes, self._reduce, call, flat, mine, got, 0)
        else:
            bounds = part_bounds(call.count, self.size)
            own = await self._scatter_reduce(call, flat, key, bounds)
            await self._gather_parts(call, flat, own, bounds)
        write_back(arr, flat)
        if self.planner is not None:
            self.planner.report()
        return original

    async def _planned(self, call: Call, itemsize: int) -> tuple[Call, Plan]:
        """``call`` with the schedule every site chooses for it (from the decider's plan);
        the choice and its predicted time go to the call's figures."""
        assert self.planner is not None
        published = await self.planner.plan_for(call.seq)
        compress = call.compress

        def wire(elements: int) -> int:
            return HEADER_BYTES + codec.encoded_bytes(compress, elements, itemsize)

        plan, predicted = self.planner.choose(published, call.count, wire, f"{call.dtype}/{compress}")
        if plan.kind == "direct" and len(self.links) < self.size - 1:
            raise CollectiveError(f"all_reduce #{call.seq}: the direct schedule needs a session between "
                                  "every pair of sites")
        tally = self._tallies.get(call.seq)
        if tally is not None:
            tally.schedule, tally.predicted_s, tally.plan = plan.kind, predicted, plan
        return dataclasses.replace(call, schedule=plan.kind, plan=published.ident), plan

    async def _reduce_scatter(self, call: Call, arr: npt.NDArray[Any], name: str | None) -> npt.NDArray[Any]:
        flat = flat_work(arr)
        bounds = part_bounds(call.count, self.size)
        a, b = bounds[self.site]
        flat[a:b] = await self._scatter_reduce(call, flat, self.feedback.key(name, arr), bounds)
        write_back(arr, flat)
        return arr.reshape(-1)[a:b]

    async def _scatter_reduce(self, call: Call, flat: npt.NDArray[Any], key: object,
                              bounds: list[tuple[int, int]]) -> npt.NDArray[Any]:
        """Phase 0: part k of every site's (encoded) contribution goes to site k; ours summed."""
        payloads, mine = await off_loop(flat.nbytes, self._prepare, call.compress, key, flat, bounds,
                                    self._take_buffers(call.compress, flat, bounds))
        sends = {p: (bounds[p][0], bounds[p][1] - bounds[p][0], payloads[p]) for p in self.links}
        got = await self._exchange(call, 0, sends)
        a, b = bounds[self.site]
        reduced = np.empty(b - a, dtype=flat.dtype)
        await off_loop(reduced.nbytes, self._reduce, call, reduced, mine[a:b], got, a)
        return reduced

    async def _gather_parts(self, call: Call, flat: npt.NDArray[Any], own: npt.NDArray[Any],
                            bounds: list[tuple[int, int]]) -> None:
        """Phase 1: every site's reduced part to every site (encoded again when compressing;
        the owner keeps the decoded value, so all sites hold the same bytes)."""
        a, b = bounds[self.site]
        payload, own = await off_loop(own.nbytes, encode_part, call.compress, own)
        got = await self._exchange(call, 1, {p: (a, b - a, payload) for p in self.links})

        def place() -> None:
            flat[a:b] = own
            for peer, message in got.items():
                pa, pb = bounds[peer]
                if pb > pa:
                    flat[pa:pb] = self._decode(call, message)

        await off_loop(flat.nbytes, place)

    async def _all_gather(self, call: Call, arr: npt.NDArray[Any], out: npt.NDArray[Any] | None,
                          ) -> npt.NDArray[Any]:
        payload = await off_loop(arr.nbytes, payload_of, flat_work(arr))
        got = await self._exchange(call, 0, {p: (0, call.count, payload) for p in self.links})
        result = np.empty((self.size, *arr.shape), dtype=arr.dtype) if out is None else out

        def place() -> None:
            result[self.site] = arr
            for peer, message in got.items():
                result[peer] = self._decode(call, message).reshape(arr.shape)

        await off_loop(result.nbytes, place)
        return result

    async def _broadcast(self, call: Call, arr: npt.NDArray[Any]) -> None:
        flat = flat_work(arr)
        if self.site == call.root:
            payload = await off_loop(flat.nbytes, payload_of, flat)
            await self._exchange(call, 0, {p: (0, call.count, payload) for p in self.links})
            return
        got = await self._exchange(call, 0, {p: (0, 0, None) for p in self.links})

        def place() -> None:
            flat[:] = self._decode(call, got[call.root])
            write_back(arr, flat)

        await off_loop(flat.nbytes, place)

    async def _barrier(self, call: Call) -> None:
        if self.planner is None:
            return await self._header_only(call)
        published = await self.planner.plan_for(call.seq)
        if full_mesh(published.mesh.links):
            return await self._header_only(call)
        plan = Plan("tree", (nearest_tree(0, published.mesh.delay, published.mesh.links),))
        call = dataclasses.replace(call, schedule="tree", plan=published.ident)
        await self._all_reduce_trees(call, np.empty(0, dtype=np.uint8), None, plan)

    async def _header_only(self, call: Call) -> None:
        await self._exchange(call, 0, {p: (0, 0, None) for p in self.links})

    # -- array work (in a worker thread for large arrays) -------------------------

    def _take_buffers(self, compress: str | None, flat: npt.NDArray[Any], bounds: list[tuple[int, int]],
                      ) -> dict[tuple[int, int], npt.NDArray[np.uint8]]:
        """A reused message buffer for each part (taken on the loop: the pool is not thread-safe)."""
        def size(a: int, b: int) -> int:
            body = (b - a) * flat.itemsize if compress is None else codec.encoded_bytes(compress, b - a)
            return HEADER_BYTES + body
        return {(a, b): self.send_pool.take(size(a, b)) for a, b in sorted(set(bounds))}

    def _prepare(self, compress: str | None, key: object, flat: npt.NDArray[Any],
                 bounds: list[tuple[int, int]], buffers: dict[tuple[int, int], npt.NDArray[np.uint8]],
                 ) -> tuple[dict[int, npt.NDArray[np.uint8]], npt.NDArray[Any]]:
        """The message buffer for each site (its part, encoded, in ``buffers``) and our own
        contribution as the others will decode it (with compression: plus the error-feedback
        residual, updated here). Uncompressed, our contribution is read from the send buffers."""
        parts = sorted(set(bounds))
        payloads: dict[tuple[int, int], npt.NDArray[np.uint8]] = {}
        if compress is None and len(parts) == 1:
            payload = payloads[parts[0]] = fill_payload(buffers[parts[0]], flat)
            return {k: payload for k in range(len(bounds))}, body_of(payload).view(flat.dtype)
        mine = np.empty_like(flat)
        target = flat if compress is None else self.feedback.compensate(key, flat)
        for a, b in parts:
            if compress is None:
                payloads[(a, b)] = fill_payload(buffers[(a, b)], flat[a:b])
                mine[a:b] = flat[a:b]
            else:
                payload = payloads[(a, b)] = buffers[(a, b)]
                codec.encode(compress, target[a:b], body_of(payload))
                codec.decode(compress, body_of(payload), b - a, out=mine[a:b])
        if compress is not None:
            self.feedback.record(key, target, mine)
        return {k: payloads[(a, b)] for k, (a, b) in enumerate(bounds)}, mine

    def _reduce(self, call: Call, out: npt.NDArray[Any], mine: npt.NDArray[Any], got: dict[int, Got],
                offset: int) -> None:
        """``out = ((c0 + c1) + c2) + ...`` over the decoded contributions in site order."""
        del offset  # every message of the phase carries the same part
        parts = [mine if k == self.site else self._decode(call, got[k]) for k in range(self.size)]
        fixed_sum(out, parts, call.reduce, self.size)

    def _decode(self, call: Call, message: Got) -> npt.NDArray[Any]:
        _, header, body = message
        if call.compress is None or call.op in ("all_gather", "broadcast"):
            return body.view(np.dtype(call.dtype))
        return codec.decode(call.compress, body, header.elements)

    # -- plumbing --------------------------------------------------------------

    def _refusing(self, op: str) -> contextlib.AbstractContextManager[None]:
        """A call whose own arguments are invalid raises ValueError here, but it still takes
        its place in the sequence and tells every peer why (an ``abort`` message), so the
        peers' matching calls fail at once naming this site instead of pairing with the
        next call or waiting out their timeout."""
        return refusing(lambda exc: self._refuse_collective(op, exc))

    def _refuse_collective(self, op: str, exc: ValueError) -> None:
        self._check_usable()
        call = Call(self._take(), "abort", 0, "", group=self.gid)
        message = text_payload(f"{op}: {exc}", ABORT_REASON_BYTES)
        for link in self.links.values():
            link.send(Header(call, 0, 0, message.nbytes - HEADER_BYTES), message)
        self._over(COLLECTIVES, call.seq, list(self.links))  # the peers' messages for it: dropped

    async def _receive_checked(self, call: Call, peer: int, phase: int) -> Got:
        """The message of ``call``'s ``phase`` from ``peer``, its header and body checked."""
        got = await self._receive((peer, COLLECTIVE, 0, call.seq, phase))
        _, header, body = got
        self._check_header(call, peer, header, body)
        tally = self._tallies.get(call.seq)
        if tally is not None:
            tally.received += HEADER_BYTES + body.nbytes
        check_body(call, header, body, self.names[peer])
        return got

    async def _exchange(self, call: Call, phase: int,
                        sends: dict[int, tuple[int, int, npt.NDArray[np.uint8] | None]]) -> dict[int, Got]:
        """Send each peer its message of this phase; one from each peer, checked, in return."""
        tally = self._tallies.get(call.seq)
        for peer, (offset, elements, payload) in sends.items():
            message = payload if payload is not None and elements > 0 else new_payload(0)
            task = self.links[peer].send(Header(call, phase, offset, elements), message)
            if message.nbytes > HEADER_BYTES:
                self.send_pool.sending(slot_of(call), message, task)
            if tally is not None:
                tally.sent += message.nbytes
        futures = [self._receive((peer, COLLECTIVE, 0, call.seq, phase)) for peer in self.links]
        got: dict[int, Got] = {}
        for next_done in asyncio.as_completed(futures):
            peer, header, body = await next_done
            self._check_header(call, peer, header, body)
            if tally is not None:
                tally.received += HEADER_BYTES + body.nbytes
            check_body(call, header, body, self.names[peer])
            got[peer] = (peer, header, body)
        return got

    def _check_header(self, call: Call, peer: int, header: Header, body: npt.NDArray[np.uint8]) -> None:
        """CollectiveError naming ``peer`` when its message refuses or differs from our ``call``."""
        site = self.names[peer]
        if header.call.op in ABORTS:
            reason = body.tobytes().decode("utf-8", "replace")
            raise CollectiveError(f"{call.op} #{call.seq}: site {site} (rank {peer}) refused its call "
                                  f"with bad arguments ({reason})", site)
        problem = mismatch(call, header.call)
        if problem is not None:
            what = "collective" if call.kind == COLLECTIVE else "transfer"
            raise CollectiveError(f"{call.op} #{call.seq}: site {site} (rank {peer}) called a different "
                                  f"{what}: {problem}", site)

    def _take(self) -> int:
        """The next collective's number (the decider sends plans ahead as numbers go)."""
        seq = self._collectives.take()
        if self.planner is not None:
            self.planner.on_take(seq)
        return seq

    def _call(self, op: str, arr: npt.NDArray[Any], compress: str | None = None, reduce: str = "none",
              root: int = -1) -> Call:
        self._check_usable()
        return Call(self._take(), op, int(arr.size), arr.dtype.str, compress, reduce, root,
                    group=self.gid, shape=wire_shape(arr.shape), ndim=arr.ndim)

    async def _run(self, call: Call, work: Coroutine[Any, Any, Any], timeout: float | None,
                   channel: Channel = COLLECTIVES, peers: list[int] | None = None) -> Any:
        """Run a call's ``work`` within its timeout; its sequence number is over afterwards."""
        limit = self.timeout_s if timeout is None else timeout
        started = time.monotonic()
        tally = Tally()
        if channel == COLLECTIVES:
            self._tallies[call.seq] = tally
            self._running[call.seq] = (call, started)
        ok = False
        try:
            self._check_usable()
            # In this task, not a task of its own (as wait_for makes on 3.11): the result
            # reaches whoever awaits the call without a further pass of the loop.
            async with asyncio.timeout(limit):
                result = await work
            ok = True
            return result
        except TimeoutError:
            missing = sorted({k[0] for k in self._waiters if k[1:4] == (*channel[:2], call.seq)})
            heard = {p: self.links[p].last_heard()[0] for p in missing if p in self.links}
            who = ", ".join(f"{self.names[p]} (rank {p}, {self.links[p].describe_silence()})"
                            if p in self.links else f"{self.names[p]} (rank {p})"
                            for p in missing) or "(none missing: local work was too slow)"
            first = missing[0] if missing else None
            if self.planner is not None and self.planner.waiting(call.seq):
                first = self.planner.decider
                who = f"{self.names[first]} (rank {first}, the plan's decider)"
            error = CollectiveError(f"{call.op} #{call.seq}: no message from site {who} within {limit:g} s "
                                    f"(stalled; its session is alive); the group is poisoned, join again",
                                    None if first is None else self.names[first], first,
                                    None if first is None else heard.get(first))
            self._poison(error)
            raise error from None
        finally:
            if channel == COLLECTIVES:
                self._tallies.pop(call.seq, None)
                self._running.pop(call.seq, None)
            self._over(channel, call.seq, list(self.links) if peers is None else peers)
            self._stats.append(CallStats(call.seq, call.op, call.count, call.compress, started,
                                         time.monotonic() - started, tally.sent, tally.received, ok,
                                         tally.schedule, tally.predicted_s, tally.plan))

    def _check_usable(self) -> None:
        if self.state is not GroupState.OPEN:
            assert self.error is not None
            raise CollectiveError(f"group unusable ({self.state}): {self.error}", self.error.site)

    def _receive(self, key: Key) -> asyncio.Future[Got]:
        fut: asyncio.Future[Got] = asyncio.get_running_loop().create_future()
        if key in self._inbox:
            fut.set_result(self._inbox.pop(key))
        elif self.state is not GroupState.OPEN:
            assert self.error is not None
            _fail(fut, self.error)
        else:
            self._waiters[key] = fut
        return fut

    def _sequence(self, channel: Channel) -> CallSequence:
        sequence = self._sequences.get(channel)
        if sequence is None:
            sequence = self._sequences[channel] = CallSequence()
        return sequence

    def deliver(self, peer: int, header: Header, body: npt.NDArray[np.uint8]) -> bool:
        """A message from member ``peer`` (its rank here); False: dropped (its call is over here)."""
        call = header.call
        if call.kind == PLANNING:
            if self.planner is not None:
                self.planner.receive(peer, header, body)
            return False
        channel = COLLECTIVES if call.kind == COLLECTIVE else (call.kind, call.tag, peer)
        if self._sequence(channel).is_over(call.seq):
            self.stale_messages += 1
            return False
        key = (peer, call.kind, call.tag, call.seq, header.phase)
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result((peer, header, body))
        else:
            self._inbox[key] = (peer, header, body)
        return True

    def _over(self, channel: Channel, seq: int, peers: list[int]) -> None:
        """Call ``seq`` of ``channel`` is over here: its messages from ``peers`` are dropped
        (now and as they come) and their buffers go back to the pools."""
        self._sequence(channel).over(seq)
        ident = (channel[0], channel[1], seq)
        for key in [k for k in self._inbox if k[1:4] == ident and k[0] in peers]:
            del self._inbox[key]
        for key in [k for k in self._waiters if k[1:4] == ident and k[0] in peers]:
            self._waiters.pop(key).cancel()
        slot = (self.gid, *ident)
        for peer in peers:
            self.links[peer].pool.release(slot)
        self.send_pool.release(slot)



def _fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    """Fail a waiter; its caller may have gone (timed out), so the error counts as seen."""
    if not fut.done():
        fut.set_exception(error)
        fut.exception()


