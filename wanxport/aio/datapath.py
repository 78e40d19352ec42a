"""The one protocol both data paths implement, and the one result their receive() gives.

Why: the endpoint drives the core with the same calls whichever data path
moves the bytes — ``Session.receive_data_run`` per run of placed DATA
datagrams, ``Session.receive_packets`` for the opened control datagrams of a drain — so it
must not care which one it has. The native path (``native_path``) does the
per-datagram work in C; the Python path (``python_path``) runs the pure-Python
reference of the same receiver (``wanxport.wire.receiver``).

A path's socket may be shared with its QUIC control channel (one port per
path, ``aio.port``): both receivers demultiplex by first byte (QUIC sets
0x40) and ``receive()`` returns those datagrams untouched with their sender,
for the endpoint to hand to the port's control side.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from wanxport.aio.config import Address, DirectionKey
from wanxport.aio.plan import Plan
from wanxport.wire.receiver import Run


@dataclass(slots=True)
class Received:
    """What one drain of a path's socket yielded."""

    runs: list[Run] = field(default_factory=list)  # placed DATA (see wire.receiver.Run)
    datagrams: int = 0  # placed DATA datagrams the runs hold
    controls: list[tuple[int, int, bytes]] = field(default_factory=list)  # (path_id, pn, plaintext)
    quic: list[tuple[bytes, Address]] = field(default_factory=list)  # QUIC-looking (datagram, sender)
    # The socket is filling faster than it is drained: the drain stopped at its cap with
    # datagrams left, or the kernel dropped some for a full buffer since the last drain.
    # The endpoint's receive hold-off yields then (aio.endpoint).
    pressed: bool = False
    # The kernel's receive time (CLOCK_REALTIME ns) of the newest datagram drained, 0 when
    # unknown: how long it waited out a receive hold-off is no part of a round trip.
    rx_ns: int = 0


class ShardReceiver(Protocol):
    """What both receivers (``wire.native.Receiver``, ``wire.receiver.ReferenceReceiver``) offer."""

    def add_shard(self, shard_id: int, buffer: memoryview) -> None: ...

    def remove_shard(self, shard_id: int) -> None: ...

    def freeze(self, shard_id: int, upto: int) -> None: ...


class PlacesShards:
    """The shard-buffer part of the protocol, the same for both data paths: their receiver
    (native or the reference) owns the registered buffers and places DATA into them."""

    receiver: ShardReceiver

    def add_shard(self, shard_id: int, buffer: memoryview) -> None:
        self.receiver.add_shard(shard_id, buffer)

    def remove_shard(self, shard_id: int) -> None:
        self.receiver.remove_shard(shard_id)

    def freeze(self, shard_id: int, upto: int) -> None:
        """Bytes below ``upto`` are all in: never write them again (see aio.verify)."""
        self.receiver.freeze(shard_id, upto)


Deliver = Callable[[list[tuple[int, "Received"]]], None]  # (path_id, Received) pairs, on the loop


class Datapath(Protocol):
    """Seals and paces what the core sends; opens, checks and places what arrives.

    Inline (``threaded`` False) the endpoint reads each socket from the loop and
    calls ``receive``; threaded, worker threads drain the sockets and hand their
    results to the ``deliver`` given to ``start`` (``aio.workers``).
    """

    name: str
    packets_under_key: int  # sealed under the current sending key: the rotation trigger
    bytes_under_key: int

    @property
    def threaded(self) -> bool: ...

    def start(self, loop: asyncio.AbstractEventLoop, deliver: Deliver) -> None: ...

    def use_send_key(self, phase: int, key: DirectionKey) -> None: ...

    def install_recv_key(self, phase: int, key: DirectionKey) -> None: ...

    def attach(self, path_id: int) -> None: ...

    def set_rate(self, path_id: int, rate_bytes_per_s: float) -> None: ...

    def send(self, plans: list[Plan]) -> None: ...

    @property
    def backlogged(self) -> bool: ...

    def flush(self) -> None: ...

    def add_shard(self, shard_id: int, buffer: memoryview) -> None: ...

    def remove_shard(self, shard_id: int) -> None: ...

    def freeze(self, shard_id: int, upto: int) -> None: ...

    def receive(self, path_id: int) -> Received: ...

    @property
    def rejected(self) -> int: ...

    @property
    def datagrams_sent(self) -> int:
        """Datagrams handed to the kernel so far, data and control: what left, not what
        the core queued (a stalled sender shows as the two parting)."""
        ...

    @property
    def datagrams_refused(self) -> int:
        """Datagrams the kernel would not send (a local firewall, no route, the peer's socket
        gone): lost, as on the wire, and repaired by the core."""
        ...

    @property
    def counters(self) -> dict[str, int]: ...

    def close(self, drain_s: float = 0.2) -> None: ...
