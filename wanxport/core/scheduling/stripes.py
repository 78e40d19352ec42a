"""Stripes: new data goes to each path in contiguous runs.

A *stripe* is a run of one shard that one path sends in order. The receiver
then sees a few long runs per path instead of every path's chunks interleaved,
so its received-range bookkeeping (and the sender's acknowledged ranges) stays
small at hundreds of paths. A stripe belongs to its path until the path gives
it back (it failed, or the scheduler holds it back at the tail); the unsent
rest goes to a spare queue that every path serves before taking a new stripe.
"""

from __future__ import annotations

from collections import deque

from wanxport.core.outgoing import OutgoingData
from wanxport.core.sent_packets import Chunk


class Stripes:
    """Per-path stripes of new data over one ``OutgoingData``."""

    def __init__(self, outgoing: OutgoingData) -> None:
        self.outgoing = outgoing
        self.stripes: dict[int, list[int]] = {}  # path id -> [shard id, next offset, end]
        self.spare: deque[Chunk] = deque()  # stripes given back, never sent yet
        # Bytes taken from the shards into stripes or the spare queue and not yet sent:
        # still to send, so they count in the scheduler's remaining bytes.
        self.reserved_bytes = 0

    def next_chunk(self, path_id: int, max_len: int, stripe_len: int) -> Chunk | None:
        """Up to ``max_len`` new bytes for ``path_id``, from its stripe.

        A path whose stripe is used up takes a spare one, else a new one of
        ``stripe_len`` bytes (at least one chunk: 0 means no striping).
        """
        stripe = self.stripes.get(path_id)
        if stripe is None or stripe[1] >= stripe[2]:
            stripe = self._new_stripe(max(stripe_len, max_len))
            if stripe is None:
                self.stripes.pop(path_id, None)
                return None
            self.stripes[path_id] = stripe
        shard_id, offset, end = stripe
        take = min(max_len, end - offset)
        stripe[1] = offset + take
        self.reserved_bytes -= take
        return shard_id, offset, take

    def _new_stripe(self, stripe_len: int) -> list[int] | None:
        if self.spare:
            shard_id, offset, length = self.spare.popleft()
            return [shard_id, offset, offset + length]
        run = self.outgoing.take_new(stripe_len)
        if run is None:
            return None
        shard_id, offset, length = run
        self.reserved_bytes += length
        return [shard_id, offset, offset + length]

    def release(self, path_id: int) -> bool:
        """The path stops taking new data: its unsent stripe becomes spare.

        Returns whether any data became spare (other paths may now take it).
        """
        stripe = self.stripes.pop(path_id, None)
        if stripe is not None and stripe[1] < stripe[2]:
            self.spare.append((stripe[0], stripe[1], stripe[2] - stripe[1]))
            return True
        return False

    def release_all(self) -> bool:
        released = False
        for path_id in list(self.stripes):
            released = self.release(path_id) or released
        return released

    def forget_shard(self, shard_id: int) -> None:
        """The shard is done (the receiver said so): its unsent runs will never be sent."""
        for path_id, stripe in list(self.stripes.items()):
            if stripe[0] == shard_id:
                self.reserved_bytes -= stripe[2] - stripe[1]
                del self.stripes[path_id]
        kept = [chunk for chunk in self.spare if chunk[0] != shard_id]
        self.reserved_bytes -= sum(chunk[2] for chunk in self.spare if chunk[0] == shard_id)
        self.spare = deque(kept)
