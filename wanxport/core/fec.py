"""The sender's erasure-coded tail: which bytes to protect, how much repair, and its queue.

Why: the step waits for its last byte, and a datagram lost within the last
round trip of a transfer costs one more round trip (detection, then the
retransmission) — on a 150 ms path at 1 % loss that is 5-10 % of a 64 MiB step.
Repair symbols sent right behind the data let the receiver rebuild such a loss
from any ``k`` of ``k + m`` symbols instead (docs/notes/fec.md).

What is exposed is what is *in flight* once every byte has been handed out:
while data remains, a loss is found a round trip later and its
retransmission hides behind the rest ("a round trip is cheap", no repair);
once nothing remains, each path's outstanding data (sent within its last
round trip, wherever it sits in which shard: slow paths carry their stripes
of earlier shards late) can only be recovered by another round trip. So
``plan`` runs whenever the sender has nothing left to send or re-send, and
covers the outstanding bytes not covered before, cut into blocks on datagram
boundaries. Each block's ``m`` is the fewest symbols that keep P(more than m
of k+m lost) under a target at the loss of the paths that carry the block's
bytes, each with its own rate and burst length (a Gilbert-Elliott path loses
datagrams in runs: ``fec_code.lost_symbols_cdf``). The repair frames wait in
``pending``; the transmitter sends them before anything else.
"""

from __future__ import annotations

from collections import deque

from wanxport.core import fec_code
from wanxport.core.config import SessionConfig
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.ranges import RangeSet
from wanxport.core.scheduling.order import expected_arrival
from wanxport.core.scheduling.tail import water_fill_cutoff
from wanxport.core.shards import OutgoingShard
from wanxport.wire.frames import DATA_OVERHEAD, RepairFrame

# P(a step's tail needs a retransmission round trip anyway), split over its blocks.
FAILURE_TARGET = 0.01
MAX_REPAIR_PER_BLOCK = 48
# Repair bytes at most this share of the new data sent: the tail's cover costs at most
# 3 % of the payload on a clean run.
REPAIR_SHARE = 0.03
# A path's loss estimate before it has history: one loss in this many datagrams, as
# if observed (a prior that fades as datagrams are counted).
PRIOR_DATAGRAMS = 100
# The estimate covers the last one to two buckets of this many datagrams: recent loss,
# so BBR's start-up overshoot (a burst of queue drops) does not count at the tail.
BUCKET_DATAGRAMS = 1000


