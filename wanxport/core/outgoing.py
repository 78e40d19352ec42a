"""Sender's data: shards being sent, what is left of them, and what must be re-sent.

Lost data waits in a retransmission queue (the scheduler serves it before new
data); new data is taken from shards in submission order, opened only as far
as receive credit allows. *Which* path takes which run of new data, and what is
hedged at the tail, is scheduling policy (``wanxport.core.scheduling``): this
module only hands out runs and keeps the byte accounting.
"""

from __future__ import annotations

from collections import deque

from wanxport.core.flow import SendCredit
from wanxport.core.ranges import RangeSet
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
        self.unsent_bytes = 0  # in opened and waiting shards, not yet taken
        self.unfinished = 0  # shards without a SHARD_DONE yet
        # A done shard leaves ``shards`` (a warm session carries shards for months): only
        # its id remains (to refuse a reused one; consecutive ids merge into one range).
        self.finished = RangeSet()
        # Payload bytes the peer acknowledged over every shard submitted, done ones included
        # (``SessionStats.acked_bytes`` never goes down): kept as acknowledgements arrive, so
        # reading it (a statistics snapshot, from another thread too) sums nothing.
        self.acked_bytes = 0

    def submit(self, shard: OutgoingShard) -> None:
        if shard.shard_id in self.shards or self.finished.contains_point(shard.shard_id):
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
            if shard.done_status is not None:
                continue  # the peer finished it unopened (misbehaving): spend no credit on it
            self.credit.open(shard.size)
            shard.opened = True
            self.sending.append(shard)
            opened.append(shard)
        return opened

    @property
    def remaining_bytes(self) -> int:
        """Bytes not yet taken plus bytes to re-send (runs already taken are not counted)."""
        return self.unsent_bytes + self.retransmit_bytes

    def requeue(self, chunks: list[Chunk]) -> None:
        for shard_id, offset, length in chunks:
            shard = self.shards.get(shard_id)
            if shard is None or shard.done_status is not None:
                continue
            for start, end in shard.acked.gaps(offset, offset + length):
                self.retransmit.append((shard_id, start, end - start))
                self.retransmit_bytes += end - start

    def next_retransmission(self, max_len: int) -> Chunk | None:
        """Up to ``max_len`` bytes of lost data, skipping what has been acknowledged since."""
        while self.retransmit:
            shard_id, offset, length = self.retransmit[0]
            shard = self.shards.get(shard_id)
            if shard is None or shard.acked.contains(offset, offset + length):
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
            return shard_id, offset, take
        return None

    def take_new(self, max_len: int) -> Chunk | None:
        """The next run of up to ``max_len`` never-sent bytes of the oldest opened shard.

        The run leaves this object's accounting (``unsent_bytes``): whoever
        takes it (a path's stripe) owns it until it is sent.
        """
        while self.sending:
            shard = self.sending[0]
            if shard.next_offset >= shard.size:
                self.sending.popleft()
                continue
            offset = shard.next_offset
            shard.next_offset = min(shard.size, offset + max_len)
            self.unsent_bytes -= shard.next_offset - offset
            return shard.shard_id, offset, shard.next_offset - offset
        return None

    def on_acked(self, chunks: list[Chunk]) -> None:
        for shard_id, offset, length in chunks:
            shard = self.shards.get(shard_id)
            if shard is not None:
                self.acked_bytes += shard.acked.add(offset, offset + length)

    def on_shard_ack(self, shard: OutgoingShard, start: int, end: int) -> None:
        """The peer reports ``[start, end)`` of ``shard`` received (a SHARD_ACK), whatever path carried it."""
        self.acked_bytes += shard.acked.add(start, min(end, shard.size))

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
        self.acked_bytes += shard.acked.add(0, shard.size)
        del self.shards[shard_id]
        self.finished.add(shard_id, shard_id + 1)
        self.unfinished -= 1
        if shard.next_offset < shard.size:
            self.unsent_bytes -= shard.size - shard.next_offset
            shard.next_offset = shard.size
        return shard
