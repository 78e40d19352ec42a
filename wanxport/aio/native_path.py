"""The native data path: sealed bursts into the C pacer, batches out of recvmmsg.

Per call, not per datagram: one ``build_data_datagrams`` per data plan (it
segments and seals the whole burst in C), one ``enqueue`` per plan into the
pacer's ring, one ``recv_batch`` + ``Receiver.process`` per batch of up to 64
messages (more with GRO), which open, replay-check and place DATA straight
into the registered shard buffers.
"""

from __future__ import annotations

import logging
import socket
import time
from collections import deque
from collections.abc import Sequence

from wanxport.aio import native_io, overflow
from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.datapath import PlacesShards, Received
from wanxport.aio.plan import ControlPlan, DataPlan, Plan
from wanxport.wire import native
from wanxport.wire.frames import AckFrame, PaddingFrame, encode_frames
from wanxport.wire.header import encode_header

log = logging.getLogger(__name__)

RECV_SLOTS = 64
GRO_SLOT_BYTES = 65536
MAX_BATCHES_PER_WAKE = 16


class _Pending:
    """A plan's datagrams the pacer ring had no room for yet (backpressure)."""

    __slots__ = ("buffer", "stride", "lengths", "not_before_ns")

    def __init__(self, buffer: memoryview, stride: int | None, lengths: list[int] | None,
                 not_before_ns: int) -> None:
        self.buffer = buffer
        self.stride = stride
        self.lengths = lengths
        self.not_before_ns = not_before_ns


def _address(addr: object) -> Address:
    assert isinstance(addr, tuple), addr  # recv_batch(quic_addrs=True) named this sender
    return str(addr[0]), int(addr[1])


def not_eliciting(plan: ControlPlan) -> bool:
    """Only ACK and PADDING frames: the peer records nothing that could be reordered."""
    return all(isinstance(frame, AckFrame | PaddingFrame) for frame in plan.frames)


