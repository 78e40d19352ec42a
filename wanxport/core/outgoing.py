"""Sender's data selection: what the next chunk is, across shards and retransmissions.

Lost data goes to the front (retransmissions before new data); new data is
taken from shards in submission order, opened only as far as receive credit
allows; at the tail, chunks still in flight on slow paths are offered for
hedging on faster ones.

New data is handed to each path in *stripes*: a contiguous run of a shard that
the path sends in order. The receiver then sees a few long runs per path
instead of every path's chunks interleaved, so its received-range bookkeeping
(and the sender's acknowledged ranges) stays small at hundreds of paths. A
path's unsent stripe goes back to a spare queue that any path serves first
when the path fails or the transfer reaches its tail.
"""

from __future__ import annotations

from collections import deque

from wanxport.core.flow import SendCredit
from wanxport.core.sent_packets import Chunk
from wanxport.core.shards import OutgoingShard


class OutgoingData:
    """Shards being sent and the queue of data to re-send."""

    def __init__(self, credit: SendCredit) -> None:
        self.credit = credit
        self.shards: dict[int, OutgoingShard] = {}
        self.waiting: deque[OutgoingShard] = deque()  # submitted, not yet opened (no credit)
        self.sending: deque[OutgoingShard] = deque()  # opened, with unsent bytes
        self.retransmit: deque[Chunk] = deque()
        self.retransmit_bytes = 0
        self.stripes: dict[int, list[int]] = {}  # path id -> [shard id, next offset, end]
        self.spare: deque[Chunk] = deque()  # stripes given back, never sent yet
        self.unsent_bytes = 0  # in opened and waiting shards
        self.unfinished = 0  # shards without a SHARD_DONE yet

    def submit(self, shard: OutgoingShard) -> None:
        if shard.shard_id in self.shards:
            raise ValueError(f"shard id {shard.shard_id} is already in use in this session")
        self.shards[shard.shard_id] = shard
        self.waiting.append(shard)
        self.unsent_bytes += shard.size
        self.unfinished += 1

    def open_ready(self) -> list[OutgoingShard]:
        """Open waiting shards as far as credit allows; return the newly opened ones."""
        opened = []
        while self.waiting and self.credit.can_open(self.waiting[0].size):
            shard = self.waiting.popleft()
            self.credit.open(shard.size)
            shard.opened = True
            self.sending.append(shard)
            opened.append(shard)
        return opened

    @property
    def remaining_bytes(self) -> int:
        return self.unsent_bytes + self.retransmit_bytes

    def requeue(self, chunks: list[Chunk]) -> None:
        for shard_id, offset, length in chunks:
            shard = self.shards.get(shard_id)
            if shard is None or shard.done_status is not None:
                continue
            for start, end in shard.acked.gaps(offset, offset + length):
                self.retransmit.append((shard_id, start, end - start))
                self.retransmit_bytes += end - start

    def next_chunk(self, max_len: int, path_id: int = 0, stripe_len: int = 0
                   ) -> tuple[Chunk, bool] | None:
        """The next chunk for ``path_id`` and whether it is a retransmission.

        New data comes from the path's stripe; a new stripe is ``stripe_len`` bytes
        (0: one chunk, i.e. no striping).
        """
        while self.retransmit:
            shard_id, offset, length = self.retransmit[0]
            shard = self.shards[shard_id]
            if shard.done_status is not None or shard.acked.contains(offset, offset + length):
                self.retransmit.popleft()
                self.retransmit_bytes -= length
                continue
            # Bytes acknowledged since the requeue (a hedged copy arrived) are skipped.
            start = shard.acked.first_gap_after(offset)
            if start > offset:
                self.retransmit[0] = (shard_id, start, offset + length - start)
                self.retransmit_bytes -= start - offset
                continue
            end = offset + min(length, max_len)
            gap_end = next(iter(shard.acked.gaps(offset, end)))[1]
            take = gap_end - offset
            if take == length:
                self.retransmit.popleft()
            else:
                self.retransmit[0] = (shard_id, offset + take, length - take)
            self.retransmit_bytes -= take
            return (shard_id, offset, take), True
        chunk = self._next_new(max_len, path_id, stripe_len)
        return None if chunk is None else (chunk, False)

    def _next_new(self, max_len: int, path_id: int, stripe_len: int) -> Chunk | None:
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
        self.unsent_bytes -= take
        return shard_id, offset, take

    def _new_stripe(self, stripe_len: int) -> list[int] | None:
        if self.spare:
            shard_id, offset, length = self.spare.popleft()
            return [shard_id, offset, offset + length]
        while self.sending:
            shard = self.sending[0]
            if shard.next_offset >= shard.size:
                self.sending.popleft()
                continue
            offset = shard.next_offset
            shard.next_offset = min(shard.size, offset + stripe_len)
            return [shard.shard_id, offset, shard.next_offset]
        return None

    def release_stripe(self, path_id: int) -> bool:
        """The path stops taking new data (failed, or the tail): its unsent stripe is spare.

        Returns whether any data became spare (other paths may now take it).
        """
        stripe = self.stripes.pop(path_id, None)
        if stripe is not None and stripe[1] < stripe[2]:
            self.spare.append((stripe[0], stripe[1], stripe[2] - stripe[1]))
            return True
        return False

    def release_all_stripes(self) -> bool:
        released = False
        for path_id in list(self.stripes):
            released = self.release_stripe(path_id) or released
        return released

    def on_acked(self, chunks: list[Chunk]) -> None:
        for shard_id, offset, length in chunks:
            shard = self.shards.get(shard_id)
            if shard is not None:
                shard.acked.add(offset, offset + length)

    def is_acked(self, chunk: Chunk) -> bool:
        shard = self.shards.get(chunk[0])
        return shard is None or shard.done_status is not None or shard.acked.contains(
            chunk[1], chunk[1] + chunk[2])

    def on_done(self, shard_id: int, status: int) -> OutgoingShard | None:
        shard = self.shards.get(shard_id)
        if shard is None or shard.done_status is not None:
            return None
        shard.done_status = status
        shard.data = None  # the application's buffer is free again
        shard.acked.add(0, shard.size)
        self.unfinished -= 1
        if shard.next_offset < shard.size:
            self.unsent_bytes -= shard.size - shard.next_offset
            shard.next_offset = shard.size
        for path_id, stripe in list(self.stripes.items()):
            if stripe[0] == shard_id:
                self.unsent_bytes -= stripe[2] - stripe[1]
                del self.stripes[path_id]
        kept = [chunk for chunk in self.spare if chunk[0] != shard_id]
        self.unsent_bytes -= sum(chunk[2] for chunk in self.spare if chunk[0] == shard_id)
        self.spare = deque(kept)
        return shard
