"""The receiver's erasure-coded tail: collect repair symbols, rebuild lost data, say so.

Why: a REPAIR frame lets the receiver rebuild data lost in the last round trip
instead of waiting for its retransmission (``core.fec``). A block is rebuilt
as soon as the symbols it holds (data symbols fully received, plus repair
symbols) reach ``k``; what is rebuilt is placed like received data, and the
session tells the sender with a SHARD_ACK so it does not send it again. If the
repair is not enough, nothing is lost: the sender's loss recovery re-sends
the data as it would without coding, and the block waits for it.

Bytes mode rebuilds with the native codec from the shard buffer; a virtual
shard (no buffer) only counts: k symbols held means the block is whole.
Checking a block costs one walk over its received-range gaps, done only for
blocks that hold repair symbols and only when data or repair for them arrives.
"""

from __future__ import annotations

from wanxport.core import fec_code
from wanxport.core.counters import RepairReceiveCounters
from wanxport.core.ranges import RangeSet
from wanxport.core.shards import IncomingShard
from wanxport.wire.frames import MAX_SHARD_RANGES, RepairFrame, ShardAckFrame

Buffer = bytes | bytearray | memoryview


class RepairBlock:
    """One block's shape and the repair symbols that arrived for it."""

    __slots__ = ("offset", "length", "symbol", "k", "m", "repairs", "waited")

    def __init__(self, frame: RepairFrame, length: int) -> None:
        self.offset = frame.offset
        self.length = length
        self.symbol = frame.symbol
        self.k = frame.k
        self.m = frame.m
        self.repairs: dict[int, Buffer | None] = {}
        self.waited = False  # every repair symbol is in, yet it misses more data symbols than m

    def same_shape(self, frame: RepairFrame) -> bool:
        return (frame.symbol, frame.k, frame.m) == (self.symbol, self.k, self.m)

    def missing(self, received: RangeSet) -> list[int]:
        """Indexes of the data symbols not fully received, ascending."""
        out: list[int] = []
        end = self.offset + self.length
        for start, stop in received.gaps(self.offset, end):
            first = (start - self.offset) // self.symbol
            last = (stop - 1 - self.offset) // self.symbol
            for i in range(max(first, out[-1] + 1 if out else 0), last + 1):
                out.append(i)
        return out


class FecReceiver:
    """Repair blocks of the incoming shards, by shard and block offset."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[int, RepairBlock]] = {}
        self.repaired: dict[int, RangeSet] = {}  # per shard: bytes rebuilt rather than received
        self.counters = RepairReceiveCounters()  # rebuilt and wasted bytes, blocks (core.counters)
        self.repair_received_bytes = 0
        self.rejected = 0  # REPAIR frames outside their shard or contradicting their block

    def on_repair(self, frame: RepairFrame, shard: IncomingShard, now: float) -> list[tuple[int, int]]:
        """Keep a repair symbol; return the byte ranges rebuilt (placed in ``shard``) by it."""
        length = frame.covered(shard.size)
        if not length:
            self.rejected += 1
            return []
        blocks = self.blocks.setdefault(shard.shard_id, {})
        block = blocks.get(frame.offset)
        if block is None:
            block = blocks[frame.offset] = RepairBlock(frame, length)
        elif not block.same_shape(frame):
            self.rejected += 1
            return []
        self.repair_received_bytes += frame.symbol
        block.repairs[frame.index] = None if frame.data is None else bytes(frame.data)
        return self._try(shard, block, now)

    def on_data(self, shard: IncomingShard, offset: int, length: int, new_bytes: int,
                now: float) -> list[tuple[int, int]]:
        """DATA ``[offset, offset+length)`` was placed (``new_bytes`` of it new): rebuild if now possible."""
        repaired = self.repaired.get(shard.shard_id)
        if repaired is not None and new_bytes < length:
            gaps = repaired.gaps(offset, offset + length)
            wasted = length - sum(stop - start for start, stop in gaps)
            self.counters.retransmitted_after_repair_bytes += wasted
        blocks = self.blocks.get(shard.shard_id)
        if not blocks or not new_bytes:
            return []
        rebuilt: list[tuple[int, int]] = []
        for block in list(blocks.values()):
            if block.offset < offset + length and offset < block.offset + block.length:
                rebuilt += self._try(shard, block, now)
        return rebuilt

    def forget_shard(self, shard_id: int) -> None:
        self.blocks.pop(shard_id, None)
        self.repaired.pop(shard_id, None)

    def _try(self, shard: IncomingShard, block: RepairBlock, now: float) -> list[tuple[int, int]]:
        missing = block.missing(shard.received)
        if not missing:
            del self.blocks[shard.shard_id][block.offset]  # every data symbol arrived
            return []
        if len(missing) > len(block.repairs):
            if len(block.repairs) == block.m and not block.waited:
                block.waited = True  # retransmissions must bring the rest
                self.counters.blocks_short += 1
            return []
        del self.blocks[shard.shard_id][block.offset]
        self.counters.blocks_rebuilt += 1
        end = block.offset + block.length
        ranges = [(block.offset + i * block.symbol, min(end, block.offset + (i + 1) * block.symbol))
                  for i in missing]
        symbols: list[bytes] | list[None] = [None] * len(missing)
        if shard.buffer is not None:
            repairs = {j: data for j, data in block.repairs.items() if data is not None}
            symbols = fec_code.decode(shard.buffer[block.offset:end], block.k, block.m, block.symbol,
                                      missing, repairs)
        repaired = self.repaired.setdefault(shard.shard_id, RangeSet())
        for (start, stop), symbol in zip(ranges, symbols, strict=True):
            new = shard.place(start, symbol, stop - start, now)
            self.counters.repaired_bytes += new
            repaired.add(start, stop)
        return ranges


def rebuilt_acks(shard_id: int, rebuilt: list[tuple[int, int]]) -> list[ShardAckFrame]:
    """SHARD_ACKs telling the sender which bytes were rebuilt, so it does not re-send them too."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(rebuilt):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return [ShardAckFrame(shard_id, tuple(merged[i:i + MAX_SHARD_RANGES]))
            for i in range(0, len(merged), MAX_SHARD_RANGES)]