class NativeDatapath(PlacesShards):
    receiver: native.Receiver
    name = "native"

    def __init__(self, sockets: Sequence[socket.socket], send_key: DirectionKey, recv_key: DirectionKey,
                 remote_conn_id: int, local_conn_id: int, slot_size: int, capacity: int,
                 spin_ns: int, burst_ns: int, destinations: Sequence[Address | None] | None = None) -> None:
        n = len(sockets)
        self._sockets = list(sockets)
        # A path's socket shared with the control channel (aio.port) is unconnected:
        # sends name the peer.
        self._dest = list(destinations or [None] * n)
        self._seal = native.Protector(send_key.cipher, send_key.key, send_key.iv)
        self._conn = remote_conn_id
        self.receiver = native.Receiver(local_conn_id, n)
        self.receiver.set_key(0, native.Protector(recv_key.cipher, recv_key.key, recv_key.iv))
        self.pacer = native_io.Pacer(n, capacity=capacity, slot_size=slot_size, spin_ns=spin_ns,
                                     burst_ns=burst_ns)
        self.gro = [False] * n
        # Drops outside the receiver's parsers: the kernel's, for a full socket
        # buffer (aio.overflow), and messages larger than a receive slot.
        self.kernel_overflow = 0
        self.oversize = 0
        for i, sock in enumerate(sockets):
            overflow.enable(sock)
            native_io.enable_timestamps(sock)
            self.gro[i] = native_io.enable_gro(sock)
        slot = GRO_SLOT_BYTES if any(self.gro) else slot_size
        self._rx_buffer = bytearray(RECV_SLOTS * slot)
        self._pending: list[deque[_Pending]] = [deque() for _ in range(n)]
        self._rates = [0.0] * n
        self.key_phase = 0
        self.packets_under_key = 0  # sealed under the current sending key: the rotation trigger
        self.bytes_under_key = 0
        self.local_send_errors = 0

    # -- keys ----------------------------------------------------------------

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        """Seal from now on with ``key`` and ``phase`` in the header's key-phase bit.

        Datagrams already sealed and waiting in the pacer ring keep their old
        phase, which the peer still holds, so a switch strands nothing in flight.
        """
        self._seal = native.Protector(key.cipher, key.key, key.iv)
        self.key_phase = phase & 1
        self.packets_under_key = self.bytes_under_key = 0

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        """Open datagrams whose key-phase bit is ``phase`` with ``key``."""
        self.receiver.set_key(phase & 1, native.Protector(key.cipher, key.key, key.iv))

    def attach(self, path_id: int) -> None:
        """Start sending on a path (to its socket's peer, or to its destination)."""
        self.pacer.set_path(path_id, self._sockets[path_id], self._dest[path_id])

    # -- send ----------------------------------------------------------------

    def set_rate(self, path_id: int, rate_bytes_per_s: float) -> None:
        old = self._rates[path_id]
        if abs(rate_bytes_per_s - old) > 0.01 * old:
            self._rates[path_id] = rate_bytes_per_s
            self.pacer.set_rate(path_id, rate_bytes_per_s)

    def send(self, plans: list[Plan]) -> None:
        for plan in plans:
            nb = int(plan.not_before * 1e9)
            if isinstance(plan, DataPlan):
                burst = native.build_data_datagrams(
                    self._seal, self._conn, plan.path_id, plan.first_pn, self.key_phase, plan.shard_id,
                    plan.buffer, plan.offset, plan.length, plan.segment)
                self.packets_under_key += burst.count
                self.bytes_under_key += len(burst.buffer)
                self._enqueue(plan.path_id, _Pending(memoryview(burst.buffer), burst.stride, None, nb))
            else:
                self.packets_under_key += 1
                # The core schedules an ACK behind data it handed out earlier; only when
                # that data has left may the ACK skip the ring.
                overtake = not_eliciting(plan) and plan.not_before <= time.monotonic()
                self._send_control(plan.path_id, self._seal_control(plan), nb, overtake=overtake)

    def _seal_control(self, plan: ControlPlan) -> bytes:
        header = encode_header(plan.path_id, self._conn, plan.pn, self.key_phase)
        return self._seal.seal(header, encode_frames(plan.frames))

    def _send_control(self, path_id: int, datagram: bytes, not_before_ns: int,
                      overtake: bool = True) -> None:
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
                return
            except (BlockingIOError, InterruptedError):
                pass
            except ConnectionRefusedError:
                return  # the peer's socket is gone (ICMP): UDP semantics, the core repairs
            except OSError as exc:
                self.local_send_errors += 1
                log.debug("path %d: control datagram not sent (%s)", path_id, exc.strerror or exc)
                return
        self._enqueue(path_id, _Pending(memoryview(datagram), None, None, not_before_ns))

    def _enqueue(self, path_id: int, item: _Pending) -> None:
        queue = self._pending[path_id]
        if queue or not self._push(path_id, item):
            queue.append(item)

    def _push(self, path_id: int, item: _Pending) -> bool:
        """Enqueue as much as fits; True when all of it did."""
        if item.stride is None:
            lengths = item.lengths or [len(item.buffer)]
            accepted = self.pacer.enqueue(path_id, item.buffer, lengths=lengths,
                                          not_before_ns=item.not_before_ns)
            if accepted == len(lengths):
                return True
            item.buffer = item.buffer[sum(lengths[:accepted]):]
            item.lengths = lengths[accepted:]
            return False
        accepted = self.pacer.enqueue(path_id, item.buffer, stride=item.stride,
                                      not_before_ns=item.not_before_ns)
        item.buffer = item.buffer[accepted * item.stride:]
        return len(item.buffer) == 0

    @property
    def backlogged(self) -> bool:
        return any(self._pending)

    def flush(self) -> None:
        """Retry what backpressure held back, in order."""
        for path_id, queue in enumerate(self._pending):
            while queue and self._push(path_id, queue[0]):
                queue.popleft()

    # -- receive -------------------------------------------------------------

    def receive(self, path_id: int) -> Received:
        """Drain the path's socket: runs of placed DATA datagrams (``native.fold_runs``), how
        many datagrams they hold, opened control datagrams, and the QUIC-looking ones with
        their senders (``recv_batch(quic_addrs=True)`` builds an address only for those)."""
        sock = self._sockets[path_id]
        out = Received()
        runs, controls = out.runs, out.controls
        for _ in range(MAX_BATCHES_PER_WAKE):
            try:
                batch = native_io.recv_batch(sock, self._rx_buffer, RECV_SLOTS, quic_addrs=True)
            except ConnectionRefusedError:
                continue  # an ICMP error queued on the socket (peer not up yet): consumed
            self.kernel_overflow += overflow.delta(sock, batch.rxq_overflow)
            self.oversize += batch.truncated
            if batch.count == 0:
                break
            result = self.receiver.process(batch)
            if len(result.records):
                runs += native.fold_runs(result.records)
                out.datagrams += len(result.records)
            for c in result.controls:
                controls.append((c.path_id, c.packet_number, c.plaintext))
            if result.quic:
                addrs = batch.addrs
                assert addrs is not None  # quic_addrs: a sender for every QUIC-looking datagram
                out.quic += [(datagram, _address(addrs[index])) for index, datagram in result.quic]
        return out

    @property
    def rejected(self) -> int:
        return sum(v for k, v in self.counters.items() if k.startswith("rejected_"))

    @property
    def counters(self) -> dict[str, int]:
        return {**self.receiver.counters, f"rejected_{overflow.REASON}": self.kernel_overflow,
                "rejected_oversize": self.oversize}

    def close(self, drain_s: float = 0.2) -> None:
        """Let queued datagrams leave (bounded wait), then stop the pacer thread."""
        if not self.pacer.closed:
            deadline = time.monotonic() + drain_s
            self.flush()
            self.pacer.wait_idle(max(0.0, deadline - time.monotonic()))
            self.pacer.close()
