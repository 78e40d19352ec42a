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
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wanxport.aio.config import Address, DirectionKey, EndpointConfig
from wanxport.aio.datapath import Datapath, Received
from wanxport.aio.plan import plan_transmits
from wanxport.aio.port import PathPort
from wanxport.aio.python_path import PythonDatapath
from wanxport.aio.ratelog import RateLimitedLog
from wanxport.aio.sockets import open_path_socket
from wanxport.aio.verify import ShardHasher
from wanxport.core.config import PACER_HEADROOM
from wanxport.core.events import PathChanged, SessionClosed, ShardAcknowledged, ShardFilled, ShardReceived
from wanxport.core.session import Session
from wanxport.wire import native
from wanxport.wire.errors import WireError
from wanxport.wire.frames import DATA_OVERHEAD, Frame, decode_frames

log = logging.getLogger(__name__)

Allocator = Callable[[int, int, bytes], Any]  # (shard_id, size, meta) -> writable buffer of `size` bytes
BACKLOG_RETRY_S = 0.0005
HOLDOFF_RTT_RATIO = 8  # a path's smoothed RTT is at least this many receive hold-offs, or none
# After a drain found its socket pressed (Received.pressed), the hold-off stays off this long:
# a flood or a burst larger than the buffer would otherwise fill it again while held.
HOLDOFF_YIELD_S = 0.5
PATH_LOG_INTERVAL_S = 60.0  # at most one "path X: a -> b" line per path per minute


@dataclass(frozen=True, slots=True)
class ReceivedShard:
    """A shard that arrived; ``ok`` is False when its digest did not match."""

    shard_id: int
    data: memoryview
    meta: bytes
    ok: bool
    at: float


def resolve_datapath(requested: str) -> str:
    """"native", "python", or "auto": native when the extension imports, else python (logged once)."""
    if requested == "auto":
        if native.NATIVE_AVAILABLE:
            return "native"
        log.warning("%s; using the Python data path", native.import_error)
        return "python"
    if requested == "native" and not native.NATIVE_AVAILABLE:
        raise RuntimeError(native.import_error)
    return requested


