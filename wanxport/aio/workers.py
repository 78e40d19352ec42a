"""Data-path workers: a session's paths spread over threads, so more cores move more.

Why threads and not processes: every per-datagram step of the native data
path (sealing a burst, the pacer's sendmmsg/GSO, recvmmsg, opening and placing
a batch) runs in C without the GIL, and the Python left per plan or per batch
is small. So N threads, each owning ``path_id % N == index`` of the paths with
its own sealing key context, pacer (release thread), receiver (replay windows
for its paths only: ``Receiver.own_paths``) and receive buffer, overlap on N
cores, while the core (``Session``) stays on the event loop's thread where all
its decisions are made. That Python is the serial fraction: on two cores the
hand-offs cost more than the extra threads free, so one worker is the default.

The loop hands a worker ``(plan, overtake)`` pairs through a queue, sealed
under the key current when the core handed them out; the worker seals and
queues them in order, so per path nothing is reordered. Its receive thread
polls its sockets, drains them through its lane and hands each ``Received``
back to the loop (``deliver``), coalescing wake-ups.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import select
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence

from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.datapath import Deliver, Received
from wanxport.aio.native_lanes import ReceiveLane, SendLane
from wanxport.aio.plan import Plan
from wanxport.aio.threadcpu import thread_role
from wanxport.wire import native

log = logging.getLogger(__name__)

BACKLOG_RETRY_S = 0.0005  # a worker retries what its pacer ring could not take (aio.endpoint's too)
POLL_MS = 200  # a receive thread re-checks for close this often when nothing arrives
MAX_UNDELIVERED = 256  # receive results a worker queues before it waits for the loop
_STOP = None


def owned_paths(index: int, workers: int, n_paths: int) -> list[int]:
    """The paths worker ``index`` of ``workers`` owns: every ``workers``-th from ``index``."""
    return list(range(index, n_paths, workers))


class PathWorker:
    """One worker: its paths' send lane and receive lane, each driven by its own thread."""

    def __init__(self, index: int, paths: list[int], sockets: Sequence[socket.socket],
                 send_lane: SendLane, recv_lane: ReceiveLane) -> None:
        self.index = index
        self.paths = paths
        self._sockets = sockets
        self.send_lane = send_lane
        self.recv_lane = recv_lane
        self.rx_lock = threading.Lock()  # the receiver is used by this thread and the loop's calls
        self._jobs: queue.SimpleQueue[tuple[list[tuple[Plan, bool]], native.Protector, int] | None] = (
            queue.SimpleQueue())
        self._undelivered: deque[tuple[int, Received]] = deque()
        self._delivery_scheduled = False
        self._room = threading.Event()
        self._room.set()
        self._stopping = False
        self._stop_r, self._stop_w = os.pipe()
        self._threads: list[threading.Thread] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deliver: Deliver | None = None
        self.error: BaseException | None = None

    # -- threads -------------------------------------------------------------

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        self._loop, self._deliver = loop, deliver
        for target, role, cpu_role in ((self._send_loop, "send", "release"),
                                       (self._recv_loop, "recv", "receive")):
            thread = threading.Thread(target=self._guard(target, cpu_role),
                                      name=f"wanxport-w{self.index}-{role}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def _guard(self, target: Callable[[], None], cpu_role: str) -> Callable[[], None]:
        def run() -> None:
            try:
                with thread_role(cpu_role):  # what its CPU counts as (aio.threadcpu)
                    target()
            except BaseException as exc:  # a worker must not die silently: logged, kept for close()
                self.error = exc
                log.exception("data-path worker %d failed", self.index)
        return run

    def submit(self, plans: list[tuple[Plan, bool]], seal: native.Protector, key_phase: int) -> None:
        self._jobs.put((plans, seal, key_phase))

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def _send_loop(self) -> None:
        lane = self.send_lane
        while True:
            try:
                job = self._jobs.get(timeout=BACKLOG_RETRY_S if lane.backlogged else None)
            except queue.Empty:
                lane.flush()
                continue
            if job is _STOP:
                return
            plans, seal, key_phase = job
            lane.flush()
            lane.send(plans, seal, key_phase)

    def _recv_loop(self) -> None:
        poller = select.poll()
        by_fd = {}
        for path_id in self.paths:
            sock = self._sockets[path_id]
            poller.register(sock.fileno(), select.POLLIN)
            by_fd[sock.fileno()] = path_id
        poller.register(self._stop_r, select.POLLIN)
        while True:
            for fd, _ in poller.poll(POLL_MS):
                if fd == self._stop_r:
                    return
                path_id = by_fd[fd]
                with self.rx_lock:
                    received = self.recv_lane.receive(self._sockets[path_id])
                if received.runs or received.controls or received.quic:
                    self._hand_over(path_id, received)

    def _hand_over(self, path_id: int, received: Received) -> None:
        """Queue a result for the loop; one wake-up per drain of the queue, not per result."""
        while len(self._undelivered) >= MAX_UNDELIVERED and not self._stopping:
            self._room.clear()
            if len(self._undelivered) >= MAX_UNDELIVERED:
                self._room.wait(POLL_MS / 1000)
        if self._stopping:
            return  # close() joins this thread from the loop, which will not drain any more
        self._undelivered.append((path_id, received))
        if not self._delivery_scheduled:
            self._delivery_scheduled = True
            assert self._loop is not None
            try:
                self._loop.call_soon_threadsafe(self._drain)
            except RuntimeError:  # the loop is closed: nobody to deliver to any more
                self._undelivered.clear()

    def _drain(self) -> None:
        """On the loop: hand every queued result to the endpoint, in arrival order."""
        self._delivery_scheduled = False  # before popping: a result queued from now on re-schedules
        items = []
        while self._undelivered:
            items.append(self._undelivered.popleft())
        self._room.set()
        if items and self._deliver is not None:
            self._deliver(items)

    def close(self, drain_s: float) -> None:
        """Stop both threads (the send thread first seals what was queued), then the pacer."""
        self._stopping = True
        self._jobs.put(_STOP)
        os.write(self._stop_w, b"x")
        self._room.set()
        for thread in self._threads:
            thread.join()
        self._threads.clear()
        self.send_lane.close(drain_s)
        os.close(self._stop_r)
        os.close(self._stop_w)


class WorkerSet:
    """The workers of one native data path, and the loop-side calls that fan out to them."""

    def __init__(self, workers: int, sockets: Sequence[socket.socket], destinations: Sequence[Address | None],
                 send_key: DirectionKey, recv_key: DirectionKey, remote_conn_id: int, local_conn_id: int,
                 gro: bool, slot_size: int, capacity: int, spin_ns: int, burst_ns: int) -> None:
        n = len(sockets)
        self.workers: list[PathWorker] = []
        self.worker_of = [0] * n
        for index in range(workers):
            paths = owned_paths(index, workers, n)
            for path_id in paths:
                self.worker_of[path_id] = index
            send = SendLane(sockets, destinations, remote_conn_id, slot_size, capacity, spin_ns, burst_ns)
            recv = ReceiveLane(local_conn_id, n, _protector(recv_key), gro, slot_size, owned=paths)
            self.workers.append(PathWorker(index, paths, sockets, send, recv))
        self.seals = [_protector(send_key) for _ in self.workers]

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        for worker in self.workers:
            worker.start(loop, deliver)

    def use_send_key(self, key: DirectionKey) -> None:
        """Jobs already queued keep the context they were handed with (the old phase)."""
        self.seals = [_protector(key) for _ in self.workers]

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        for worker in self.workers:
            with worker.rx_lock:
                worker.recv_lane.receiver.set_key(phase, _protector(key))

    def send(self, plans: list[tuple[Plan, bool]], key_phase: int) -> None:
        """Split by owner, keeping each path's order, one queue put per worker."""
        split: list[list[tuple[Plan, bool]]] = [[] for _ in self.workers]
        for item in plans:
            split[self.worker_of[item[0].path_id]].append(item)
        for index, items in enumerate(split):
            if items:
                self.workers[index].submit(items, self.seals[index], key_phase)

    def each_receiver(self) -> list[tuple[threading.Lock, native.Receiver]]:
        return [(w.rx_lock, w.recv_lane.receiver) for w in self.workers]

    def close(self, drain_s: float) -> None:
        errors = []
        for worker in self.workers:
            worker.close(drain_s)
            if worker.error is not None:
                errors.append(worker.error)
        if errors:
            raise RuntimeError(f"{len(errors)} data-path worker(s) failed") from errors[0]


def _protector(key: DirectionKey) -> native.Protector:
    """A key context of its own: a Protector serialises seals/opens on its mutex."""
    return native.Protector(key.cipher, key.key, key.iv)
