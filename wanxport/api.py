"""The Python API: send numpy arrays and bytes to another gateway, receive them in place.

Sender::

    from wanxport.api import connect
    async with connect("pki/gw-a", "pki/ca.pem", ["10.0.0.2:7400", "10.0.1.2:7400"]) as peer:
        await peer.send(np.arange(1 << 20, dtype=np.float32))      # returns once verified there

Receiver::

    from wanxport.api import listen
    async with listen("pki/gw-b", "pki/ca.pem", ["10.0.0.2:7400", "10.0.1.2:7400"]) as server:
        async with await server.accept() as peer:
            out = np.empty(1 << 20, dtype=np.float32)
            peer.expect(0, out)                 # shard 0 is written straight into `out`
            shard = await peer.receive()        # shard.array is out

Each path is ``HOST:PORT``: one UDP port for the data and the QUIC control
channel (see ``wanxport.gateway.config``), so ``7400`` and ``7401`` can be two
paths of one host. Shard ids count from 0 per
connection unless given. Authentication is mutual TLS against ``ca``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from wanxport.control import ShardAnnounce
from wanxport.gateway.config import Address, GatewayOptions, parse_hostport
from wanxport.gateway.handshake import SetupError, initiate
from wanxport.gateway.listener import GatewayListener
from wanxport.gateway.session import GatewaySession, SessionFailed
from wanxport.gateway.shards import UNHASHED, DeliveredShard

__all__ = ["GatewayOptions", "Listener", "Peer", "SessionFailed", "SetupError", "Shard", "ShardFailed",
           "connect", "listen"]

PathSpec = str | Address


class ShardFailed(Exception):
    """The receiver did not verify a shard (integrity failure or aborted)."""


@dataclass(frozen=True)
class Shard:
    """A received shard: ``array`` (dtype and shape as sent; uint8 for bytes) and its metadata.

    ``verified_at``: when its last byte was verified here, on ``time.monotonic`` (the
    clock a sender on the same host reads too), so a caller can time a transfer to
    the moment it was complete rather than to when it read the shard.
    """

    shard_id: int
    array: npt.NDArray[Any]
    name: str | None
    step: int
    ok: bool
    verified_at: float

    def tobytes(self) -> bytes:
        return self.array.tobytes()


def _paths(paths: Sequence[PathSpec]) -> list[Address]:
    return [parse_hostport(p, "paths") if isinstance(p, str) else (p[0], int(p[1])) for p in paths]


class Peer:
    """One session with another gateway (either direction of setup)."""

    def __init__(self, session: GatewaySession,
                 expected: dict[int, npt.NDArray[Any]] | None = None) -> None:
        self.session = session
        self._next_id = 0
        self._expected: dict[int, npt.NDArray[Any]] = {} if expected is None else expected
        self._placed: dict[int, npt.NDArray[Any]] = {}

    @property
    def peer_name(self) -> str:
        return self.session.peer_name

    @property
    def datagrams_rejected(self) -> int:
        return self.session.datagrams_rejected

    async def send(self, data: Any, *, shard_id: int | None = None, step: int = 0,
                   name: str | None = None) -> int:
        """Send a numpy array or any bytes-like object; return its shard id once the
        receiver verified it (``ShardFailed`` otherwise)."""
        if shard_id is None:
            shard_id = self._next_id
        self._next_id = max(self._next_id, shard_id + 1)
        dtype = shape = None
        if isinstance(data, np.ndarray):
            array = np.ascontiguousarray(data)
            dtype, shape = array.dtype.str, list(array.shape)
            view = memoryview(array.reshape(-1).view(np.uint8))
        else:
            view = memoryview(data).cast("B")
        if len(view) == 0:
            raise ValueError("send: a shard needs at least one byte")
        # Hashed by the session: with a peer of protocol 5 while its first datagrams are sent.
        announce = ShardAnnounce(shard_id, len(view), UNHASHED, step, name=name, dtype=dtype, shape=shape)
        meta = {"dtype": dtype, "shape": shape}
        if not await self.session.send_shard(shard_id, view, announce, meta):
            raise ShardFailed(f"shard {shard_id}: the receiver did not verify it")
        return shard_id

    def expect(self, shard_id: int, out: npt.NDArray[Any] | bytearray | memoryview) -> None:
        """Have shard ``shard_id`` written straight into ``out`` (C-contiguous, exact size).

        Registered before the shard's first datagram arrives, the data plane
        places the bytes into ``out`` directly; registered later, ``receive``
        copies them there once.
        """
        _expect(self._expected, shard_id, out)

    def _allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        out = self._expected.pop(shard_id, None)
        if out is not None and out.nbytes == size:
            self._placed[shard_id] = out
            return out.reshape(-1).view(np.uint8)
        return np.empty(size, dtype=np.uint8)

    def _start_receiving(self) -> None:
        """Verdicts go back as soon as shards arrive, whether or not the app reads them yet:
        the sender's ``send`` waits for them."""
        self._queue: asyncio.Queue[Shard | BaseException] = asyncio.Queue()
        self._receiver = asyncio.create_task(self._receive_loop())

    async def _receive_loop(self) -> None:
        try:
            while True:
                got: DeliveredShard = await self.session.receive()
                await self.session.complete(got.shard_id, "verified" if got.ok else "integrity-failure")
                self._queue.put_nowait(self._shard(got))
        except Exception as exc:  # noqa: BLE001 - handed to the reader
            self._queue.put_nowait(exc)

    def _shard(self, got: DeliveredShard) -> Shard:
        placed = self._placed.pop(got.shard_id, None)
        announce = got.announce
        raw = np.frombuffer(got.data, dtype=np.uint8)
        if placed is not None:
            array = placed
        else:
            array = raw.view(np.dtype(announce.dtype)).reshape(announce.shape) if announce.dtype else raw
        return Shard(got.shard_id, array, announce.name, announce.step, got.ok, got.at)

    async def receive(self) -> Shard:
        """The next shard (already verified and confirmed to the sender)."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            self._queue.put_nowait(item)
            raise item
        late = self._expected.pop(item.shard_id, None)
        if late is not None and late is not item.array and late.nbytes == item.array.nbytes:
            late.reshape(-1).view(np.uint8)[:] = item.array.reshape(-1).view(np.uint8)
            return dataclasses.replace(item, array=late)
        return item

    async def close(self) -> None:
        receiver = getattr(self, "_receiver", None)
        if receiver is not None:
            receiver.cancel()
        await self.session.close()

    async def __aenter__(self) -> Peer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _Connecting:
    """``connect(...)`` works with ``await`` and with ``async with``."""

    def __init__(self, identity: str | os.PathLike[str], ca: str | os.PathLike[str],
                 paths: Sequence[PathSpec], options: GatewayOptions | None) -> None:
        self._args = (identity, ca, _paths(paths), options)
        self._peer: Peer | None = None

    def __await__(self) -> Any:
        return self._open().__await__()

    async def _open(self) -> Peer:
        identity, ca, paths, options = self._args
        peer_box: list[Peer] = []

        def allocate(shard_id: int, size: int, meta: bytes) -> Any:
            return peer_box[0]._allocate(shard_id, size, meta)

        session = await initiate(paths, identity, ca, options, allocator=allocate)
        peer_box.append(Peer(session))
        return peer_box[0]

    async def __aenter__(self) -> Peer:
        self._peer = await self._open()
        return self._peer

    async def __aexit__(self, *exc: object) -> None:
        if self._peer is not None:
            await self._peer.close()


def connect(identity: str | os.PathLike[str], ca: str | os.PathLike[str], paths: Sequence[PathSpec],
            options: GatewayOptions | None = None) -> _Connecting:
    """Open a session to the gateway listening on ``paths`` (``"host:port"`` or tuples)."""
    return _Connecting(identity, ca, paths, options)


class Listener:
    """Accepts sessions from senders; ``async with`` starts and stops listening."""

    def __init__(self, identity: str | os.PathLike[str], ca: str | os.PathLike[str],
                 paths: Sequence[PathSpec], options: GatewayOptions | None = None) -> None:
        self._current: Peer | None = None
        self._expected: dict[int, npt.NDArray[Any]] = {}
        self._gateway = GatewayListener(_paths(paths), identity, ca, options, allocator=self._allocate)

    @property
    def rejections(self) -> asyncio.Queue[Exception]:
        """Certificate refusals (one ``CertificateError`` per refused sender)."""
        return self._gateway.rejections

    def expect(self, shard_id: int, out: npt.NDArray[Any] | bytearray | memoryview) -> None:
        """As ``Peer.expect``, for the next session, before it is accepted."""
        _expect(self._expected, shard_id, out)

    def _allocate(self, shard_id: int, size: int, meta: bytes) -> Any:
        if self._current is None:
            self._current = Peer(_PENDING, self._expected)
        return self._current._allocate(shard_id, size, meta)

    async def accept(self) -> Peer:
        """The next sender's session (the previous one must be closed first)."""
        self._gateway.release()
        self._current = None
        session = await self._gateway.accept()
        if self._current is None:
            self._current = Peer(session, self._expected)
        else:
            self._current.session = session  # datagrams arrived before accept() returned
        self._current._start_receiving()
        return self._current

    async def __aenter__(self) -> Listener:
        await self._gateway.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._gateway.close()


def _expect(table: dict[int, npt.NDArray[Any]], shard_id: int,
            out: npt.NDArray[Any] | bytearray | memoryview) -> None:
    array = out if isinstance(out, np.ndarray) else np.frombuffer(out, dtype=np.uint8)
    if not array.flags.c_contiguous or not array.flags.writeable:
        raise ValueError("expect: out must be a writable, C-contiguous buffer")
    table[shard_id] = array


_PENDING: Any = None  # a Peer created by the allocator before accept() gives it its session


def listen(identity: str | os.PathLike[str], ca: str | os.PathLike[str], paths: Sequence[PathSpec],
           options: GatewayOptions | None = None) -> Listener:
    return Listener(identity, ca, paths, options)