class Endpoint:
    """One gateway's side of a session. Create, ``start()`` inside the loop, ``close()``.

    With ``ports`` (one ``aio.port.PathPort`` per path) the endpoint uses those
    shared sockets instead of binding its own: it drains them while it runs,
    hands the QUIC-looking datagrams its data path returns (``Received.quic``)
    back to their port's control side, sends to ``config.sockets[i].remote`` by
    address, and leaves the sockets open when it ends. Without ports, a
    QUIC-looking datagram has no taker: it is counted (``quic_unclaimed``) and dropped.
    """

    def __init__(self, config: EndpointConfig, allocator: Allocator | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 ports: Sequence[PathPort] | None = None) -> None:
        self.config = config
        self.clock = clock
        self._user_allocator = allocator
        self.datapath_name = resolve_datapath(config.datapath)
        # Digests are computed in a worker thread (the hash drops the GIL) as each shard
        # arrives (aio.verify): hashing a large shard on the loop would hold back every
        # path's acknowledgements, and hashing it only once complete would delay it.
        self.session = Session(config.session, allocator=self._allocate, defer_verification=True)
        paths = config.session.paths
        self._segments = [config.session.datagram_payload(p) for p in paths]
        self._wire_factor = [self._pacing_factor(i) for i in range(len(paths))]
        self.ports = list(ports) if ports is not None else None
        # Kept, so that a port detaches only this endpoint's own reader (by identity).
        self._readers = [functools.partial(self._on_readable, i) for i in range(len(config.sockets))]
        self.sockets = []
        try:
            if self.ports is not None:
                self._check_ports(self.ports)
                self.sockets = [port.socket for port in self.ports]
            else:
                for spec in config.sockets:
                    self.sockets.append(open_path_socket(spec, config.recv_buffer_bytes,
                                                         config.send_buffer_bytes))
            self.datapath: Datapath = self._make_datapath()
        except BaseException:
            if self.ports is None:
                for sock in self.sockets:
                    sock.close()
            raise
        self._rx_buffers: dict[int, memoryview] = {}
        self._hashers: dict[int, ShardHasher] = {}
        self._received: asyncio.Queue[ReceivedShard] | None = None
        self._acks: dict[int, asyncio.Future[bool]] = {}
        #: Called with each ``PathChanged`` (a path's health state moved), on the loop.
        self.path_listeners: list[Callable[[PathChanged], None]] = []
        # A flapping path: a line a minute (the latest change, with the count held back).
        self._path_log = RateLimitedLog(log, PATH_LOG_INTERVAL_S, schedule=self._call_later)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = float("inf")
        self._retry: asyncio.TimerHandle | None = None
        self._pending_service: asyncio.Handle | None = None  # _service_soon() scheduled
        # Receive coalescing (EndpointConfig.receive_holdoff_s), never beyond the ACK delay,
        # and only while every measured path's RTT is long beside it (_update_holding).
        self._holdoff_s = min(config.receive_holdoff_s, config.session.max_ack_delay_s)
        self._holding = self._holdoff_s > 0.0
        self._holdoff_yields_until = 0.0  # clock() before which the hold-off has yielded
        self._held: list[int] = []  # paths readable and waiting out the hold-off
        self._held_timer: asyncio.TimerHandle | None = None
        self._closed: asyncio.Future[SessionClosed] | None = None
        self._heard: list[bool] | None = None  # probe_paths() in progress
        # When each path last brought a datagram of this session (clock(); -inf before the
        # first): a session's liveness, read by whoever bounds how long a silent peer may be.
        self.last_heard = [float("-inf")] * len(config.sockets)
        self._all_heard: asyncio.Future[None] | None = None
        self.malformed_controls = 0
        self.receive_passes = 0  # drains of one or more paths handed to the session together
        self.holdoff_yields = 0  # drains that found a socket pressed and turned the hold-off off
        self.quic_unclaimed = 0  # QUIC-looking datagrams on a socket no control channel shares
        self.data_runs = 0
        self.data_records = 0
        # The loop's per-event work, counted so CPU per GB can be read as CPU per event:
        # control packets decoded in Python (at a sender: its ACKs), session services,
        # plans handed to the data path (a data plan is one native seal call).
        self.control_records = 0
        self.services = 0
        self.plans_sent = 0

    def _check_ports(self, ports: list[PathPort]) -> None:
        if len(ports) != len(self.config.sockets):
            raise ValueError(f"ports: {len(ports)} given, the session has {len(self.config.sockets)} paths")
        for i, (port, spec) in enumerate(zip(ports, self.config.sockets, strict=True)):
            if spec.remote is None:
                raise ValueError(f"sockets[{i}].remote: a shared port sends by address; give the peer's")
            if port.data_attached:
                raise OSError(f"{port.address[0]}:{port.address[1]}: port already carries a session")

    def _make_datapath(self) -> Datapath:
        cfg = self.config
        # Shared ports are unconnected: the data path sends to each path's peer by address.
        destinations = None if self.ports is None else [spec.remote for spec in cfg.sockets]
        if self.datapath_name == "python":
            return PythonDatapath(self.sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                                  cfg.local_conn_id, destinations=destinations)
        from wanxport.aio.native_path import NativeDatapath

        slot = max(p.mtu for p in cfg.session.paths)
        return NativeDatapath(self.sockets, cfg.send_key, cfg.recv_key, cfg.remote_conn_id,
                              cfg.local_conn_id, slot_size=max(2048, slot), capacity=cfg.pacer_capacity,
                              spin_ns=cfg.pacer_spin_ns, burst_ns=cfg.pacer_burst_ns,
                              destinations=destinations, workers=cfg.workers)

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
        self._loop = loop
        self._received = asyncio.Queue()
        self._closed = loop.create_future()
        threaded = self.datapath.threaded
        for path_id, sock in enumerate(self.sockets):
            self.datapath.attach(path_id)
            if self.ports is not None:
                self.ports[path_id].attach_data(self._readers[path_id])
                if threaded:  # the data path's worker threads drain the socket
                    self.ports[path_id].pause_reading()
            elif not threaded:
                loop.add_reader(sock.fileno(), self._on_readable, path_id)
        self.datapath.start(loop, self._on_delivered)
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
        assert self._loop is not None, "start() the endpoint first"
        probes = self.session.handshake_probes(self.clock())
        self._heard = [False] * len(self.sockets)
        self._all_heard = self._loop.create_future()
        self.datapath.send(plan_transmits(probes, self._shard_buffer))
        try:
            await asyncio.wait_for(asyncio.shield(self._all_heard), timeout_s)
        except TimeoutError:
            pass
        heard, self._heard, self._all_heard = self._heard, None, None
        return heard

    def _note_heard(self, path_id: int) -> None:
        assert self._heard is not None and self._all_heard is not None
        self._heard[path_id] = True
        if all(self._heard) and not self._all_heard.done():
            self._all_heard.set_result(None)

    async def close(self, reason: str = "") -> None:
        """Send CLOSE (best effort), let queued datagrams leave, release everything."""
        try:
            if self._loop is not None and self.session.closed is None:
                self.session.close(self.clock(), 0, reason)
                self._service()
        finally:
            self.abort()

    def abort(self) -> None:
        """Release sockets, timers and the pacer now, without telling the peer."""
        for handle in (self._timer, self._retry, self._pending_service, self._held_timer):
            if handle is not None:
                handle.cancel()
        self._timer = self._retry = self._pending_service = self._held_timer = None
        self._held = []
        try:
            self.datapath.close()
        finally:
            if self.ports is not None:
                if self._loop is not None:  # the ports stay open (the control side still listens)
                    for port, reader in zip(self.ports, self._readers, strict=True):
                        port.detach_data(reader)
                        port.resume_reading()
            else:
                for sock in self.sockets:
                    if self._loop is not None and sock.fileno() >= 0:
                        self._loop.remove_reader(sock.fileno())
                    sock.close()
            for fut in self._acks.values():
                if not fut.done():
                    fut.set_exception(ConnectionError("endpoint closed"))
            self._loop = None
            self._path_log.flush_all()  # the paths' last state, if a change was held back

    def _call_later(self, delay_s: float, callback: Callable[[], None]) -> None:
        if self._loop is not None:
            self._loop.call_later(delay_s, callback)

    async def __aenter__(self) -> Endpoint:
        self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- application side ----------------------------------------------------

    def submit(self, shard_id: int, data: Any, meta: bytes = b"", digest: bytes | None = None
               ) -> asyncio.Future[bool]:
        """Queue a shard; the future resolves to the receiver's verdict (True: verified)."""
        assert self._loop is not None, "start() the endpoint first"
        view = memoryview(data).cast("B")
        fut: asyncio.Future[bool] = self._loop.create_future()
        self._acks[shard_id] = fut
        self.session.submit(shard_id, view, self.clock(), meta=meta, digest=digest)
        self._service()
        return fut

    async def send_shard(self, shard_id: int, data: Any, meta: bytes = b"") -> bool:
        return await self.submit(shard_id, data, meta)

    async def receive_shard(self) -> ReceivedShard:
        assert self._received is not None, "start() the endpoint first"
        return await self._received.get()

    async def wait_closed(self) -> SessionClosed:
        assert self._closed is not None, "start() the endpoint first"
        return await self._closed

    @property
    def datagrams_rejected(self) -> int:
        return int(self.datapath.rejected) + self.malformed_controls + self.quic_unclaimed

    # -- keys (rotation is the caller's policy; see wanxport.gateway.rekey) ----

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        """Seal from now on with ``key`` under key phase ``phase`` (its low bit goes on the wire)."""
        self.datapath.use_send_key(phase, key)

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        """Accept datagrams of key phase ``phase`` sealed with ``key`` (the peer's next key)."""
        self.datapath.install_recv_key(phase, key)

    @property
    def packets_under_key(self) -> int:
        return int(self.datapath.packets_under_key)

    @property
    def bytes_under_key(self) -> int:
        return int(self.datapath.bytes_under_key)

    @property
    def pacer_name(self) -> str | None:
        pacer = getattr(self.datapath, "pacer", None)
        return None if pacer is None else str(pacer.name)

    def _allocate(self, shard_id: int, size: int, meta: bytes) -> memoryview:
        # np.empty, not bytearray(size): zero-filling a large shard would stall the
        # loop (and overflow the sockets) for tens of milliseconds; the pages are
        # faulted in by the native placement instead, without the GIL.
        buffer: Any = (self._user_allocator(shard_id, size, meta) if self._user_allocator
                       else np.empty(size, dtype=np.uint8))
        view = memoryview(buffer).cast("B")
        self.datapath.add_shard(shard_id, view)
        freeze = functools.partial(self.datapath.freeze, shard_id)
        self._rx_buffers[shard_id] = view
        assert self._loop is not None  # shards open only while the endpoint runs
        self._hashers[shard_id] = ShardHasher(view, self._loop, freeze)
        return view

    # -- I/O callbacks -------------------------------------------------------

    def _on_readable(self, path_id: int) -> None:
        if self._holding:
            self._hold(path_id)
        else:
            self._drain((path_id,))

    def _hold(self, path_id: int) -> None:
        """Receive coalescing: stop watching the path, drain it when the hold-off ends.

        The way a NIC's interrupt moderation works: the first datagram arms a timer and
        what arrives until it fires (on this path and every other path that wakes
        meanwhile) is drained in one pass, so the per-wake costs are paid once per
        hold-off instead of once per datagram or two. The socket must leave the
        loop's watch meanwhile: its readiness is level-triggered.
        """
        assert self._loop is not None  # readers run only while the endpoint does
        self._watch(path_id, False)
        self._held.append(path_id)
        if self._held_timer is None:
            self._held_timer = self._loop.call_later(self._holdoff_s, self._release_held)

    def _release_held(self, paths: Sequence[int] | None = None) -> None:
        """Drain ``paths`` (the held ones by default) and watch the held ones again."""
        self._held_timer = None
        held, self._held = self._held, []
        try:
            self._drain(held if paths is None else paths)
        finally:
            if self._loop is not None:  # not closed by what the drain handed on
                for path_id in held:
                    self._watch(path_id, True)

    def _watch(self, path_id: int, on: bool) -> None:
        """Let the loop watch the path's socket again (``on``) or stop watching it."""
        assert self._loop is not None
        if self.ports is not None:
            port = self.ports[path_id]
            port.resume_reading() if on else port.pause_reading()
        elif on:
            self._loop.add_reader(self.sockets[path_id].fileno(), self._on_readable, path_id)
        else:
            self._loop.remove_reader(self.sockets[path_id].fileno())

    def _drain(self, path_ids: Sequence[int]) -> None:
        """Drain these paths' sockets and hand everything to the session in one pass."""
        now = self.clock()
        grown: set[int] = set()
        self.receive_passes += 1
        drained = [(path_id, self.datapath.receive(path_id)) for path_id in path_ids]
        for path_id, received in drained:
            self._absorb(path_id, received, now, grown)
        self._after_receive(grown)
        for path_id, received in drained:
            if received.quic:
                self._hand_quic(path_id, received.quic)
        if self._holdoff_s > 0.0:
            if any(received.pressed for _, received in drained):
                self.holdoff_yields += 1
                self._holdoff_yields_until = now + HOLDOFF_YIELD_S
            self._update_holding(now)

    @property
    def receive_holding(self) -> bool:
        """Whether a path that wakes now waits out the receive hold-off."""
        return self._holding

    def _update_holding(self, now: float) -> None:
        """Hold only while the hold-off is at most 1/HOLDOFF_RTT_RATIO of every measured path's
        smoothed RTT: a WAN path's acknowledgements then come a few per cent later, while a
        sub-millisecond path (a LAN, loopback) would see its round trip multiplied and gains
        nothing (its wakes find full batches already). Paths not yet measured do not count.

        And not for HOLDOFF_YIELD_S after a drain found a socket pressed: a socket that fills
        while held drops datagrams (under a datagram flood a 1 ms hold-off halved the
        transfer's goodput, tests/test_flood_netns.py), and a wake that finds a full batch
        has nothing left to coalesce."""
        holdoff = self._holdoff_s * HOLDOFF_RTT_RATIO
        self._holding = now >= self._holdoff_yields_until and self.session.shortest_srtt_s() >= holdoff

    def _on_delivered(self, items: list[tuple[int, Received]]) -> None:
        """What the data path's worker threads drained (``Datapath.start``), on the loop."""
        if self._loop is None:
            return  # closed meanwhile
        now = self.clock()
        grown: set[int] = set()
        for path_id, received in items:
            self._absorb(path_id, received, now, grown)
        self._after_receive(grown)
        for path_id, received in items:
            if received.quic:
                self._hand_quic(path_id, received.quic)

    def _absorb(self, path_id: int, received: Received, now: float, grown: set[int]) -> None:
        """Hand what a path received to the session; add to ``grown`` the shards it may have grown."""
        session = self.session
        if received.runs or received.controls:
            self.last_heard[path_id] = now
            if self._heard is not None:
                self._note_heard(path_id)
        if received.runs:
            self.data_records += received.datagrams
            self.data_runs += len(received.runs)
            for pid, first_pn, count, shard_id, offset, length in received.runs:
                session.receive_data_run(pid, first_pn, count, shard_id, offset, length, now)
                grown.add(shard_id)
        if received.controls:
            # DATA on the Python path, a repair symbol, a SHARD_OPEN releasing early data:
            # any open shard may have grown.
            grown.update(self._hashers)
        self.control_records += len(received.controls)
        opened: list[tuple[int, int, list[Frame]]] = []
        for pid, pn, plaintext in received.controls:
            try:
                opened.append((pid, pn, decode_frames(plaintext)))
            except WireError:
                self.malformed_controls += 1
        if opened:
            session.receive_packets(opened, now)  # a path's ACKs of one drain applied as one

    def _after_receive(self, grown: set[int]) -> None:
        """Advance the digests of the shards that received data, then service the session.

        Only those: asking every open shard for its prefix after every drain was
        ~8 calls per wake-up for nothing. A shard whose hashing job was still running
        catches up at its next data or, at the latest, in ``ShardHasher.finish``.
        """
        hashers, session = self._hashers, self.session
        for shard_id in grown:
            hasher = hashers.get(shard_id)
            if hasher is not None:
                hasher.advance(session.received_prefix(shard_id))
        self._service_soon()

    def _service_soon(self) -> None:
        """Service the session once the loop has run every I/O callback that is ready.

        Several paths readable in one loop iteration (and a timer due in it) then
        cost one poll of the session, one set of transmits handed to the data
        path and one timer re-armed, instead of one each: the ACKs of all of them
        are applied before the windows they opened are filled.
        """
        if self._pending_service is None and self._loop is not None:
            self._pending_service = self._loop.call_soon(self._deferred_service)

    def _deferred_service(self) -> None:
        self._pending_service = None
        self._service()

    def _hand_quic(self, path_id: int, quic: list[tuple[bytes, Address]]) -> None:
        """The control channel's datagrams met on a shared port go to its QUIC side."""
        if self.ports is None:
            self.quic_unclaimed += len(quic)
            return
        port = self.ports[path_id]
        for datagram, addr in quic:
            port.quic_received(datagram, addr)

    def _on_timer(self) -> None:
        self._timer = None
        due, self._timer_at = self._timer_at, float("inf")
        now = self.clock()
        if now < due:  # early (a loop's timer granularity): wait for the rest, do nothing yet
            self._arm(due, now)
            return
        if not self.datapath.threaded:
            self._drain_pending()
            if self._loop is None:  # what the drain handed on closed the endpoint
                return
            now = self.clock()
        self.session.on_deadline(now)
        self._service_soon()

    def _drain_pending(self) -> None:
        """Read what already waits in every socket before a deadline judges its absence.

        A loop runs its due timers before it polls for I/O, so after a stall (a
        busy host descheduled the process, or a path waits out the receive
        hold-off) the loss and probe timeouts would fire with acknowledgements
        unread in the sockets: a probe timeout then declares a whole window lost
        and re-sends it though it arrived (measured with two ranks per site on two
        cores). Draining first costs one empty
        ``recvmmsg`` per idle path and timer.
        """
        if self._held_timer is not None:
            self._held_timer.cancel()
        self._release_held(range(len(self.sockets)))

    def _on_retry(self) -> None:
        self._retry = None
        self.datapath.flush()
        self._service()

    def _service(self) -> None:
        """Events out, datagrams out, timer re-armed: after every call into the session."""
        if self._loop is None:
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
            plans = plan_transmits(transmits, self._shard_buffer)
            self.plans_sent += len(plans)
            self.datapath.send(plans)
        if self.datapath.backlogged and self._retry is None:
            self._retry = self._loop.call_later(BACKLOG_RETRY_S, self._on_retry)
        deadline = session.next_deadline()
        self._arm(deadline, now)

    def _shard_buffer(self, shard_id: int) -> memoryview:
        data = self.session.outgoing.shards[shard_id].data
        assert data is not None  # the endpoint only submits real buffers
        return data

    def _on_verified(self, shard_id: int, digest: bytes, check: asyncio.Future[bytes]) -> None:
        ok = not check.cancelled() and check.exception() is None and check.result() == digest
        self.session.shard_verified(shard_id, ok, self.clock())
        self._service()

    def _arm(self, deadline: float | None, now: float) -> None:
        assert self._loop is not None
        if deadline is None or deadline >= self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = deadline
        self._timer = self._loop.call_later(timer_delay_s(deadline - now), self._on_timer)

    def _on_event(self, event: object) -> None:
        if isinstance(event, ShardFilled):
            self.datapath.remove_shard(event.shard_id)  # no writes while the rest is hashed
            check = asyncio.ensure_future(self._hashers.pop(event.shard_id).finish())
            check.add_done_callback(functools.partial(self._on_verified, event.shard_id, event.digest))
        elif isinstance(event, ShardReceived):
            view = self._rx_buffers.pop(event.shard_id)
            assert self._received is not None
            self._received.put_nowait(ReceivedShard(event.shard_id, view, event.meta, event.ok, event.at))
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


def timer_delay_s(remaining_s: float) -> float:
    """The delay to arm a timer with so that it fires at, not before, ``remaining_s`` from now.

    uvloop counts timers in whole milliseconds and rounds: below 0.5 ms a timer
    runs on the next loop iteration, i.e. early. Each early run found nothing
    due and re-armed for the same deadline, so a paced sender spun through
    ~8,000 empty timer runs a second. Rounding up to the millisecond fires at
    most 1 ms late, well inside the pacing horizon that hands packets out ahead.
    """
    if remaining_s <= 0.0:
        return 0.0
    return math.ceil(remaining_s * 1000.0) / 1000.0
