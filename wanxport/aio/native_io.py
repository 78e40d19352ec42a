"""Typed wrapper of the I/O half of the native data path, ``wanxport._native``.

Why apart from ``wanxport/wire/native.py``: wire is the pure layer (bytes in,
bytes out); receiving from sockets, setting socket options and the pacer's
sender thread are I/O, which belongs to the asyncio adapter. Both wrap the same
extension module, loaded once by wire/native.py, so ``native.NATIVE_AVAILABLE``
and ``native.import_error`` answer for these functions too.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import NamedTuple

from wanxport.wire.native import Buffer, DataBurst, DatagramBatch, Protector, Receiver, require

FdLike = int | socket.socket


def recv_batch(
    fd: FdLike, buffer: bytearray | memoryview, max_datagrams: int, want_addrs: bool = False,
    quic_addrs: bool = False,
) -> DatagramBatch:
    """Drain up to ``max_datagrams`` messages (non-blocking; an empty batch on EAGAIN).

    ``buffer`` is split into ``max_datagrams`` equal slots; with UDP GRO each
    slot should hold 64 KiB, and coalesced messages are split back into
    datagrams (so ``count`` may exceed ``max_datagrams``). Timestamps are the
    kernel's CLOCK_REALTIME receive times when enable_timestamps() was called.
    ``quic_addrs``: ``addrs`` holds the sender only of QUIC-looking datagrams
    (None elsewhere), what a socket shared with the control channel needs.
    ``rxq_overflow`` is the socket's cumulative kernel drop count when SO_RXQ_OVFL
    is on (``aio.overflow``), and ``truncated`` the messages larger than a slot.
    """
    count, desc, addrs, truncated, overflow = require().recv_batch(fd, buffer, max_datagrams,
                                                                   want_addrs, quic_addrs)
    return DatagramBatch(buffer, desc, count, addrs, truncated, overflow)


class Drained(NamedTuple):
    """What ``drain`` read from a socket and placed."""

    runs: list[tuple[int, int, int, int, int, int]]  # placed DATA (see wire.receiver.Run)
    placed: int  # DATA datagrams the runs hold
    controls: list[tuple[int, int, bytes]]  # (path_id, pn, plaintext) of authenticated non-DATA
    quic: list[tuple[bytes, tuple[str, int]]]  # QUIC-looking datagrams, untouched, and their senders
    pressed: bool  # stopped at max_batches with the socket not yet dry
    rx_ns: int  # kernel receive time (CLOCK_REALTIME ns) of the newest datagram; 0: none
    truncated: int  # messages larger than a slot (dropped)
    rxq_overflow: int  # the socket's SO_RXQ_OVFL drop count on the newest message; -1: none


def drain(receiver: Receiver, fd: FdLike, buffer: bytearray | memoryview, max_messages: int,
          max_batches: int) -> Drained:
    """Read ``fd`` in ``recvmmsg`` batches of up to ``max_messages`` (``buffer`` split into that
    many slots) until it runs dry or ``max_batches`` were read, and open, check and place each
    batch with ``receiver``: ``recv_batch`` and ``Receiver.process`` of every batch, and the
    folding of their records into runs, in one native call."""
    return Drained(*receiver._c.drain(fd, buffer, max_messages, max_batches))


def enable_timestamps(fd: FdLike) -> None:
    require().enable_timestamps(fd)


def enable_gro(fd: FdLike) -> bool:
    """Turn on UDP GRO; False when the kernel does not support it."""
    return bool(require().enable_gro(fd))


@dataclass(frozen=True, slots=True)
class NativePathCounters:
    """One path's pacer counters (Pacer.stats())."""

    sent_datagrams: int
    sent_bytes: int
    send_errors: int
    queue_depth: int
    gso_sends: int
    eagain: int
    gso: bool


@dataclass(frozen=True, slots=True)
class PacerThreadStats:
    """What a pacer's release thread cost (Pacer.thread_stats()): its CPU time (user +
    system, at exit once closed), the waits it entered and the rounds that sent."""

    cpu_s: float
    sleeps: int
    send_rounds: int


class Pacer:
    """Timed sender thread: per-path bounded FIFO rings released at pacing times.

    The Python side owns the sockets; close() (or leaving the ``with`` block)
    stops the thread before they may be closed.
    """

    __slots__ = ("_c",)

    def __init__(
        self,
        n_paths: int,
        *,
        capacity: int = 4096,
        slot_size: int = 2048,
        max_batch: int = 64,
        gso: bool = True,
        gso_segments: int = 64,
        spin_ns: int = 20_000,
        burst_ns: int = 0,
    ) -> None:
        self._c = require().Pacer(
            n_paths, capacity, slot_size, max_batch, gso, gso_segments, spin_ns, burst_ns
        )

    @property
    def name(self) -> str:
        return str(self._c.name)

    @property
    def closed(self) -> bool:
        return bool(self._c.closed)

    def set_path(self, path_id: int, fd: FdLike | None, dest: tuple[str, int] | None = None) -> None:
        """The socket of a path (None disables it); ``dest`` for unconnected sockets."""
        self._c.set_path(path_id, fd, dest)

    def set_rate(self, path_id: int, rate_bytes_per_s: float) -> None:
        self._c.set_rate(path_id, float(rate_bytes_per_s))

    def set_pps(self, path_id: int, pps: float) -> None:
        self._c.set_pps(path_id, float(pps))

    def enqueue(
        self,
        path_id: int,
        buffer: Buffer,
        *,
        stride: int | None = None,
        lengths: Sequence[int] | None = None,
        not_before_ns: int = 0,
    ) -> int:
        """Copy datagrams into the path's ring; returns how many fit (a prefix)."""
        return int(self._c.enqueue(path_id, buffer, stride, lengths, not_before_ns))

    def enqueue_data(self, path_id: int, protector: Protector, conn_id: int, first_pn: int, key_phase: int,
                     shard_id: int, shard_buffer: Buffer, offset: int, length: int, max_payload: int,
                     not_before_ns: int = 0) -> int:
        """Queue shard bytes as DATA, sealed by the release thread as they leave (no copy);
        returns how many datagrams fit (a prefix: re-offer the rest from ``first_pn`` + that
        many). Until they have left, the pacer holds ``shard_buffer`` and ``protector``."""
        return int(self._c.enqueue_data(path_id, protector._c, conn_id, first_pn, key_phase, shard_id,
                                        shard_buffer, offset, length, max_payload, not_before_ns))

    def enqueue_burst(self, path_id: int, burst: DataBurst, start: int = 0, not_before_ns: int = 0) -> int:
        """Enqueue datagrams ``start..`` of a burst; returns how many were accepted."""
        if start >= burst.count:
            return 0
        view = memoryview(burst.buffer)[start * burst.stride :]
        return self.enqueue(path_id, view, stride=burst.stride, not_before_ns=not_before_ns)

    def wait_idle(self, timeout_s: float) -> bool:
        """Block (without the GIL) until every queue is empty; False on timeout."""
        return bool(self._c.wait_idle(timeout_s))

    def stats(self) -> list[NativePathCounters]:
        return [NativePathCounters(**s) for s in self._c.stats()]

    def make_resident(self) -> None:
        """Fault in every path's whole ring now, which the pacer otherwise does once a
        path carries bulk data: a caller measuring steady-state cost pays it first."""
        self._c.make_resident()

    def thread_stats(self) -> PacerThreadStats:
        return PacerThreadStats(**self._c.thread_stats())

    def close(self) -> None:
        self._c.close()

    def __enter__(self) -> Pacer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
