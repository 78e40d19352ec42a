"""One site's persistent session with one peer site, used both ways.

A wanxport gateway session is set up by one side (the initiator) but its data plane
and control channel carry shards in both directions, so a pair of sites needs exactly
one session: path state (RTT, bandwidth, window) is shared by the two directions and
carries from one collective to the next. The link sends collective messages as
shards (header + body) and runs a reader that confirms each arriving shard to the
sender and hands it to the world, which routes it to its group by the header's
group id: every group of the same sites shares this one session.

Liveness is the link's own, apart from any call's timeout: each path's endpoint
notes when it last brought a datagram of the session (data, acknowledgements,
probes). While nothing arrives for a third of the bound the link sends a
heartbeat (a header-only shard, which the peer's data plane acknowledges); when
nothing arrives on any path for ``liveness_bound_s`` — max(``LIVENESS_MIN_S``,
``LIVENESS_RTTS`` x the largest smoothed RTT of its paths) — the peer is dead or
cut off and the link fails naming it and the path it was last heard on. Time this
site's own loop was too busy to read its sockets does not count as the peer's silence.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from wanxport.control import ShardAnnounce
from wanxport.core.stats import PathStats
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession, SessionFailed, counted_digest_hex
from wanxport.gateway.shards import UNHASHED

from .errors import CollectiveError
from .message import HEADER_BYTES, Call, Header, new_payload, pack, unpack
from .pool import ReceivePool, slot_of

log = logging.getLogger(__name__)

LIVENESS_MIN_S = 3.0  # a peer silent on every path this long (at least) is dead or cut off
LIVENESS_RTTS = 4  # ... or this many of its paths' largest smoothed RTT, when that is longer
METER_MIN_S = 0.05  # a link's throughput meter counts once it has been busy this long ...
METER_MIN_BYTES = 1 << 20  # ... with this much verified
BULK_BYTES = 1 << 16  # messages at least this large count toward the link's throughput meter
# Messages up to this size are hashed on the loop: BLAKE3 takes ~0.1 ms for 256 KiB, less than
# the hop to a worker thread and back (0.2 ms measured on loopback), which a 64 KiB pipeline
# activation (64 KiB + the header) paid on its way out.
DIGEST_INLINE_BYTES = 256 << 10
PING = Header(Call(0, "ping", 0, ""), 0, 0, 0)

Deliver = Callable[["SiteLink", Header, npt.NDArray[np.uint8]], bool]  # False: dropped
Failed = Callable[["SiteLink", CollectiveError], None]


class SiteLink:
    """The session with site ``index`` (named ``name``); ``listener`` is kept open when we
    accepted the session, because the session's data endpoint shares its ports."""

    def __init__(self, index: int, name: str, session: GatewaySession, deliver: Deliver, failed: Failed,
                 listener: GatewayListener | None = None, pool: ReceivePool | None = None,
                 liveness_min_s: float = LIVENESS_MIN_S) -> None:
        self.index = index
        self.pool = pool if pool is not None else ReceivePool()  # its allocate() is the session's
        self.name = name
        self.who = f"site {name} (rank {index})"
        self.session = session
        self.listener = listener
        self.bytes_sent = 0
        self.bytes_received = 0
        self.failure: CollectiveError | None = None
        self._deliver = deliver
        self._failed = failed
        self._next_shard = 0
        self._sends: set[asyncio.Task[None]] = set()
        self._closing = False
        self.liveness_min_s = liveness_min_s
        self.heartbeats = 0
        self._bulk_in_flight = 0  # the throughput meter: bulk messages not verified yet ...
        self._busy_from = 0.0  # ... since when some were in flight ...
        self._busy_s = 0.0  # ... how long some have been, in all ...
        self._bulk_bytes = 0  # ... and the bytes of those verified
        self._born = session.endpoint.clock()
        self._reader = asyncio.create_task(self._read())
        self._watcher = asyncio.create_task(self._watch())

    def send(self, header: Header, payload: npt.NDArray[np.uint8]) -> asyncio.Task[None]:
        """Queue one message (``payload`` from ``message.new_payload``; its header is written
        here); a failure to deliver it fails the link (and so the group's waiters). The
        task ends when the data plane no longer reads ``payload``."""
        payload[:HEADER_BYTES] = np.frombuffer(pack(header), dtype=np.uint8)
        shard_id = self._next_shard
        self._next_shard += 1
        task = asyncio.create_task(self._send(shard_id, payload, header.call.seq))
        self._sends.add(task)
        task.add_done_callback(self._sends.discard)
        return task

    async def _send(self, shard_id: int, payload: npt.NDArray[np.uint8], seq: int) -> None:
        bulk = payload.nbytes >= BULK_BYTES
        if bulk:
            if not self._bulk_in_flight:
                self._busy_from = time.monotonic()
            self._bulk_in_flight += 1
        try:
            await self._deliver_one(shard_id, payload, seq)
        finally:
            if bulk:
                self._bulk_in_flight -= 1
                if not self._bulk_in_flight:
                    self._busy_s += time.monotonic() - self._busy_from

    def busy_meter(self) -> tuple[int, float]:
        """(bytes, seconds): the bulk messages' bytes the peer verified, and how long some bulk
        message was in flight, since the link began. Over an interval, their quotient is what
        the session carried while it had bulk data: a floor of its capacity that, unlike a
        delivery-rate sample, does not sink while the pair idles."""
        busy = self._busy_s + (time.monotonic() - self._busy_from if self._bulk_in_flight else 0.0)
        return self._bulk_bytes, busy

    def carried_bps(self) -> float:
        """Bytes per second the link can carry to the peer, as far as it has seen: the larger
        of what it carried while it had bulk data (0 until its meter counts: ``METER_MIN_S``
        busy, ``METER_MIN_BYTES`` verified) and its paths' delivery-rate estimates, failed
        paths included (what a path delivered before it failed). Small messages are
        latency-bound, so what a fast link carried understates it more than a slow one's."""
        sent, busy = self.busy_meter()
        carried = sent / busy if busy >= METER_MIN_S and sent >= METER_MIN_BYTES else 0.0
        try:
            estimated = sum(path.bandwidth_bps for path in self.path_stats()) / 8
        except Exception:  # noqa: BLE001 - a session torn down meanwhile: what was carried stands
            estimated = 0.0
        return max(carried, estimated)

    async def _deliver_one(self, shard_id: int, payload: npt.NDArray[np.uint8], seq: int) -> None:
        try:
            try:
                # A small message is hashed here, on the loop: no thread hop before its first
                # datagram. A large one is hashed by the session in a worker thread while its
                # first datagrams leave (protocol 5).
                large = payload.nbytes > DIGEST_INLINE_BYTES
                digest = UNHASHED if large else counted_digest_hex(payload)
                announce = ShardAnnounce(shard_id, payload.nbytes, digest, seq)
                # On the data plane alone (protocol 5): a message's receiver has nothing to
                # do once it is verified, so the control channel need carry nothing per message.
                ok = await self.session.send_shard(shard_id, payload.data, announce, data_plane_only=True)
            finally:
                # Its verdict is read (or moot): a group sends a shard per message for months,
                # so the session must not keep one verdict per message.
                self.session.forget((shard_id,))
        except SessionFailed as exc:
            self._fail(f"{self.who}: session lost while sending ({exc}); {self.describe_silence()}")
            return
        except Exception as exc:  # noqa: BLE001 - any send failure ends the link the same way
            self._fail(f"{self.who}: send failed ({type(exc).__name__}: {exc})")
            return
        if not ok:
            self._fail(f"{self.who}: did not verify collective message {seq}")
            return
        self.bytes_sent += payload.nbytes
        if payload.nbytes >= BULK_BYTES:
            self._bulk_bytes += payload.nbytes

    async def _read(self) -> None:
        try:
            while True:
                got = await self.session.receive()
                if not got.ok:
                    await self.session.complete(got.shard_id, "integrity-failure")
                    raise CollectiveError(f"{self.who}: a collective message failed its check",
                                          self.name)
                # The message goes to its group before the verdict goes back: a receive waiting
                # for it need not wait for the control channel to take the verdict as well.
                try:
                    data = np.frombuffer(got.data, dtype=np.uint8)
                    self.bytes_received += data.nbytes
                    header = unpack(got.data, self.name)
                    slot = slot_of(header.call)
                    self.pool.hold(got.shard_id, slot)
                    if header.call.op == "ping" or not self._deliver(self, header, data[HEADER_BYTES:]):
                        self.pool.release(slot)
                finally:
                    await self.session.complete(got.shard_id, "verified")
        except asyncio.CancelledError:
            raise
        except CollectiveError as exc:
            self._fail(str(exc))
        except SessionFailed as exc:
            if not self._closing:
                self._fail(f"{self.who}: session ended ({exc}); "
                           f"{self.describe_silence()}")
        except Exception as exc:  # noqa: BLE001 - whatever ends the reader ends the link
            self._fail(f"{self.who}: {type(exc).__name__}: {exc}")

    def _fail(self, message: str) -> None:
        if self.failure is None and not self._closing:
            self.failure = CollectiveError(message, self.name, self.index, self.last_heard()[0])
            self._watcher.cancel()
            log.warning("%s", message)
            self._failed(self, self.failure)

    def liveness_bound_s(self) -> float:
        """How long the peer may be silent on every path before it counts as dead or cut off."""
        rtts = [p.srtt_s for p in self.path_stats() if p.srtt_s is not None]
        return max(self.liveness_min_s, LIVENESS_RTTS * max(rtts, default=0.0))

    def last_heard(self) -> tuple[str, float]:
        """The path the peer was last heard on (its name) and the endpoint clock then."""
        heard = self.session.endpoint.last_heard
        best = max(range(len(heard)), key=heard.__getitem__)
        names = [p.name for p in self.path_stats()]
        return (names[best] if best < len(names) else str(best)), max(heard[best], self._born)

    def describe_silence(self) -> str:
        """Where and when the peer was last heard from, for an error that names it."""
        path, at = self.last_heard()
        ago = self.session.endpoint.clock() - at
        return f"last heard on path {path} {ago:.1f} s ago"

    async def _watch(self) -> None:
        """Heartbeats while quiet; the link fails once the peer is silent past the bound.

        Silence counts only time this site's loop could have heard the peer: when the
        watcher itself wakes late (the loop was busy: datagrams may sit unread in the
        sockets), the count starts again from its wake."""
        ping: asyncio.Task[None] | None = None
        clock = self.session.endpoint.clock
        listening_since = clock()
        heard_at, sent_then = float("-inf"), (0, 0, 0)  # by the first look after the peer was heard
        while True:
            bound = self.liveness_bound_s()
            due = clock() + bound / 6
            await asyncio.sleep(bound / 6)
            now = clock()
            if now - due > bound / 6:
                listening_since = now
            _, at = self.last_heard()
            if at != heard_at:
                heard_at, sent_then = at, self.sent()
            silent = now - max(at, listening_since)
            if silent >= bound:
                packets, sent, refused = (n - then for n, then in zip(self.sent(), sent_then, strict=True))
                self._fail(f"{self.who}: dead or cut off: nothing heard on any path for {silent:.1f} s "
                           f"(liveness bound {bound:.1f} s); {self.describe_silence()}; since then this "
                           f"site queued it {packets} packets, its sockets sent {sent} datagrams and "
                           f"had {refused} refused")
                return
            if silent >= bound / 3 and (ping is None or ping.done()):
                self.heartbeats += 1
                ping = self.send(PING, new_payload(0))

    def path_stats(self) -> tuple[PathStats, ...]:
        """This session's paths now (payload bytes sent by us on each, RTT, state)."""
        return self.session.stats().paths

    def sent(self) -> tuple[int, int, int]:
        """Packets the core has queued on the session's paths, datagrams that left the sockets
        and datagrams the kernel refused: whether a silence was the peer's alone (the packets
        and datagrams went on), this side's sender stalled (packets, no datagrams), its host
        drops what it sends (refusals: a local firewall) or its core stalled (nothing)."""
        datapath = self.session.endpoint.datapath
        return (sum(p.packets_sent for p in self.path_stats()), datapath.datagrams_sent,
                datapath.datagrams_refused)

    def receiving_bytes(self) -> int:
        """Bytes placed so far in messages from the peer still arriving (not yet whole)."""
        return self.session.receiving_bytes()

    def transport_bytes(self) -> int:
        """Shard bytes the session has sent (acknowledged) plus received, heartbeats included:
        the session's own count of what crossed between the two sites."""
        return self.session.totals.bytes_sent + self.session.totals.bytes_received

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for our messages still in flight to be verified by the peer."""
        if self._sends:
            await asyncio.wait(set(self._sends), timeout=timeout_s)

    async def close(self) -> None:
        self._closing = True
        self._reader.cancel()
        self._watcher.cancel()
        for task in list(self._sends):
            task.cancel()
        await asyncio.gather(self._reader, self._watcher, *self._sends, return_exceptions=True)
        try:
            # A peer this link found dead or cut off gets no goodbye: the wait for its answer
            # (up to 2 s) would hold up the survivors' next epoch.
            await self.session.close(goodbye=self.failure is None)
        finally:
            if self.listener is not None:
                self.listener.close()

