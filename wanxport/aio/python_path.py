"""The pure-Python data path: the reference sealer/opener and one syscall per datagram.

It exists so the endpoint runs where the extension is not built, and as the
reference the native path is compared against end to end. It does not pace
below the core's pacing horizon (datagrams leave when the core releases
them) and costs a Python frame per datagram, so expect a fraction of the
native throughput.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence

from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.plan import DataPlan, Plan
from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.frames import DataFrame, Frame
from wanxport.wire.header import is_quic
from wanxport.wire.protection import AeadProtection

MAX_DATAGRAM = 65535
MAX_DATAGRAMS_PER_WAKE = 512

OpenedPacket = tuple[int, int, list[Frame]]
QuicSink = Callable[[bytes, Address], None]


class PythonDatapath:
    name = "python"

    def __init__(self, sockets: Sequence[socket.socket], send_key: DirectionKey, recv_key: DirectionKey,
                 remote_conn_id: int, local_conn_id: int,
                 destinations: Sequence[Address | None] | None = None,
                 on_quic: Sequence[QuicSink | None] | None = None) -> None:
        self._sockets = list(sockets)
        # A socket shared with the control channel (aio.port) is unconnected: sends
        # name the peer, QUIC-looking datagrams (0x40) go to its control side.
        self._dest = list(destinations or [None] * len(sockets))
        self._on_quic = list(on_quic or [None] * len(sockets))
        self.quic_unclaimed = 0
        self._attached = [False] * len(sockets)
        self._sealer = PacketSealer(remote_conn_id, {0: AeadProtection(send_key.cipher, send_key.key,
                                                                         send_key.iv)})
        self.opener = PacketOpener(local_conn_id, len(sockets),
                                   {0: AeadProtection(recv_key.cipher, recv_key.key, recv_key.iv)})
        self.send_errors = 0
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
        self.opener.keys[phase & 1] = AeadProtection(key.cipher, key.key, key.iv)

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
        except (BlockingIOError, ConnectionRefusedError):
            self.send_errors += 1  # UDP semantics: the core repairs the loss

    @property
    def backlogged(self) -> bool:
        return False

    def flush(self) -> None:
        """Nothing is ever held back."""

    def receive(self, path_id: int) -> list[OpenedPacket]:
        sock = self._sockets[path_id]
        on_quic = self._on_quic[path_id]
        out: list[OpenedPacket] = []
        for _ in range(MAX_DATAGRAMS_PER_WAKE):
            try:
                datagram, addr = sock.recvfrom(MAX_DATAGRAM)
            except BlockingIOError:
                break
            except ConnectionRefusedError:
                continue  # an ICMP error queued on the socket (peer not up yet): consumed
            if is_quic(datagram):  # the control channel's, on a port shared with it
                if on_quic is None:
                    self.quic_unclaimed += 1
                else:
                    on_quic(datagram, (str(addr[0]), int(addr[1])))
                continue
            opened = self.opener.open(datagram)
            if opened is not None:
                out.append((opened.header.path_id, opened.header.packet_number, opened.frames))
        return out

    @property
    def rejected(self) -> int:
        return self.opener.dropped + self.quic_unclaimed

    @property
    def counters(self) -> dict[str, int]:
        # dict() copies in one C call: a metrics scrape reads this from another thread.
        out = {f"rejected_{k}": v for k, v in dict(self.opener.drops).items()}
        if self.quic_unclaimed:
            out["rejected_quic"] = out.get("rejected_quic", 0) + self.quic_unclaimed
        return out

    def close(self, drain_s: float = 0.0) -> None:
        """Nothing to stop."""
