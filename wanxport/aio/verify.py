"""Shard digests computed while the shard arrives, so its verdict follows its last byte.

Hashing a whole shard once it is complete puts the hash on the critical path:
SHA-256 ran at ~1.4 GB/s here, so a 64 MiB shard waited ~50 ms after its
last byte (longer on a busy host) before the application could have it, and a
training step waits for the last shard. A ``ShardHasher`` instead advances the
digest over the shard's received prefix in a worker thread as it grows; when
the shard fills, only the part not yet hashed remains.

Safety rests on the data paths: the hasher only reads a prefix the session
has received in full, and received bytes are never written again (the core's
``IncomingShard.place`` writes only the gaps; the native receiver is told the
prefix with ``Receiver.freeze``). So the verdict covers exactly the bytes the
buffer keeps: a duplicate with other contents, from a sender whose buffer
changed mid-transfer, cannot slip in after the hash.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from wanxport.aio.threadcpu import hashing
from wanxport.core.digest import new_hasher

Allocator = Callable[[int, int, bytes], Any]  # (shard_id, size, meta) -> writable buffer of `size` bytes

#: Hash in steps of at least this many new prefix bytes: a worker job costs
#: ~50 us of scheduling, small against the ~3 ms it takes to hash 4 MiB.
HASH_STEP_BYTES = 4 << 20
#: A shard this small, with no job started, is hashed on the loop once full: ~0.1 ms of BLAKE3,
#: where the hop to a worker thread and back cost a 64 KiB message 0.1-0.2 ms on loopback
#: (more on a loaded host) between its last byte and its verdict.
INLINE_HASH_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class ReceivedShard:
    """A shard that arrived; ``ok`` is False when its digest did not match."""

    shard_id: int
    data: memoryview
    meta: bytes
    ok: bool
    at: float
    digest: bytes | None = None  # what it was checked against (the sender's digest)


class ShardHasher:
    """The digest (``core.digest``) of one shard buffer, advanced over frozen prefixes in a worker thread.

    At most one hashing job runs at a time, so the digest sees the bytes in order.
    """

    def __init__(self, buffer: memoryview, loop: asyncio.AbstractEventLoop,
                 freeze: Callable[[int], None] | None = None) -> None:
        """``freeze(upto)`` makes sure no data path writes below ``upto`` again (the
        native receiver's ``freeze``); None when received bytes are never rewritten anyway."""
        self._buffer = buffer
        self._loop = loop
        self._freeze = freeze
        self._hasher = new_hasher()
        self.hashed = 0  # bytes folded into the digest (or being folded by the running job)
        self._job: asyncio.Future[None] | None = None

    def advance(self, prefix: int) -> None:
        """Hash up to ``prefix`` (bytes from 0 all received) if it has grown by a step
        and no job is running; the data path is frozen there first."""
        if prefix - self.hashed < HASH_STEP_BYTES or (self._job is not None and not self._job.done()):
            return
        if self._freeze is not None:
            self._freeze(prefix)
        part = self._buffer[self.hashed:prefix]
        self.hashed = prefix
        self._job = self._loop.run_in_executor(None, self._update, part)

    def finish_inline(self) -> bytes | None:
        """The digest of the whole buffer, hashed now, when nothing was hashed in the
        background and the buffer is small (``INLINE_HASH_BYTES``); else None (``finish``)."""
        if self._job is not None or len(self._buffer) - self.hashed > INLINE_HASH_BYTES:
            return None
        self._hasher.update(self._buffer[self.hashed:])
        self.hashed = len(self._buffer)
        return self._hasher.digest()

    async def finish(self) -> bytes:
        """The digest of the whole buffer, once no more bytes will be written to it."""
        if self._job is not None:
            await self._job
        rest = self._buffer[self.hashed:]
        self.hashed = len(self._buffer)
        if len(rest):
            await self._loop.run_in_executor(None, self._update, rest)
        return self._hasher.digest()

    def _update(self, part: memoryview) -> None:
        """Fold ``part`` in (in a worker thread), its CPU counted as ``digest`` (``aio.threadcpu``)."""
        with hashing():
            self._hasher.update(part)


class ShardVerifier:
    """The receiving shards' buffers and digests: allocated as shards open, advanced as data
    arrives, checked off the loop once full, handed over once verified.

    ``datapath`` is where the native receiver places data (``add_shard``/``freeze``/
    ``remove_shard``); ``on_verdict(shard_id, ok)`` is called on the loop with each check's result.
    """

    def __init__(self, datapath: Any, user_allocator: Allocator | None,
                 on_verdict: Callable[[int, bool], None]) -> None:
        self._datapath = datapath
        self._user_allocator = user_allocator
        self._on_verdict = on_verdict
        self._buffers: dict[int, memoryview] = {}
        self._hashers: dict[int, ShardHasher] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # set when the endpoint starts

    @property
    def open_shards(self) -> Iterable[int]:
        return self._hashers.keys()

    def allocate(self, shard_id: int, size: int, meta: bytes) -> memoryview:
        # np.empty, not bytearray(size): zero-filling a large shard would stall the
        # loop (and overflow the sockets) for tens of milliseconds; the pages are
        # faulted in by the native placement instead, without the GIL.
        buffer: Any = (self._user_allocator(shard_id, size, meta) if self._user_allocator
                       else np.empty(size, dtype=np.uint8))
        view = memoryview(buffer).cast("B")
        self._datapath.add_shard(shard_id, view)
        freeze = functools.partial(self._datapath.freeze, shard_id)
        self._buffers[shard_id] = view
        assert self.loop is not None  # shards open only while the endpoint runs
        self._hashers[shard_id] = ShardHasher(view, self.loop, freeze)
        return view

    def advance(self, grown: Iterable[int], received_prefix: Callable[[int], int]) -> None:
        """Advance the digests of the shards that received data.

        Only those: asking every open shard for its prefix after every drain was
        ~8 calls per wake-up for nothing. A shard whose hashing job was still running
        catches up at its next data or, at the latest, in ``ShardHasher.finish``.
        """
        hashers = self._hashers
        for shard_id in grown:
            hasher = hashers.get(shard_id)
            if hasher is not None:
                hasher.advance(received_prefix(shard_id))

    def filled(self, shard_id: int, digest: bytes) -> None:
        """Every byte is in: no more writes, hash the rest, then give the verdict."""
        self._datapath.remove_shard(shard_id)
        hasher = self._hashers.pop(shard_id)
        whole = hasher.finish_inline()
        if whole is not None:
            assert self.loop is not None
            # Not called from here: the session is handing out its events.
            self.loop.call_soon(self._on_verdict, shard_id, whole == digest)
            return
        check = asyncio.ensure_future(hasher.finish())
        check.add_done_callback(functools.partial(self._checked, shard_id, digest))

    def _checked(self, shard_id: int, digest: bytes, check: asyncio.Future[bytes]) -> None:
        ok = not check.cancelled() and check.exception() is None and check.result() == digest
        self._on_verdict(shard_id, ok)

    def take(self, shard_id: int) -> memoryview:
        """The buffer of a shard the session handed over."""
        return self._buffers.pop(shard_id)