class LossEstimate:
    """A path's recent datagram loss rate and burst length, from its loss detector's counters.

    Counted are the losses the thresholds found (a probe timeout declares the
    whole flight lost, which says nothing about the datagram loss rate), less
    spurious ones, over the current and the previous bucket of
    ``BUCKET_DATAGRAMS``. A lost core packet lost the datagrams a partial
    acknowledgement did not confirm: datagrams lost ÷ packets lost is the mean
    burst (a burst of four on a 16-datagram packet is one lost packet, four
    lost datagrams: counting packets priced a bursty path at a quarter of its loss).
    """

    __slots__ = ("datagram_bytes", "mark", "previous")

    def __init__(self, datagram_bytes: int) -> None:
        self.datagram_bytes = max(1, datagram_bytes)
        self.mark = (0, 0, 0)  # (loss events, datagrams lost, datagrams sent) when the current bucket began
        self.previous = (0, 0, 0)  # the previous bucket's

    def _counts(self, path: Path) -> tuple[int, int, int]:
        loss = path.loss
        events = max(0, loss.detected_lost - loss.counters.spurious_losses)
        lost = loss.detected_lost_bytes * events // loss.detected_lost if loss.detected_lost else 0
        return events, -(-lost // self.datagram_bytes), loss.counters.bytes_sent // self.datagram_bytes

    def observe(self, path: Path) -> None:
        counts = self._counts(path)
        if counts[2] - self.mark[2] >= BUCKET_DATAGRAMS:
            self.previous = (counts[0] - self.mark[0], counts[1] - self.mark[1], counts[2] - self.mark[2])
            self.mark = counts

    def window(self, path: Path) -> tuple[int, int, int]:
        counts = self._counts(path)
        return (max(0, counts[0] - self.mark[0] + self.previous[0]),
                max(0, counts[1] - self.mark[1] + self.previous[1]),
                max(0, counts[2] - self.mark[2] + self.previous[2]))

    def rate(self, path: Path) -> float:
        _, lost, sent = self.window(path)
        return (lost + 1) / (sent + PRIOR_DATAGRAMS)

    def burst(self, path: Path) -> float:
        """Mean datagrams lost per loss event (1 without history)."""
        events, lost, _ = self.window(path)
        return max(1.0, lost / events) if events else 1.0


class FecSender:
    """Plans repair blocks over the data in flight at a transfer's end and queues their REPAIR frames."""

    def __init__(self, config: SessionConfig, paths: list[Path], outgoing: OutgoingData) -> None:
        self.enabled = config.fec == "auto"
        self.paths = paths
        self.outgoing = outgoing
        segments = [config.datagram_payload(p) for p in config.paths]
        # A symbol is one full DATA datagram's payload (of the smallest path), so a lost
        # datagram erases one symbol, not two; a REPAIR header is no larger than DATA's,
        # so its datagram fits wherever that DATA datagram does.
        self.symbol = min(segments)
        self.losses = [LossEstimate(config.packet_overhead() + DATA_OVERHEAD + s) for s in segments]
        self.repair_datagram = config.packet_overhead() + DATA_OVERHEAD + self.symbol
        self.pending: deque[RepairFrame] = deque()
        self.covered: dict[int, RangeSet] = {}  # per shard: bytes some block already covers
        self.allowance = 0.0  # repair bytes still to spend: REPAIR_SHARE of the new data sent
        self.repair_bytes = 0
        self.blocks = 0

    def plan(self) -> None:
        """Nothing is left to send or re-send: cover the bytes in flight that no block covers yet."""
        if not self.enabled:
            return
        shards = self.outgoing.shards
        for shard_id in [s for s in self.covered if s not in shards]:
            del self.covered[shard_id]  # done: its blocks are moot
        spans = self._uncovered_in_flight()
        blocks: list[tuple[OutgoingShard, int, int, list[tuple[int, float, float]]]] = []
        for shard_id, by_path in spans.items():
            shard = shards[shard_id]
            covered = self.covered.setdefault(shard_id, RangeSet())
            first = min(next(iter(ranges))[0] for ranges in by_path.values())
            last = max(ranges.last(1)[0][1] for ranges in by_path.values())
            # One span from the first uncovered byte in flight to the last: what lies between
            # runs (another path's stripe, already received) is either here or counted in a
            # path's part, so long blocks cost nothing more and price their repair better than
            # one short block per stripe would (m per symbol falls as k grows).
            for start, end in covered.gaps(first, last):
                for offset, length in fec_code.block_shapes(end - start, self.symbol):
                    parts = self._parts(by_path, start + offset, start + offset + length)
                    if parts:
                        blocks.append((shard, start + offset, length, parts))
                covered.add(start, end)
        if not blocks:
            return
        target = FAILURE_TARGET / len(blocks)
        curves = [fec_code.failure_curve(parts, MAX_REPAIR_PER_BLOCK, -(-length // self.symbol), target)
                  for _, _, length, parts in blocks]
        counts = self._within_allowance(curves, target)
        for (shard, offset, length, _), m in zip(blocks, counts, strict=True):
            if m:
                self._queue(shard, offset, length, -(-length // self.symbol), m)
        self.allowance -= sum(counts) * self.symbol

    def _within_allowance(self, curves: list[list[float]], target: float) -> list[int]:
        """Each block's m for ``target``, or for the tightest target the allowance pays for.

        A short transfer has a large share of its bytes in flight at its end
        (hetero-8path at 16 MiB: about half), and protecting all of it to the
        full target would cost more than ``REPAIR_SHARE`` of the payload; the
        target is then relaxed (bisected on a log scale) until the repair fits.
        """
        counts = [fec_code.repair_for(curve, target) for curve in curves]
        budget = max(0.0, self.allowance) / self.symbol
        if sum(counts) <= budget:
            return counts
        tight, loose = target, 1.0
        for _ in range(20):
            middle = (tight * loose) ** 0.5
            if sum(fec_code.repair_for(curve, middle) for curve in curves) > budget:
                tight = middle
            else:
                loose = middle
        return [fec_code.repair_for(curve, loose) for curve in curves]

    def _uncovered_in_flight(self) -> dict[int, dict[int, RangeSet]]:
        """Per shard and path: outstanding bytes not yet acknowledged nor covered, on symbol boundaries."""
        symbol = self.symbol
        shards = self.outgoing.shards
        spans: dict[int, dict[int, RangeSet]] = {}
        for path in self.paths:
            for _, (shard_id, offset, length) in path.loss.outstanding_chunks():
                shard = shards.get(shard_id)
                if shard is None or shard.done_status is not None:
                    continue
                if shard.acked.contains(offset, offset + length):
                    continue
                start = offset // symbol * symbol
                end = min(shard.size, -(-(offset + length) // symbol) * symbol)
                covered = self.covered.get(shard_id)
                gaps = covered.gaps(start, end) if covered is not None else [(start, end)]
                if gaps:
                    ranges = spans.setdefault(shard_id, {}).setdefault(path.path_id, RangeSet())
                    for gap_start, gap_end in gaps:
                        ranges.add(gap_start, gap_end)
        return spans

    def _parts(self, by_path: dict[int, RangeSet], start: int, end: int) -> list[tuple[int, float, float]]:
        """(symbols, loss rate, burst) of each path's share of the block ``[start, end)``."""
        parts: list[tuple[int, float, float]] = []
        for path_id, ranges in by_path.items():
            length = (end - start) - sum(b - a for a, b in ranges.gaps(start, end))
            if length > 0:
                path = self.paths[path_id]
                loss = self.losses[path_id]
                parts.append((-(-length // self.symbol), loss.rate(path), loss.burst(path)))
        return parts

    def carries_repair(self, path: Path, now: float) -> bool:
        """Whether ``path`` should take the next repair symbol now.

        Repair is useful only if it arrives with the data it covers: the pending
        symbols are water-filled over the usable paths (as the scheduler's tail
        does with data), and a path whose next datagram would arrive after they
        could all have arrived elsewhere carries none (a repair symbol on a
        150 ms path arrived after a retransmission over a 20 ms one would have).
        """
        usable = [p for p in self.paths if p.usable]
        cutoff = water_fill_cutoff(usable, now, len(self.pending) * self.repair_datagram)
        return expected_arrival(path, now) <= cutoff

    def on_new_data(self, length: int) -> None:
        """``length`` new bytes were handed out: they earn their share of repair."""
        if self.enabled:
            self.allowance += REPAIR_SHARE * length

    def observe(self, path: Path) -> None:
        """Once per fill of ``path``: roll its loss estimate's buckets (a few integer operations)."""
        if self.enabled:
            self.losses[path.path_id].observe(path)

    def _queue(self, shard: OutgoingShard, offset: int, length: int, k: int, m: int) -> None:
        symbol = self.symbol
        data = shard.data
        symbols: list[bytes] | None = None
        if data is not None:
            symbols = fec_code.encode(data[offset:offset + length], k, m, symbol)
        for j in range(m):
            self.pending.append(RepairFrame(shard.shard_id, offset // symbol, k, m, j, symbol,
                                            symbols[j] if symbols is not None else None))
        self.blocks += 1

    def next_repair(self) -> RepairFrame | None:
        """The next REPAIR frame to send, skipping those of shards already done."""
        while self.pending:
            frame = self.pending.popleft()
            shard = self.outgoing.shards.get(frame.shard_id)
            if shard is not None and shard.done_status is None:
                return frame
        return None
