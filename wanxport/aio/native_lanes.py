"""The two halves of the native data path for a set of paths: a send lane and a receive lane.

Why apart from ``native_path``: the same halves run inline on the event loop's
thread (one lane pair for every path, ``NativeDatapath`` with one worker) or
each inside a worker thread that owns some of the paths (``aio.workers``), so
that more cores seal, pace, receive, open and place. A lane is never used by
two threads at once; the caller (the loop, or the worker owning it) serialises.

Per call, not per datagram: one ``Pacer.enqueue_data`` per data plan (it
queues the plan unsealed, in C without the GIL; the pacer's release thread
seals each datagram just before it sends it), one ``Receiver.drain`` per
drain of a socket, which reads it in batches of up to 64 messages (more
datagrams with GRO) and opens, replay-checks and places DATA straight into the
registered shard buffers (without the GIL), handing back runs, not datagrams.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Sequence

from wanxport.aio import native_io, overflow
from wanxport.aio.config import Address
from wanxport.aio.datapath import Received
from wanxport.aio.plan import ControlPlan, DataPlan, Plan
from wanxport.wire import native
from wanxport.wire.frames import AckFrame, PaddingFrame, encode_frames
from wanxport.wire.header import encode_header

log = logging.getLogger(__name__)

RECV_SLOTS = 64
GRO_SLOT_BYTES = 65536
MAX_BATCHES_PER_WAKE = 16
RELEASE_BATCH_PER_PATH = 64  # datagrams a path may release per pacer round
MAX_RELEASE_BATCH = 1024  # the pacer's own bound on one round (its sendmmsg vectors)


class _Pending:
    """What the pacer ring had no room for yet (backpressure): the unsealed rest of a data
    plan (sealed when it fits, under the key it was handed out with), or a sealed control
    datagram."""

    __slots__ = ("plan", "seal", "key_phase", "datagram", "not_before_ns")

    def __init__(self, plan: DataPlan | None, seal: native.Protector | None, key_phase: int,
                 datagram: bytes | None, not_before_ns: int) -> None:
        self.plan = plan
        self.seal = seal
        self.key_phase = key_phase
        self.datagram = datagram
        self.not_before_ns = not_before_ns


def not_eliciting(plan: ControlPlan) -> bool:
    """Only ACK and PADDING frames: the peer records nothing that could be reordered."""
    return all(isinstance(frame, AckFrame | PaddingFrame) for frame in plan.frames)


def may_overtake(plan: Plan) -> bool:
    """A control plan that may skip the pacer ring (decided when the core hands it out):
    only ACK/PADDING, and only when the data scheduled before it is due already."""
    return isinstance(plan, ControlPlan) and not_eliciting(plan) and plan.not_before <= time.monotonic()


class SendLane:
    """Seals plans of its paths and queues them in its own pacer (one release thread)."""

    def __init__(self, sockets: Sequence[socket.socket], destinations: Sequence[Address | None],
                 remote_conn_id: int, slot_size: int, capacity: int, spin_ns: int, burst_ns: int) -> None:
        n = len(sockets)
        self._sockets = list(sockets)
        self._dest = list(destinations)
        self._conn = remote_conn_id
        # A release round's datagram budget is shared by all paths: at 64 in all, four
        # paths due together split it and each leaves in GSO sends a third the size of
        # a full 64 KB one (the kernel's cost is per send). A budget per path lets each
        # due path send a full core packet's datagrams in the same round.
        self.pacer = native_io.Pacer(n, capacity=capacity, slot_size=slot_size,
                                     max_batch=min(MAX_RELEASE_BATCH, RELEASE_BATCH_PER_PATH * n),
                                     spin_ns=spin_ns, burst_ns=burst_ns)
        self._pending: list[deque[_Pending]] = [deque() for _ in range(n)]
        self.local_send_errors = 0
        self.sent_directly = 0  # control datagrams sent from this thread, past the pacer's ring
        self.plans = 0  # plans this lane sealed: a worker's share of the traffic

    def attach(self, path_id: int) -> None:
        self.pacer.set_path(path_id, self._sockets[path_id], self._dest[path_id])

    def send(self, plans: Sequence[tuple[Plan, bool]], seal: native.Protector, key_phase: int) -> None:
        """Seal and queue ``(plan, overtake)`` pairs, in order, with ``seal`` under ``key_phase``.

        A data plan is queued unsealed (``Pacer.enqueue_data``): the pacer's release
        thread seals each datagram into a small scratch just before its send, so this
        thread (the event loop's) spends nothing per datagram.
        """
        for plan, overtake in plans:
            self.plans += 1
            nb = int(plan.not_before * 1e9)
            if isinstance(plan, DataPlan):
                self._enqueue(plan.path_id, _Pending(plan, seal, key_phase, None, nb))
            else:
                assert isinstance(plan, ControlPlan)
                header = encode_header(plan.path_id, self._conn, plan.pn, key_phase)
                self._send_control(plan.path_id, seal.seal(header, encode_frames(plan.frames)), nb,
                                   overtake)

    def _send_control(self, path_id: int, datagram: bytes, not_before_ns: int, overtake: bool) -> None:
        """Acknowledgements leave at once when no data is due before them; anything else queues.

        A trip through the pacer thread would add its wake-up latency to every
        ACK. But an ACK must not overtake data handed out before it (the peer
        would see reordering and answer every packet with an ACK), and an
        ack-eliciting control packet (SHARD_OPEN, PROBE, SHARD_DONE, CREDIT) must
        not overtake the data queued before it: its packet number is higher, so once the peer acknowledged it
        the core would declare the still-queued data lost (packet threshold) and
        send it again. The ring is also the fallback when the socket buffer is full.
        A local firewall drop (EPERM) or an unreachable route is a lost datagram,
        as on the wire: counted, and the core repairs it.
        """
        if overtake and not self._pending[path_id]:
            try:
                dest = self._dest[path_id]
                if dest is None:
                    self._sockets[path_id].send(datagram)
                else:
                    self._sockets[path_id].sendto(datagram, dest)
                self.sent_directly += 1
                return
            except (BlockingIOError, InterruptedError):
                pass
            except ConnectionRefusedError:
                return  # the peer's socket is gone (ICMP): UDP semantics, the core repairs
            except OSError as exc:
                self.local_send_errors += 1
                log.debug("path %d: control datagram not sent (%s)", path_id, exc.strerror or exc)
                return
        self._enqueue(path_id, _Pending(None, None, 0, datagram, not_before_ns))

    def _enqueue(self, path_id: int, item: _Pending) -> None:
        queue = self._pending[path_id]
        if queue or not self._push(path_id, item):
            queue.append(item)

    def _push(self, path_id: int, item: _Pending) -> bool:
        """Enqueue as much as fits; True when all of it did."""
        plan = item.plan
        if plan is None:
            assert item.datagram is not None
            return self.pacer.enqueue(path_id, item.datagram, lengths=[len(item.datagram)],
                                      not_before_ns=item.not_before_ns) == 1
        assert item.seal is not None
        accepted = self.pacer.enqueue_data(path_id, item.seal, self._conn, plan.first_pn, item.key_phase,
                                           plan.shard_id, plan.buffer, plan.offset, plan.length,
                                           plan.segment, item.not_before_ns)
        if accepted * plan.segment >= plan.length:
            return True
        done = accepted * plan.segment  # the rest waits: same plan, from the first datagram not queued
        item.plan = DataPlan(plan.path_id, plan.first_pn + accepted, plan.shard_id, plan.buffer,
                             plan.offset + done, plan.length - done, plan.segment, plan.not_before)
        return False

    @property
    def backlogged(self) -> bool:
        return any(self._pending)

    def flush(self) -> None:
        """Retry what backpressure held back, in order."""
        for path_id, queue in enumerate(self._pending):
            while queue and self._push(path_id, queue[0]):
                queue.popleft()

    def close(self, drain_s: float) -> None:
        """Let queued datagrams leave (bounded wait), then stop the pacer thread."""
        if not self.pacer.closed:
            deadline = time.monotonic() + drain_s
            self.flush()
            self.pacer.wait_idle(max(0.0, deadline - time.monotonic()))
            self.pacer.close()


class ReceiveLane:
    """Drains its paths' sockets in batches; its receiver opens and places (GIL released)."""

    def __init__(self, local_conn_id: int, n_paths: int, recv_key: native.Protector, gro: bool,
                 slot_size: int, owned: Sequence[int] | None = None) -> None:
        self.receiver = native.Receiver(local_conn_id, n_paths)
        self.receiver.set_key(0, recv_key)
        if owned is not None:
            self.receiver.own_paths(owned)
        slot = GRO_SLOT_BYTES if gro else slot_size
        self._rx_buffer = bytearray(RECV_SLOTS * slot)
        # Drops outside the receiver's parsers: the kernel's, for a full socket
        # buffer (aio.overflow), and messages larger than a receive slot.
        self.kernel_overflow = 0
        self.oversize = 0
        self.datagrams = 0  # placed DATA datagrams: a worker's share of the traffic

    def receive(self, sock: socket.socket) -> Received:
        """Drain the socket: runs of placed DATA datagrams, how many datagrams they hold,
        opened control datagrams, and the QUIC-looking ones with their senders, in one
        native call (``native_io.drain``)."""
        got = native_io.drain(self.receiver, sock, self._rx_buffer, RECV_SLOTS, MAX_BATCHES_PER_WAKE)
        dropped = overflow.delta(sock, got.rxq_overflow)
        self.kernel_overflow += dropped
        self.oversize += got.truncated
        self.datagrams += got.placed
        return Received(got.runs, got.placed, got.controls, got.quic, got.pressed or dropped > 0, got.rx_ns)

    @property
    def counters(self) -> dict[str, int]:
        return {**self.receiver.counters, f"rejected_{overflow.REASON}": self.kernel_overflow,
                "rejected_oversize": self.oversize}
