"""A group of sites and its collectives: all-reduce, reduce-scatter, all-gather, broadcast, barrier.

Every collective is a fixed sequence of phases; in each phase every site sends one
message to every peer (a header-only one when it has no data for it) and waits for
one from every peer. So every site sees every peer's header in every phase and a
mismatched call is caught everywhere (``message.mismatch``), and a missing message
is a peer that died or stalled: ``CollectiveError`` within the call's timeout.

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
import logging
import time
from collections import deque
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wanxport.core.stats import PathStats
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession

from . import codec
from .buffers import as_array, flat_work, write_back
from .errors import CollectiveError
from .link import Link
from .message import HEADER_BYTES, Call, Header, body_of, fill_payload, mismatch, new_payload, payload_of
from .pool import ReceivePool, SendPool

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 300.0
REDUCE_OPS = ("sum", "mean")
STATS_KEPT = 10_000
ABORT_REASON_BYTES = 1024  # an abort message's body: why the call was refused, UTF-8
Got = tuple[int, Header, npt.NDArray[np.uint8]]


@dataclass(frozen=True)
class CallStats:
    """One collective as this site saw it: from its call to its result, on the monotonic clock."""

    seq: int
    op: str
    count: int
    compress: str | None
    started_s: float
    elapsed_s: float
    sent_bytes: int  # collective bytes this site sent for it (headers included), all peers
    received_bytes: int
    ok: bool


@dataclass
class _Tally:
    sent: int = 0
    received: int = 0


def part_bounds(count: int, n: int) -> list[tuple[int, int]]:
    """The element range [start, end) of each site's part of a ``count``-element array."""
    return [(k * count // n, (k + 1) * count // n) for k in range(n)]


class Handle:
    """A collective in flight: ``await handle`` (or ``await handle.wait()``) for its result."""

    def __init__(self, call: Call, work: Coroutine[Any, Any, Any]) -> None:
        self.call = call
        self._started = time.monotonic()
        self._elapsed: float | None = None
        self._task = asyncio.ensure_future(self._timed(work))

    async def _timed(self, work: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await work
        finally:
            self._elapsed = time.monotonic() - self._started

    @property
    def seq(self) -> int:
        return self.call.seq

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the call to the result (None while it runs)."""
        return self._elapsed

    def done(self) -> bool:
        return self._task.done()

    async def wait(self) -> Any:
        return await self._task

    def __await__(self) -> Any:
        return self._task.__await__()


class Group:
    """This site's view of a group of ``len(names)`` sites; made by ``join``."""

    def __init__(self, site: int, names: Sequence[str], timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.site = site
        self.names = list(names)
        self.size = len(self.names)
        self.timeout_s = timeout_s
        self.links: dict[int, Link] = {}
        self.broken: CollectiveError | None = None
        self.feedback = codec.ErrorFeedback()
        self.stale_messages = 0  # messages of collectives already over here (dropped)
        self._seq = 0
        self._inbox: dict[tuple[int, int, int], Got] = {}
        self._waiters: dict[tuple[int, int, int], asyncio.Future[Got]] = {}
        self._finished: set[int] = set()
        self._low = 0  # every seq below this is over
        self._stats: deque[CallStats] = deque(maxlen=STATS_KEPT)
        self._tallies: dict[int, _Tally] = {}
        self.send_pool = SendPool()

    @property
    def name(self) -> str:
        return self.names[self.site]

    def add_link(self, peer: int, session: GatewaySession, listener: GatewayListener | None,
                 pool: ReceivePool | None = None) -> None:
        """``pool``: the one whose ``allocate`` the session was set up with (buffers reused)."""
        self.links[peer] = Link(peer, self.names[peer], session, self._deliver, self._link_failed, listener,
                                pool)

    # -- collectives -----------------------------------------------------------

    async def all_reduce(self, array: Any, op: str = "sum", compress: str | None = None,
                         timeout: float | None = None, name: str | None = None) -> Any:
        """Reduce ``array`` over all sites in place (numpy array or CPU tensor); returns it.

        ``op``: "sum" or "mean" (divided after the fixed-order sum). ``compress``: None,
        "bf16" or "int8" (float32 only): contributions travel encoded and keep an
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
            _check_reduce(op, arr.dtype)
            codec.check_codec(compress, arr.dtype)
        call = self._call("all_reduce", arr, compress=compress, reduce=op)
        work = self._all_reduce(call, arr, array, name)
        return Handle(call, self._run(call, work, timeout))

    async def reduce_scatter(self, array: Any, op: str = "sum", compress: str | None = None,
                             timeout: float | None = None, name: str | None = None) -> npt.NDArray[Any]:
        """Site k ends with part k (``part_bounds``) of the reduction, written into that part of
        ``array`` and returned (a view when ``array`` is contiguous); other parts unchanged."""
        with self._refusing("reduce_scatter"):
            arr = as_array(array)
            _check_reduce(op, arr.dtype)
            codec.check_codec(compress, arr.dtype)
        call = self._call("reduce_scatter", arr, compress=compress, reduce=op)
        result: npt.NDArray[Any] = await self._run(call, self._reduce_scatter(call, arr, name), timeout)
        return result

    async def all_gather(self, array: Any, out: Any = None, timeout: float | None = None) -> npt.NDArray[Any]:
        """Every site's ``array`` (same shape and dtype everywhere), stacked in site order:
        ``out[k]`` is site k's. ``out`` (shape ``(n, *array.shape)``) is filled when given."""
        with self._refusing("all_gather"):
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
            if not 0 <= root < self.size:
                raise ValueError(f"root: {root} is not a site index (0..{self.size - 1})")
            arr = as_array(array)
        call = self._call("broadcast", arr, root=root)
        await self._run(call, self._broadcast(call, arr), timeout)
        return array

    async def barrier(self, timeout: float | None = None) -> None:
        """Returns once every site has called it (the same number of collectives in)."""
        call = self._call("barrier", np.empty(0, dtype=np.uint8))
        await self._run(call, self._header_only(call), timeout)

    # -- figures ---------------------------------------------------------------

    def stats(self) -> list[CallStats]:
        """The collectives this site ran, oldest first (the last ``STATS_KEPT``)."""
        return list(self._stats)

    def path_stats(self) -> dict[str, tuple[PathStats, ...]]:
        """Per peer site name: its session's paths (bytes we sent on each, RTT, state)."""
        return {link.name: link.path_stats() for link in self.links.values()}

    def part_bounds(self, count: int) -> list[tuple[int, int]]:
        return part_bounds(count, self.size)

    # -- lifecycle -------------------------------------------------------------

    async def close(self, drain_s: float = 5.0) -> None:
        """Let our last messages land (bounded), then end every session. Idempotent."""
        if self.broken is None:
            await asyncio.gather(*(link.drain(drain_s) for link in self.links.values()))
            self.broken = CollectiveError("the group is closed")
        links, self.links = list(self.links.values()), {}
        await asyncio.gather(*(link.close() for link in links), return_exceptions=True)
        for fut in self._waiters.values():
            _fail(fut, self.broken)
        self._waiters.clear()

    async def __aenter__(self) -> Group:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- schedules ---------------------------------------------------------------
    # Array work (copies, codecs, sums) goes through ``_cpu``: a worker thread for
    # large arrays, so the loop keeps acknowledging and pacing meanwhile.

    async def _all_reduce(self, call: Call, arr: npt.NDArray[Any], original: Any, name: str | None,
                          ) -> Any:
        flat = flat_work(arr)
        key = self.feedback.key(name, arr)
        if self.size == 2:
            bounds = [(0, call.count)] * 2
            payloads, mine = await _cpu(flat.nbytes, self._prepare, call.compress, key, flat, bounds,
                                        self._take_buffers(call.compress, flat, bounds))
            got = await self._exchange(call, 0, {p: (0, call.count, payloads[p]) for p in self.links})
            await _cpu(flat.nbytes, self._reduce, call, flat, mine, got, 0)
        else:
            bounds = part_bounds(call.count, self.size)
            own = await self._scatter_reduce(call, flat, key, bounds)
            await self._gather_parts(call, flat, own, bounds)
        write_back(arr, flat)
        return original

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
        payloads, mine = await _cpu(flat.nbytes, self._prepare, call.compress, key, flat, bounds,
                                    self._take_buffers(call.compress, flat, bounds))
        sends = {p: (bounds[p][0], bounds[p][1] - bounds[p][0], payloads[p]) for p in self.links}
        got = await self._exchange(call, 0, sends)
        a, b = bounds[self.site]
        reduced = np.empty(b - a, dtype=flat.dtype)
        await _cpu(reduced.nbytes, self._reduce, call, reduced, mine[a:b], got, a)
        return reduced

    async def _gather_parts(self, call: Call, flat: npt.NDArray[Any], own: npt.NDArray[Any],
                            bounds: list[tuple[int, int]]) -> None:
        """Phase 1: every site's reduced part to every site (encoded again when compressing;
        the owner keeps the decoded value, so all sites hold the same bytes)."""
        a, b = bounds[self.site]
        payload, own = await _cpu(own.nbytes, _encode_part, call.compress, own)
        got = await self._exchange(call, 1, {p: (a, b - a, payload) for p in self.links})

        def place() -> None:
            flat[a:b] = own
            for peer, message in got.items():
                pa, pb = bounds[peer]
                if pb > pa:
                    flat[pa:pb] = self._decode(call, message)

        await _cpu(flat.nbytes, place)

    async def _all_gather(self, call: Call, arr: npt.NDArray[Any], out: npt.NDArray[Any] | None,
                          ) -> npt.NDArray[Any]:
        payload = await _cpu(arr.nbytes, payload_of, flat_work(arr))
        got = await self._exchange(call, 0, {p: (0, call.count, payload) for p in self.links})
        result = np.empty((self.size, *arr.shape), dtype=arr.dtype) if out is None else out

        def place() -> None:
            result[self.site] = arr
            for peer, message in got.items():
                result[peer] = self._decode(call, message).reshape(arr.shape)

        await _cpu(result.nbytes, place)
        return result

    async def _broadcast(self, call: Call, arr: npt.NDArray[Any]) -> None:
        flat = flat_work(arr)
        if self.site == call.root:
            payload = await _cpu(flat.nbytes, payload_of, flat)
            await self._exchange(call, 0, {p: (0, call.count, payload) for p in self.links})
            return
        got = await self._exchange(call, 0, {p: (0, 0, None) for p in self.links})

        def place() -> None:
            flat[:] = self._decode(call, got[call.root])
            write_back(arr, flat)

        await _cpu(flat.nbytes, place)

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
        _fixed_sum(out, parts, call.reduce, self.size)

    def _decode(self, call: Call, message: Got) -> npt.NDArray[Any]:
        _, header, body = message
        if call.compress is None or call.op in ("all_gather", "broadcast"):
            return body.view(np.dtype(call.dtype))
        return codec.decode(call.compress, body, header.elements)

    # -- plumbing --------------------------------------------------------------

    @contextlib.contextmanager
    def _refusing(self, op: str) -> Iterator[None]:
        """A call whose own arguments are invalid raises ValueError here, but it still takes
        its place in the sequence and tells every peer why (an ``abort`` message), so the
        peers' matching calls fail at once naming this site instead of waiting out their
        timeout for a message that would never come."""
        try:
            yield
        except ValueError as exc:
            self._check_usable()
            call = Call(self._seq, "abort", 0, "")
            self._seq += 1
            reason = f"{op}: {exc}".encode()[:ABORT_REASON_BYTES]
            message = new_payload(len(reason))
            body_of(message)[:] = np.frombuffer(reason, dtype=np.uint8)
            for link in self.links.values():
                link.send(Header(call, 0, 0, len(reason)), message)
            self._over(call.seq)  # the peers' messages for it are dropped as they come
            raise

    async def _exchange(self, call: Call, phase: int,
                        sends: dict[int, tuple[int, int, npt.NDArray[np.uint8] | None]]) -> dict[int, Got]:
        """Send each peer its message of this phase; one from each peer, checked, in return."""
        tally = self._tallies.get(call.seq)
        for peer, (offset, elements, payload) in sends.items():
            message = payload if payload is not None and elements > 0 else new_payload(0)
            task = self.links[peer].send(Header(call, phase, offset, elements), message)
            if message.nbytes > HEADER_BYTES:
                self.send_pool.sending(call.seq, message, task)
            if tally is not None:
                tally.sent += message.nbytes
        futures = [self._receive(peer, call.seq, phase) for peer in self.links]
        got: dict[int, Got] = {}
        for next_done in asyncio.as_completed(futures):
            peer, header, body = await next_done
            if header.call.op == "abort":
                reason = body.tobytes().decode("utf-8", "replace")
                raise CollectiveError(f"{call.op} #{call.seq}: site {self.names[peer]} called with bad "
                                      f"arguments ({reason})", self.names[peer])
            problem = mismatch(call, header.call)
            if problem is not None:
                raise CollectiveError(f"{call.op} #{call.seq}: site {self.names[peer]} called a different "
                                      f"collective: {problem}", self.names[peer])
            if tally is not None:
                tally.received += 64 + body.nbytes
            _check_body(call, header, body, self.names[peer])
            got[peer] = (peer, header, body)
        return got

    def _call(self, op: str, arr: npt.NDArray[Any], compress: str | None = None, reduce: str = "none",
              root: int = -1) -> Call:
        self._check_usable()
        call = Call(self._seq, op, int(arr.size), arr.dtype.str, compress, reduce, root)
        self._seq += 1
        return call

    async def _run(self, call: Call, work: Coroutine[Any, Any, Any], timeout: float | None) -> Any:
        limit = self.timeout_s if timeout is None else timeout
        started = time.monotonic()
        tally = self._tallies[call.seq] = _Tally()
        ok = False
        try:
            self._check_usable()
            result = await asyncio.wait_for(work, limit)
            ok = True
            return result
        except TimeoutError:
            missing = sorted({self.names[p] for (p, seq, _) in self._waiters if seq == call.seq})
            who = ", ".join(missing) or "(none missing: local work was too slow)"
            error = CollectiveError(f"{call.op} #{call.seq}: no message from site {who} within {limit:g} s "
                                    f"(dead or stalled); the group is broken, join again",
                                    missing[0] if missing else None)
            self._break(error)
            raise error from None
        finally:
            self._tallies.pop(call.seq, None)
            self._over(call.seq)
            self._stats.append(CallStats(call.seq, call.op, call.count, call.compress, started,
                                         time.monotonic() - started, tally.sent, tally.received, ok))

    def _check_usable(self) -> None:
        if self.broken is not None:
            raise CollectiveError(f"group unusable: {self.broken}", self.broken.site)

    def _receive(self, peer: int, seq: int, phase: int) -> asyncio.Future[Got]:
        key = (peer, seq, phase)
        fut: asyncio.Future[Got] = asyncio.get_running_loop().create_future()
        if key in self._inbox:
            fut.set_result(self._inbox.pop(key))
        elif self.broken is not None:
            _fail(fut, self.broken)
        else:
            self._waiters[key] = fut
        return fut

    def _deliver(self, link: Link, header: Header, body: npt.NDArray[np.uint8]) -> bool:
        seq = header.call.seq
        if seq < self._low or seq in self._finished:
            self.stale_messages += 1
            return False
        key = (link.index, seq, header.phase)
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result((link.index, header, body))
        else:
            self._inbox[key] = (link.index, header, body)
        return True

    def _over(self, seq: int) -> None:
        self._finished.add(seq)
        while self._low in self._finished:
            self._finished.discard(self._low)
            self._low += 1
        for key in [k for k in self._inbox if k[1] == seq]:
            del self._inbox[key]
        for key in [k for k in self._waiters if k[1] == seq]:
            self._waiters.pop(key).cancel()
        for link in self.links.values():
            link.pool.release(seq)
        self.send_pool.release(seq)

    def _link_failed(self, link: Link, error: CollectiveError) -> None:
        self._break(error)

    def _break(self, error: CollectiveError) -> None:
        if self.broken is None:
            self.broken = error
        for fut in self._waiters.values():
            _fail(fut, error)
        self._waiters.clear()



def _fail(fut: asyncio.Future[Any], error: BaseException) -> None:
    """Fail a waiter; its caller may have gone (timed out), so the error counts as seen."""
    if not fut.done():
        fut.set_exception(error)
        fut.exception()


def _check_reduce(op: str, dtype: np.dtype[Any]) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"op: unknown {op!r}; valid: {', '.join(map(repr, REDUCE_OPS))}")
    if op == "mean" and not np.issubdtype(dtype, np.inexact):
        raise ValueError(f"op='mean' needs a floating dtype, got {dtype}")


def _check_body(call: Call, header: Header, body: npt.NDArray[np.uint8], site: str) -> None:
    if header.elements == 0:
        want = 0
    elif call.op in ("all_gather", "broadcast") or call.compress is None:
        want = header.elements * np.dtype(call.dtype).itemsize
    else:
        want = codec.encoded_bytes(call.compress, header.elements)
    if body.nbytes != want or header.offset + header.elements > call.count:
        raise CollectiveError(f"{call.op} #{call.seq}: site {site} sent a malformed part "
                              f"({body.nbytes} B for {header.elements} elements at {header.offset})", site)


def _fixed_sum(out: npt.NDArray[Any], parts: list[npt.NDArray[Any]], reduce: str, n: int) -> None:
    """``out = ((parts[0] + parts[1]) + ...)`` in site order; "mean" divides after."""
    np.copyto(out, parts[0])
    for part in parts[1:]:
        np.add(out, part, out=out)
    if reduce == "mean":
        np.divide(out, out.dtype.type(n), out=out)


def _encode_part(compress: str | None, part: npt.NDArray[Any],
                 ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[Any]]:
    """A reduced part's message buffer and the value every site will hold for it."""
    if compress is None or not part.size:
        return payload_of(part), part
    payload = new_payload(codec.encoded_bytes(compress, part.size))
    codec.encode(compress, part, body_of(payload))
    return payload, codec.decode(compress, body_of(payload), part.size)


async def _cpu(nbytes: int, fn: Any, *args: Any) -> Any:
    """Run ``fn`` in a worker thread when the arrays are large, inline when small."""
    if nbytes > 1 << 18:
        return await asyncio.to_thread(fn, *args)
    return fn(*args)
