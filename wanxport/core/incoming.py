"""Receiver's shards: open within the memory budget, place chunks, verify, release."""

from __future__ import annotations

from collections.abc import Callable

from wanxport.core.flow import ReceiveBudget
from wanxport.core.ranges import RangeSet
from wanxport.core.shards import IncomingShard
from wanxport.wire.frames import STATUS_INTEGRITY_FAILURE, STATUS_VERIFIED, ShardOpenFrame

Allocator = Callable[[int, int, bytes], memoryview | None]


def allocate_bytearray(shard_id: int, size: int, meta: bytes) -> memoryview | None:
    """Default allocator: a fresh zeroed buffer per shard."""
    return memoryview(bytearray(size))


class IncomingData:
    """Shards the peer has opened towards us."""

    def __init__(self, budget: ReceiveBudget, allocator: Allocator) -> None:
        self.budget = budget
        self.allocator = allocator
        self.shards: dict[int, IncomingShard] = {}
        self.finished = RangeSet()  # ids of shards already verified and handed over
        self.protocol_errors = 0
        self.refusal = ""  # why the last opening was refused
        self.placed_total = 0  # new payload bytes ever placed (``Reception.place``): arrival rates

    def open(self, frame: ShardOpenFrame) -> bool:
        """Allocate a destination for a newly announced shard; False if refused (``refusal`` says why).

        A refusal is a protocol violation: a sender within its credit never opens
        beyond it, and never re-opens a shard with another size or digest.
        """
        existing = self.shards.get(frame.shard_id)
        if existing is not None or self.finished.contains_point(frame.shard_id):
            digests = (existing.digest, frame.digest) if existing is not None else (None, None)
            if existing is not None and (existing.size != frame.size
                                         or None not in digests and digests[0] != digests[1]):
                self.protocol_errors += 1
                self.refusal = (f"shard {frame.shard_id} re-opened as {frame.size} bytes with another "
                                f"digest (opened as {existing.size} bytes)")
                return False
            return True  # a copy without the digest, or with it: SHARD_DIGEST gives it either way
        if not self.budget.try_open(frame.size):
            self.protocol_errors += 1
            self.refusal = (f"shard {frame.shard_id} of {frame.size} bytes exceeds the receive credit "
                            f"({self.budget.limit} bytes granted, {self.budget.opened} open)")
            return False
        buffer = self.allocator(frame.shard_id, frame.size, frame.meta)
        if buffer is not None and len(buffer) != frame.size:
            raise ValueError(f"allocator returned {len(buffer)} bytes for a {frame.size}-byte shard")
        self.shards[frame.shard_id] = IncomingShard(frame.shard_id, frame.size, frame.digest, frame.meta,
                                                    buffer)
        return True

    def placed_bytes(self) -> int:
        """Payload bytes placed in the shards still open (safe from another thread)."""
        return sum(shard.received.total for shard in list(self.shards.values()))

    def missing_bytes(self, limit: int) -> int:
        """Bytes the open shards still lack, summed until the sum reaches ``limit`` (what lies
        past it is not needed, so the work stays bounded however many shards are open)."""
        missing = 0
        for shard in self.shards.values():
            missing += shard.size - shard.received.total
            if missing >= limit:
                break
        return missing

    def accepts(self, shard_id: int, offset: int, length: int) -> bool | None:
        """True: place it; None: a finished shard (ack, discard); False: unknown or out of bounds."""
        shard = self.shards.get(shard_id)
        if shard is None:
            return None if self.finished.contains_point(shard_id) else False
        return offset + length <= shard.size

    def finish(self, shard: IncomingShard, now: float) -> int:
        """Verify a complete shard and release its budget; return the SHARD_DONE status."""
        return self.release(shard, shard.verify(), now)

    def release(self, shard: IncomingShard, ok: bool, now: float) -> int:
        """Hand over a checked shard (``ok``: its digest matched); return the SHARD_DONE status."""
        shard.verified = ok
        shard.completed_at = now
        del self.shards[shard.shard_id]
        self.finished.add(shard.shard_id, shard.shard_id + 1)
        self.budget.release(shard.size)
        return STATUS_VERIFIED if ok else STATUS_INTEGRITY_FAILURE
