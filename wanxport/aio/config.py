"""What an asyncio endpoint needs besides the session config: sockets and keys."""

from __future__ import annotations

from dataclasses import dataclass

from wanxport.core.config import SessionConfig
from wanxport.wire.protection import CIPHERS, IV_LEN, KEY_LEN

DATAPATHS = ("auto", "native", "python")
MAX_WORKERS = 64
MAX_RECEIVE_HOLDOFF_S = 0.1
Address = tuple[str, int]


@dataclass(frozen=True)
class PathSocket:
    """One UDP socket per path: ``local`` (port 0 = ephemeral) -> ``remote``.

    ``device`` pins the socket to an interface (SO_BINDTODEVICE) so each
    long-haul path leaves through its own link whatever the routing table says.
    ``remote`` may be None until the peer's address is known (``Endpoint.connect``).
    """

    local: Address
    remote: Address | None = None
    device: str | None = None
    dscp: int | None = None  # DiffServ code point marked on every datagram (aio.sockets.set_dscp)


@dataclass(frozen=True)
class DirectionKey:
    """The AEAD key and IV of one direction (key phase 0), given by the control channel."""

    cipher: str
    key: bytes
    iv: bytes

    def __post_init__(self) -> None:
        if self.cipher not in CIPHERS:
            raise ValueError(f"cipher {self.cipher!r} is not supported; valid: {', '.join(CIPHERS)}")
        if len(self.key) != KEY_LEN or len(self.iv) != IV_LEN:
            raise ValueError(f"key must be {KEY_LEN} bytes and iv {IV_LEN} bytes")


@dataclass(frozen=True)
class EndpointConfig:
    """One side of a session over real sockets.

    ``local_conn_id`` is the id our receiver accepts; ``remote_conn_id`` the
    one we write into headers (the peer's). ``send_key`` seals what we send,
    ``recv_key`` opens what the peer sends (the peer's ``send_key``).
    """

    session: SessionConfig
    sockets: tuple[PathSocket, ...]
    send_key: DirectionKey
    recv_key: DirectionKey
    local_conn_id: int = 1
    remote_conn_id: int = 1
    datapath: str = "auto"  # "native", "python", or "auto" (native when the extension imports)
    recv_buffer_bytes: int = 32 << 20
    send_buffer_bytes: int = 8 << 20
    pacer_capacity: int = 8192  # datagrams per path ring
    # The pacer spins this long before a release (precision) and sends everything
    # due within pacer_burst_ns in one sendmmsg/GSO call (fewer wake-ups). On a
    # small, shared machine spinning costs more throughput than it buys: at
    # 200 Mb/s a release is due every ~60 us, so a 20 us spin burns a third of a
    # core per path. A path slower than one GSO send (65 kB) per pacer_burst_ns
    # gets a longer window, until its burst fills one send or lasts 2 ms: 0.5 ms at
    # 150 Mb/s was ~9 datagrams a syscall; 2 ms is ~26 (38 kB), still far below any
    # WAN bottleneck buffer. 0: every datagram at its own time.
    pacer_spin_ns: int = 0
    pacer_burst_ns: int = 500_000
    # Threads the native data path spreads the paths over (aio.workers): path i goes
    # to worker i % workers, each seals, paces, receives, opens and places its own
    # paths on its own core. 1: everything on the loop's thread. At most one per path.
    workers: int = 1
    # Receive coalescing (aio.endpoint, "receive hold-off"): a path that becomes readable
    # is drained this long later, with every other path that became readable meanwhile,
    # in one pass through the session. At WAN rates a wake-up otherwise finds one or two
    # datagrams: the per-wake cost (epoll, recvmmsg, the Python
    # around them, a session service) then dominates the CPU per byte. The endpoint holds
    # at most the session's max_ack_delay_s (5 ms by default), the delay the protocol
    # already allows an acknowledgement, and not at all once a measured path's smoothed
    # RTT is under 8 hold-offs (a LAN or loopback: its round trip would multiply). Under
    # uvloop, whose timers count whole milliseconds, less than 1 ms is no hold-off at
    # all. 0: drain at once. Inline data path only (worker threads drain their own sockets).
    # It yields to a socket that fills (a drain stopped at its cap, or kernel drops:
    # core.holdoff.HOLDOFF_YIELD_S), which keeps a datagram flood from halving the goodput
    # as it did before the yield. What a datagram waited out the hold-off is left out of
    # the round-trip and delivery samples (core.holdoff). Off by default: a fixed 1 ms made
    # hetero-8path 3-9 % slower in each of 4 quiet same-run pairs (before those samples left
    # the wait out); the collective's preset turns it on (presets.COLLECTIVE).
    receive_holdoff_s: float = 0.0
    # The hold-off as the session's control interval (core.holdoff): from receive_holdoff_s
    # it grows to an eighth of the shortest smoothed RTT, at most max_ack_delay_s, so the
    # loop runs once per interval on a long path whatever its packet rate. False: a fixed
    # hold-off of receive_holdoff_s.
    receive_interval: bool = True

    def __post_init__(self) -> None:
        if len(self.sockets) != len(self.session.paths):
            raise ValueError(f"sockets: {len(self.sockets)} given, the session has "
                             f"{len(self.session.paths)} paths")
        if self.datapath not in DATAPATHS:
            raise ValueError(f"datapath {self.datapath!r} is not valid; valid: {', '.join(DATAPATHS)}")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ValueError(f"workers must be 1..{MAX_WORKERS}, got {self.workers}")
        if self.workers > 1 and self.datapath == "python":
            raise ValueError("workers > 1 needs the native data path")
        if not 0.0 <= self.receive_holdoff_s <= MAX_RECEIVE_HOLDOFF_S:
            raise ValueError(f"receive_holdoff_s must be 0..{MAX_RECEIVE_HOLDOFF_S} s, "
                             f"got {self.receive_holdoff_s}")
        if self.session.tag_bytes != 16:
            raise ValueError("session.tag_bytes must be 16: every datagram is AEAD-protected")
        for name in ("local_conn_id", "remote_conn_id"):
            if not 0 <= getattr(self, name) < 1 << 32:
                raise ValueError(f"{name} must fit in 32 bits")

