"""The pure-Python data path: the reference sealer and receiver, one syscall per datagram.

It exists so the endpoint runs where the extension is not built, and as the
reference the native path is compared against end to end: it seals each
datagram with ``wire.datapath.PacketSealer`` and opens, replay-checks and
places with ``wire.receiver.ReferenceReceiver``, so the endpoint drives the
core exactly as with the native path. It does not pace below the core's
pacing horizon (datagrams leave when the core releases them) and costs a
Python frame per datagram, so expect a fraction of the native throughput.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence

from wanxport.aio import overflow
from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.datapath import Deliver, PlacesShards, Received
from wanxport.aio.plan import DataPlan, Plan
from wanxport.wire.datapath import PacketSealer
from wanxport.wire.frames import DataFrame
from wanxport.wire.protection import AeadProtection
from wanxport.wire.receiver import ReferenceReceiver, fold_runs

MAX_DATAGRAM = 65535
MAX_DATAGRAMS_PER_WAKE = 512


class PythonDatapath(PlacesShards):
    receiver: ReferenceReceiver
    name = "python"

    def __init__(self, sockets: Sequence[socket.socket], send_key: DirectionKey, recv_key: DirectionKey,
                 remote_conn_id: int, local_conn_id: int,
                 destinations: Sequence[Address | None] | None = None) -> None:
        self._sockets = list(sockets)
        # A socket shared with the control channel (aio.port) is unconnected: sends
        # name the peer.
        self._dest = list(destinations or [None] * len(sockets))
        self._attached = [False] * len(sockets)
        self._sealer = PacketSealer(remote_conn_id, {0: AeadProtection(send_key.cipher, send_key.key,
                                                                         send_key.iv)})
        self.receiver = ReferenceReceiver(local_conn_id, len(sockets))
        self.receiver.set_key(0, AeadProtection(recv_key.cipher, recv_key.key, recv_key.iv))
        self.kernel_overflow = 0  # the kernel's drops for a full socket buffer (aio.overflow)
        for sock in self._sockets:
            overflow.enable(sock)
        self.send_errors = 0
        self.datagrams_sent = 0  # handed to the kernel
        self.key_phase = 0
        self.packets_under_key = 0  # sealed under the current sending key: the rotation trigger
        self.bytes_under_key = 0

    def use_send_key(self, phase: int, key: DirectionKey) -> None:
        """Seal from now on with ``key`` and ``phase`` in the header's key-phase bit."""
        self.key_phase = phase & 1
        self._sealer.keys = {self.key_phase: AeadProtection(key.cipher, key.key, key.iv)}
        self._sealer.key_phase = self.key_phase
        self.packets_under_key = self.bytes_under_key = 0

    def install_recv_key(self, phase: int, key: DirectionKey) -> None:
        """Open datagrams whose key-phase bit is ``phase`` with ``key``."""
        self.receiver.set_key(phase, AeadProtection(key.cipher, key.key, key.iv))

    threaded = False  # the loop reads the sockets and calls receive()

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None:
        """Nothing to start: this path has no worker threads."""

    def attach(self, path_id: int) -> None:
        self._attached[path_id] = True

    def set_rate(self, path_id: int, rate_bytes_per_s: float) -> None:
        """No pacer: the core's pacing horizon is the only spacing."""

    def send(self, plans: list[Plan]) -> None:
        for plan in plans:
            self.packets_under_key += plan.count if isinstance(plan, DataPlan) else 1
            self.bytes_under_key += plan.length if isinstance(plan, DataPlan) else 0
            if not self._attached[plan.path_id]:
                continue
            sock, dest = self._sockets[plan.path_id], self._dest[plan.path_id]
            if isinstance(plan, DataPlan):
                for i in range(plan.count):
                    start = plan.offset + i * plan.segment
                    length = min(plan.segment, plan.offset + plan.length - start)
                    frame = DataFrame(plan.shard_id, start, length, plan.buffer[start:start + length])
                    self._send(sock, dest, self._sealer.seal(plan.path_id, plan.first_pn + i, [frame]))
            else:
                self._send(sock, dest, self._sealer.seal(plan.path_id, plan.pn, plan.frames))

    def _send(self, sock: socket.socket, dest: Address | None, datagram: bytes) -> None:
        try:
            if dest is None:
                sock.send(datagram)
            else:
                sock.sendto(datagram, dest)
            self.datagrams_sent += 1
        except OSError:  # a full buffer, the peer's socket gone, a local firewall: lost as on the wire
            self.send_errors += 1  # UDP semantics: the core repairs the loss

    @property
    def backlogged(self) -> bool:
        return False

    @property
    def datagrams_refused(self) -> int:
        return self.send_errors

    def flush(self) -> None:
        """Nothing is ever held back."""

    def receive(self, path_id: int) -> Received:
        """Drain the path's socket: runs of placed DATA datagrams, opened control datagrams,
        and the QUIC-looking ones (the reference receiver sets them apart) with their senders."""
        sock = self._sockets[path_id]
        datagrams: list[bytes] = []
        senders: list[Address] = []
        dropped, capped = self.kernel_overflow, True
        for _ in range(MAX_DATAGRAMS_PER_WAKE):
            try:
                datagram, ancdata, _, addr = sock.recvmsg(MAX_DATAGRAM, overflow.CMSG_BYTES)
            except BlockingIOError:
                capped = False
                break
            except ConnectionRefusedError:
                continue  # an ICMP error queued on the socket (peer not up yet): consumed
            self.kernel_overflow += overflow.delta(sock, overflow.from_ancillary(ancdata))
            datagrams.append(datagram)
            senders.append((str(addr[0]), int(addr[1])))
        result = self.receiver.process(datagrams)
        return Received(fold_runs(result.placed), len(result.placed),
                        [(c.path_id, c.packet_number, c.plaintext) for c in result.controls],
                        [(datagram, senders[index]) for index, datagram in result.quic],
                        pressed=capped or self.kernel_overflow > dropped)

    @property
    def rejected(self) -> int:
        return sum(v for k, v in self.counters.items() if k.startswith("rejected_"))

    @property
    def counters(self) -> dict[str, int]:
        # dict() copies in one C call: a metrics scrape reads this from another thread.
        return {**self.receiver.counters, f"rejected_{overflow.REASON}": self.kernel_overflow}

    def close(self, drain_s: float = 0.0) -> None:
        """Nothing to stop."""
