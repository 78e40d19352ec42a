"""The native data path: sealed bursts into the C pacer, batches out of recvmmsg.

With one worker (the default) the event loop's thread drives one send lane and
one receive lane for every path (``native_lanes``): per call, not per
datagram. With ``workers`` > 1 the paths are spread over that many worker
threads (``aio.workers``), each with its own lanes, so sealing, pacing,
receiving, opening and placing overlap on several cores; the loop then only
hands plans out and takes results in (``start``).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from wanxport.aio import native_io, overflow
from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.datapath import Deliver, Received
from wanxport.aio.native_lanes import ReceiveLane, SendLane, may_overtake
from wanxport.aio.plan import DataPlan, Plan
from wanxport.aio.workers import WorkerSet
from wanxport.wire import native
from wanxport.wire.frames import DATA_OVERHEAD
from wanxport.wire.header import HEADER_LEN


class NativeDatapath:
    name = "native"

    def __init__(self, sockets: Sequence[socket.socket], send_key: DirectionKey, recv_key: DirectionKey,
                 remote_conn_id: int, local_conn_id: int, slot_size: int, capacity: int,
                 spin_ns: int, burst_ns: int, destinations: Sequence[Address | None] | None = None,
                 workers: int = 1) -> None:
        n = len(sockets)
        self._sockets = list(sockets)
        # A path's socket shared with the control channel (aio.port) is unconnected:
        # sends name the peer.
        dest = list(destinations or [None] * n)
        self._seal = native.Protector(send_key.cipher, send_key.key, send_key.iv)
        self.gro = [False] * n
        for i, sock in enumerate(sockets):
            overflow.enable(sock)
            native_io.enable_timestamps(sock)
            self.gro[i] = native_io.enable_gro(sock)
        self.workers = max(1, min(workers, n))
        self._set: WorkerSet | None = None
        if self.workers > 1:
            self._set = WorkerSet(self.workers, self._sockets, dest, send_key, recv_key, remote_conn_id,
                                  local_conn_id, any(self.gro), slot_size, capacity, spin_ns, burst_ns)
            self._send_lanes = [w.send_lane for w in self._set.workers]
            self._recv_lanes = [w.recv_lane for w in self._set.workers]
        else:
            recv = native.Protector(recv_key.cipher, recv_key.key, recv_key.iv)
            self._send_lanes = [SendLane(self._sockets, dest, remote_conn_id, slot_size, capacity,
                                         spin_ns, burst_ns)]
            self._recv_lanes = [ReceiveLane(local_conn_id, n, recv, any(self.gro), slot_size)]
        self.pacer = self._send_lanes[0].pacer  # (its name: every lane's pacer is the same kind)
        self._rates = [0.0] * n
        self._per_datagram = HEADER_LEN + DATA_OVERHEAD + self._seal.tag_len
        self.key_phase = 0
        self.packets_under_key = 0  # sealed under the current sending key: the rotation trigger
        self.bytes_under_key = 0
        self._closed = False

    @property
    def threaded(self) -> bool:
        """True when worker threads drain the sockets: the loop must not read them (``start``)."""
        return self._set is not None

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        """Start the worker threads; each drain's ``Received`` reaches ``deliver`` on the loop."""
        if self._set is not None:
            self._set.start(loop, deliver)

    # -- keys ----------------------------------------------------------------

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        """Seal from now on with ``key`` and ``phase`` in the header's key-phase bit.

        Datagrams already sealed and waiting in the pacer ring (or handed to a
        worker) keep their old phase, which the peer still holds, so a switch
        strands nothing in flight.
        """
        self._seal = native.Protector(key.cipher, key.key, key.iv)
        if self._set is not None:
            self._set.use_send_key(key)
        self.key_phase = phase & 1
        self.packets_under_key = self.bytes_under_key = 0

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        """Open datagrams whose key-phase bit is ``phase`` with ``key``."""
        if self._set is not None:
            self._set.install_recv_key(phase & 1, key)
        else:
            self._recv_lanes[0].receiver.set_key(phase & 1, native.Protector(key.cipher, key.key, key.iv))

    def attach(self, path_id: int) -> None:
        """Start sending on a path (to its socket's peer, or to its destination)."""
        worker = 0 if self._set is None else self._set.worker_of[path_id]
        self._send_lanes[worker].attach(path_id)

    # -- send ----------------------------------------------------------------

    def set_rate(self, path_id: int, rate_bytes_per_s: float) -> None:
        old = self._rates[path_id]
        if abs(rate_bytes_per_s - old) > 0.01 * old:
            self._rates[path_id] = rate_bytes_per_s
            worker = 0 if self._set is None else self._set.worker_of[path_id]
            self._send_lanes[worker].pacer.set_rate(path_id, rate_bytes_per_s)

    def send(self, plans: list[Plan]) -> None:
        items = []
        for plan in plans:
            if isinstance(plan, DataPlan):
                count = -(-plan.length // plan.segment)
                self.packets_under_key += count
                self.bytes_under_key += plan.length + count * self._per_datagram
            else:
                self.packets_under_key += 1
            # The core schedules an ACK behind data it handed out earlier; only when
            # that data has left may the ACK skip the ring (decided now, not in a worker).
            items.append((plan, may_overtake(plan)))
        if self._set is not None:
            self._set.send(items, self.key_phase)
        else:
            self._send_lanes[0].send(items, self._seal, self.key_phase)

    @property
    def backlogged(self) -> bool:
        """Inline: the ring held something back (``flush`` retries). With workers each
        retries its own; this says whether any still holds plans it has not queued."""
        if self._set is not None:
            return any(w.queued or w.send_lane.backlogged for w in self._set.workers)
        return self._send_lanes[0].backlogged

    def flush(self) -> None:
        """Retry what backpressure held back, in order (workers retry their own)."""
        if self._set is None:
            self._send_lanes[0].flush()

    @property
    def local_send_errors(self) -> int:
        return sum(lane.local_send_errors for lane in self._send_lanes)

    @property
    def datagrams_sent(self) -> int:
        """Datagrams handed to the kernel: the pacers' releases and the ACKs sent past them."""
        return sum(lane.sent_directly + sum(path.sent_datagrams for path in lane.pacer.stats())
                   for lane in self._send_lanes)

    @property
    def datagrams_refused(self) -> int:
        return sum(lane.local_send_errors + sum(path.send_errors for path in lane.pacer.stats())
                   for lane in self._send_lanes)

    # -- receive -------------------------------------------------------------

    def _receivers(self) -> list[tuple[object, native.Receiver]]:
        if self._set is not None:
            return list(self._set.each_receiver())
        return [(None, self._recv_lanes[0].receiver)]

    def add_shard(self, shard_id: int, buffer: memoryview) -> None:
        for lock, receiver in self._receivers():
            with _held(lock):
                receiver.add_shard(shard_id, buffer)

    def remove_shard(self, shard_id: int) -> None:
        for lock, receiver in self._receivers():
            with _held(lock):
                receiver.remove_shard(shard_id)

    def freeze(self, shard_id: int, upto: int) -> None:
        """Bytes below ``upto`` are all in: never write them again (see aio.verify)."""
        for lock, receiver in self._receivers():
            with _held(lock):
                receiver.freeze(shard_id, upto)

    def receive(self, path_id: int) -> Received:
        """Drain the path's socket (inline only: with workers their threads drain)."""
        if self._set is not None:
            raise RuntimeError("the worker threads drain the sockets; use start(loop, deliver)")
        return self._recv_lanes[0].receive(self._sockets[path_id])

    @property
    def shares(self) -> list[dict[str, int]]:
        """Per worker: plans it sealed, DATA datagrams it placed (each worker's traffic)."""
        return [{"plans_sent": s.plans, "datagrams_placed": r.datagrams}
                for s, r in zip(self._send_lanes, self._recv_lanes, strict=True)]

    @property
    def rejected(self) -> int:
        return sum(v for k, v in self.counters.items() if k.startswith("rejected_"))

    @property
    def counters(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for lane in self._recv_lanes:
            for key, value in lane.counters.items():
                total[key] = total.get(key, 0) + value
        return total

    def make_rings_resident(self) -> None:
        """Every pacer ring faulted in now (Pacer.make_resident)."""
        for lane in self._send_lanes:
            lane.pacer.make_resident()

    def pacer_thread_stats(self) -> native_io.PacerThreadStats:
        """Every release thread's cost together (one per worker)."""
        parts = [lane.pacer.thread_stats() for lane in self._send_lanes]
        return native_io.PacerThreadStats(sum(p.cpu_s for p in parts), sum(p.sleeps for p in parts),
                                          sum(p.send_rounds for p in parts))

    def close(self, drain_s: float = 0.2) -> None:
        """Let queued datagrams leave (bounded wait), then stop the pacer (and worker) threads."""
        if self._closed:
            return
        self._closed = True
        if self._set is not None:
            self._set.close(drain_s)
        else:
            self._send_lanes[0].close(drain_s)


class _held:
    """``with`` a lock, or with nothing (the inline lane needs none)."""

    __slots__ = ("_lock",)

    def __init__(self, lock: object) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        if self._lock is not None:
            self._lock.acquire()  # type: ignore[attr-defined]

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()  # type: ignore[attr-defined]
