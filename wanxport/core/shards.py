"""Shards: the unit of transfer (docs/design.md section 3, "Shards, not streams").

A shard has an id, a size, a digest (``core.digest``: BLAKE3) and free-form metadata (dtype,
shape, step, file name). The sender keeps a reference to the caller's buffer
(no copy); the receiver writes each DATA frame straight to its offset in a
preallocated buffer and reports the shard only after every byte is there and
the digest matches. A shard with no buffer is *virtual*: the simulator moves
terabytes that way, tracking ranges only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from wanxport.core.digest import shard_digest
from wanxport.core.ranges import RangeSet

Buffer = bytearray | memoryview


@dataclass(slots=True)
class OutgoingShard:
    """Sender-side state of one shard."""

    shard_id: int
    size: int
    data: memoryview | None
    digest: bytes | None  # None: still being hashed (opened unhashed, ``core.late_digest``)
    meta: bytes = b""
    acked: RangeSet = field(default_factory=RangeSet)
    next_offset: int = 0  # first byte never sent
    opened: bool = False  # SHARD_OPEN sent and credit consumed
    open_acked: bool = False
    done_status: int | None = None  # receiver's SHARD_DONE status
    submitted_at: float = 0.0

    @property
    def fully_acked(self) -> bool:
        return self.acked.total >= self.size

    @property
    def unsent(self) -> int:
        return self.size - self.next_offset


@dataclass(slots=True)
class IncomingShard:
    """Receiver-side state of one shard: destination buffer and received ranges."""

    shard_id: int
    size: int
    digest: bytes | None  # None: opened unhashed, its digest not in yet (``core.late_digest``)
    meta: bytes
    buffer: memoryview | None
    received: RangeSet = field(default_factory=RangeSet)
    verified: bool | None = None  # None until complete
    verifying: bool = False  # complete, its digest being checked by the driver (deferred)
    first_byte_at: float | None = None
    completed_at: float | None = None

    @property
    def complete(self) -> bool:
        return self.received.total >= self.size

    @property
    def checkable(self) -> bool:
        """Every byte is in, and the digest to check them against (a virtual shard needs none)."""
        return self.complete and (self.digest is not None or self.buffer is None)

    def place(self, offset: int, data: bytes | memoryview | None, length: int, now: float) -> int:
        """Write a chunk at its offset; return the number of new bytes (duplicates are free)."""
        end = offset + length
        if self.first_byte_at is None:
            self.first_byte_at = now
        if self.buffer is not None and data is not None:
            # Bytes already received are never written again: a driver may be hashing
            # them while the rest arrives (aio.verify), and a duplicate must not change
            # what that digest covers.
            for start, stop in self.received.gaps(offset, end):
                self.buffer[start:stop] = data[start - offset:stop - offset]
        return self.received.add(offset, end)

    @property
    def received_prefix(self) -> int:
        """End of the contiguous run of received bytes from offset 0."""
        return self.received.first_gap_after(0)

    def verify(self) -> bool:
        """Check the digest once every byte is in (virtual shards verify by coverage)."""
        if self.buffer is None:
            self.verified = self.complete
        else:
            self.verified = self.digest is not None and shard_digest(self.buffer) == self.digest
        return self.verified
