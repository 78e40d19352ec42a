"""An asyncio endpoint: one sans-IO ``Session`` over one UDP socket per path.

The endpoint is the runtime around the core, in the shape of aioquic's
protocol around ``QuicConnection``: socket readiness and timers call the
session with ``now``, and after every call ``_service`` pops events, turns
what the session wants to send into datagrams and re-arms the one timer.

The session decides every datagram (its wire number and bytes) and
translates acknowledgements; the endpoint only moves them. Per-datagram work
stays below Python: the native data path segments, seals and paces bursts
(``native_path``), and receives, opens and places batches; Python runs per
poll, per receive batch and per run of datagrams. Both data paths implement
one protocol (``aio.datapath``), so nothing here depends on which one runs.

This module drives the session; its neighbours each do one job around it:
``aio.intake`` drains the sockets into the session (receive coalescing, as the
core decides it), ``aio.verify`` keeps the receiving shards' buffers and
digests, ``aio.handoff`` passes the QUIC datagrams met on a shared port back.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from wanxport.aio.config import EndpointConfig
from wanxport.aio.datapath import Datapath
from wanxport.aio.datapath_choice import open_datapath, resolve_datapath
from wanxport.aio.handoff import QuicHandoff, check_ports
from wanxport.aio.intake import Intake
from wanxport.aio.loop import timer_delay_s
from wanxport.aio.plan import plan_transmits
from wanxport.aio.port import PathPort
from wanxport.aio.ratelog import RateLimitedLog
from wanxport.aio.sockets import open_path_socket
from wanxport.aio.verify import Allocator, ReceivedShard, ShardVerifier
from wanxport.aio.window import SessionWindow
from wanxport.core.config import PACER_HEADROOM
from wanxport.core.events import (
    PathChanged,
    ReceiveStalled,
    SessionClosed,
    ShardAcknowledged,
    ShardFilled,
    ShardReceived,
)
from wanxport.core.session import Session
from wanxport.wire import native
from wanxport.wire.frames import DATA_OVERHEAD

log = logging.getLogger(__name__)

__all__ = ["Allocator", "Endpoint", "ReceivedShard", "resolve_datapath"]

BACKLOG_RETRY_S = 0.0005
PATH_LOG_INTERVAL_S = 60.0  # at most one "path X: a -> b" line per path per minute


class Endpoint(SessionWindow):
    """One gateway's side of a session. Create, ``start()`` inside the loop, ``close()``.

    With ``ports`` (one ``aio.port.PathPort`` per path) the endpoint uses those
    shared sockets instead of binding its own: it drains them while it runs,
    hands the QUIC-looking datagrams its data path returns (``Received.quic``)
    back to their port's control side, sends to ``config.sockets[i].remote`` by
    address, and leaves the sockets open when it ends. Without ports, a
    QUIC-looking datagram has no taker: it is counted (``handoff.unclaimed``) and dropped.
    ``bound``: its own sockets opened beforehand (a port announced to the peer before the
    endpoint exists must stay ours), owned by the endpoint from then on as if it opened them.
    """

    def __init__(self, config: EndpointConfig, allocator: Allocator | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ports: Sequence[PathPort] | None = None,
                 bound: Sequence[socket.socket] | None = None) -> None:
        self.config = config
        self.clock = clock
        self.datapath_name = resolve_datapath(config.datapath)
        paths = config.session.paths
        self._segments = [config.session.datagram_payload(p) for p in paths]
        self._wire_factor = [self._pacing_factor(i) for i in range(len(paths))]
        self.ports = list(ports) if ports is not None else None
        self.handoff = QuicHandoff(self.ports)
        self.intake = Intake(self)
        # Kept, so that a port detaches only this endpoint's own reader (by identity).
        self._readers = [functools.partial(self.intake.on_readable, i) for i in range(len(config.sockets))]
        self.sockets = []
        try:
            if self.ports is not None:
                check_ports(self.ports, config.sockets)
                self.sockets = [port.socket for port in self.ports]
            elif bound is not None:
                self.sockets = list(bound)
            else:
                for spec in config.sockets:
                    self.sockets.append(open_path_socket(spec, config.recv_buffer_bytes,
                                                         config.send_buffer_bytes))
            self.datapath: Datapath = open_datapath(config, self.datapath_name, self.sockets,
                                                    shared=self.ports is not None)
        except BaseException:
            if self.ports is None:
                for sock in self.sockets:
                    sock.close()
            raise
        # Digests are computed in a worker thread (the hash drops the GIL) as each shard
        # arrives (aio.verify): hashing a large shard on the loop would hold back every
        # path's acknowledgements, and hashing it only once complete would delay it.
        self.verifier = ShardVerifier(self.datapath, allocator, self._on_verdict)
        # Receive coalescing (EndpointConfig.receive_holdoff_s) is the core's decision (core.holdoff);
        # with the native data path each path's received packet numbers are kept in C.
        self.session = Session(config.session, allocator=self.verifier.allocate, defer_verification=True,
                               receive_holdoff_s=config.receive_holdoff_s,
                               receive_interval=config.receive_interval,
                               ack_record=native.ack_record if self.datapath_name == "native" else None)
        self._received: asyncio.Queue[ReceivedShard] | None = None
        self._acks: dict[int, asyncio.Future[bool]] = {}
        #: Called with each ``PathChanged`` (a path's health state moved), on the loop.
        self.path_listeners: list[Callable[[PathChanged], None]] = []
        # A flapping path: a line a minute (the latest change, with the count held back).
        self._path_log = RateLimitedLog(log, PATH_LOG_INTERVAL_S, schedule=self._call_later)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._retry: asyncio.TimerHandle | None = None
        self._pending_service: asyncio.Handle | None = None  # service_soon() scheduled
        self._closed: asyncio.Future[SessionClosed] | None = None
        self._stalled: asyncio.Future[ReceiveStalled] | None = None
        self._heard: list[bool] | None = None  # probe_paths() in progress
        # When each path last brought a datagram of this session (clock(); -inf before the
        # first): a session's liveness, read by whoever bounds how long a silent peer may be.
        self.last_heard = [float("-inf")] * len(config.sockets)
        self._all_heard: asyncio.Future[None] | None = None
        # The loop's per-event work (``loop_events``); the receive side counts its own (``intake``).
        self.services = 0
        self.plans_sent = 0
        self.timer_wakes = 0

    def _pacing_factor(self, path_id: int) -> float:
        """Pacer rate per core rate: a core packet leaves as several datagrams, each with its
        headers, spread a little faster than the core's own pacing (PACER_HEADROOM)."""
        cfg = self.config.session
        chunk = cfg.data_payload(cfg.paths[path_id])
        per_datagram = cfg.packet_overhead() + DATA_OVERHEAD
        datagrams = -(-chunk // self._segments[path_id])
        return (chunk + datagrams * per_datagram) / (chunk + per_datagram) * PACER_HEADROOM

    # -- lifecycle -----------------------------------------------------------

    @property
    def local_addresses(self) -> list[tuple[str, int]]:
        return [sock.getsockname()[:2] for sock in self.sockets]

    def connect(self, remotes: list[tuple[str, int]]) -> None:
        """Set the peer's address per path when it was not known at construction."""
        if self.ports is not None:
            raise RuntimeError("an endpoint on shared ports sends by address; give remotes up front")
        for sock, remote in zip(self.sockets, remotes, strict=True):
            sock.connect(remote)

    def start(self) -> None:
        """Register the sockets with the running loop and start sending."""
        loop = asyncio.get_running_loop()
        self.loop = self.verifier.loop = loop
        self._received = asyncio.Queue()
        self._closed = loop.create_future()
        self._stalled = loop.create_future()
        threaded = self.datapath.threaded
        for path_id, sock in enumerate(self.sockets):
            self.datapath.attach(path_id)
            if self.ports is not None:
                self.ports[path_id].attach_data(self._readers[path_id])
                if threaded:  # the data path's worker threads drain the socket
                    self.ports[path_id].pause_reading()
            elif not threaded:
                loop.add_reader(sock.fileno(), self.intake.on_readable, path_id)
        self.datapath.start(loop, self.intake.on_delivered)
        self._service()

    async def probe_paths(self, timeout_s: float) -> list[bool]:
        """Before any data: one PROBE per path, wait until the peer answered on each.

        The first datagram towards a new neighbour waits for ARP/NDP, which here
        crosses the whole path, and meanwhile the kernel keeps only ~200 KiB per
        unresolved neighbour, dropping the *oldest*: the first burst would lose
        its head — the SHARD_OPEN — and the peer could acknowledge none of the
        data until a probe timeout re-sent it. This is the connection setup a
        TCP handshake does implicitly. The peer must be listening (an ICMP
        unreachable on a connected socket stops uvloop's reader). Returns, per
        path, whether the peer answered within ``timeout_s``.
        """
        assert self.loop is not None, "start() the endpoint first"
        probes = self.session.handshake_probes(self.clock())
        self._heard = [False] * len(self.sockets)
        self._all_heard = self.loop.create_future()
        self.datapath.send(plan_transmits(probes))
        try:
            await asyncio.wait_for(asyncio.shield(self._all_heard), timeout_s)
        except TimeoutError:
            pass
        heard, self._heard, self._all_heard = self._heard, None, None
        return heard

    def heard(self, path_id: int, now: float) -> None:
        """A datagram of this session arrived on the path (``intake``)."""
        self.last_heard[path_id] = now
        if self._heard is not None and self._all_heard is not None:
            self._heard[path_id] = True
            if all(self._heard) and not self._all_heard.done():
                self._all_heard.set_result(None)

    async def close(self, reason: str = "") -> None:
        """Send CLOSE (best effort), let queued datagrams leave, release everything."""
        try:
            if self.loop is not None and self.session.closed is None:
                self.session.close(self.clock(), 0, reason)
                self._service()
        finally:
            self.abort()

    def abort(self) -> None:
        """Release sockets, timers and the pacer now, without telling the peer."""
        for handle in (self._timer, self._retry, self._pending_service):
            if handle is not None:
                handle.cancel()
        self._timer = self._retry = self._pending_service = None
        self.intake.cancel()
        try:
            self.datapath.close()
        finally:
            if self.ports is not None:
                if self.loop is not None:  # the ports stay open (the control side still listens)
                    for port, reader in zip(self.ports, self._readers, strict=True):
                        port.detach_data(reader)
                        port.resume_reading()
            else:
                for sock in self.sockets:
                    if self.loop is not None and sock.fileno() >= 0:
                        self.loop.remove_reader(sock.fileno())
                    sock.close()
            for fut in self._acks.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("endpoint closed"))
            self.loop = None
            self._path_log.flush_all()  # the paths' last state, if a change was held back

    def _call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        if self.loop is not None:
            self.loop.call_later(delay_s, callback)

    async def __aenter__(self) -> Endpoint:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- application side ----------------------------------------------------

    def submit(self, shard_id: int, data: Any, meta: bytes = b"", digest: bytes | None = None,
               digest_later: bool = False) -> asyncio.Future[bool]:
        """Queue a shard; the future resolves to the receiver's verdict (True: verified).
        ``digest_later``: it leaves unhashed and ``set_digest`` gives its digest (protocol 5)."""
        assert self.loop is not None, "start() the endpoint first"
        view = memoryview(data).cast("B")
        fut: asyncio.Future[bool] = self.loop.create_future()
        self._acks[shard_id] = fut
        self.session.submit(shard_id, view, self.clock(), meta=meta, digest=digest, digest_later=digest_later)
        self._service()
        return fut

    def set_digest(self, shard_id: int, digest: bytes) -> None:
        """The digest of a shard submitted with ``digest_later`` (``core.late_digest``)."""
        self.session.set_digest(shard_id, digest)
        self._service()

    async def send_shard(self, shard_id: int, data: Any, meta: bytes = b"") -> bool:
        return await self.submit(shard_id, data, meta)

    async def receive_shard(self) -> ReceivedShard:
        assert self._received is not None, "start() the endpoint first"
        return await self._received.get()

    async def wait_closed(self) -> SessionClosed:
        assert self._closed is not None, "start() the endpoint first"
        return await self._closed

    async def wait_stalled(self) -> ReceiveStalled:
        """Until the session reports incoming data stalled (``watch_stall``)."""
        assert self._stalled is not None, "start() the endpoint first"
        return await self._stalled

    def watch_stall(self, timeout_s: float | None) -> None:
        """Report a stall when shards are open and no data arrived for ``timeout_s`` (``core.stall``)."""
        self.session.watch_stall(timeout_s, self.clock())
        if self.loop is not None:
            self._service()  # the session's deadline moved

    @property
    def datagrams_rejected(self) -> int:
        return int(self.datapath.rejected) + self.intake.malformed_controls + self.handoff.unclaimed

    def service_soon(self) -> None:
        """Service the session once the loop has run every I/O callback that is ready.

        Several paths readable in one loop iteration (and a timer due in it) then
        cost one poll of the session, one set of transmits handed to the data
        path and one timer re-armed, instead of one each: the ACKs of all of them
        are applied before the windows they opened are filled.
        """
        if self._pending_service is None and self.loop is not None:
            self._pending_service = self.loop.call_soon(self._deferred_service)

    def _deferred_service(self) -> None:
        self._pending_service = None
        self._service()

    def _on_timer(self) -> None:
        self._timer = None
        due, self._timer_at = self._timer_at, float("inf")
        now = self.clock()
        if now < due:  # early (a loop's timer granularity): wait for the rest, do nothing yet
            self._arm(due, now)
            return
        self.timer_wakes += 1
        if not self.datapath.threaded and self.session.judgement_due(now):
            self.intake.drain_all()  # what already arrived, before a deadline judges its absence
            if self.loop is None:  # what the drain handed on closed the endpoint
                return
            now = self.clock()
        self.session.on_deadline(now)
        self.service_soon()

    def _on_retry(self) -> None:
        self._retry = None
        self.datapath.flush()
        self._service()

    def _service(self) -> None:
        """Events out, datagrams out, timer re-armed: after every call into the session."""
        if self.loop is None:
            return
        session = self.session
        now = self.clock()
        self.services += 1
        for event in session.events():
            self._on_event(event)
        transmits = session.poll_transmit(now)
        if transmits:
            for path_id, rate_bps in enumerate(session.pacing_rates_bps()):
                self.datapath.set_rate(path_id, rate_bps / 8 * self._wire_factor[path_id])
            plans = plan_transmits(transmits)
            self.plans_sent += len(plans)
            self.datapath.send(plans)
        if self.datapath.backlogged and self._retry is None:
            self._retry = self.loop.call_later(BACKLOG_RETRY_S, self._on_retry)
        deadline = session.next_deadline()
        self._arm(deadline, now)

    def _on_verdict(self, shard_id: int, ok: bool) -> None:
        self.session.shard_verified(shard_id, ok, self.clock())
        self._service()

    def _arm(self, deadline: float | None, now: float) -> None:
        assert self.loop is not None
        if deadline is None or deadline >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self.loop.call_later(timer_delay_s(deadline - now), self._on_timer)

    def _on_event(self, event: object) -> None:
        if isinstance(event, ShardFilled):
            self.verifier.filled(event.shard_id, event.digest)  # no writes while the rest is hashed
        elif isinstance(event, ShardReceived):
            view = self.verifier.take(event.shard_id)
            assert self._received is not None
            self._received.put_nowait(ReceivedShard(event.shard_id, view, event.meta, event.ok, event.at,
                                                     event.digest))
        elif isinstance(event, ShardAcknowledged):
            fut = self._acks.pop(event.shard_id, None)
            if fut is not None and not fut.done():
                fut.set_result(event.ok)
        elif isinstance(event, SessionClosed):
            if self._closed is not None and not self._closed.done():
                self._closed.set_result(event)
        elif isinstance(event, PathChanged):
            self._path_log.log(event.name, logging.INFO, "path %s: %s -> %s", event.name, event.old,
                               event.new)
            for listener in self.path_listeners:
                listener(event)
        elif isinstance(event, ReceiveStalled):
            if self._stalled is not None and not self._stalled.done():
                self._stalled.set_result(event)

