"""The sender's erasure-coded tail: which bytes to protect, how much repair, and its queue.

Why: the step waits for its last byte, and a datagram lost within the last
round trip of a transfer costs one more round trip (detection, then the
retransmission) — on a 150 ms path at 1 % loss that is 5-10 % of a 64 MiB step.
Repair symbols sent right behind the data let the receiver rebuild such a loss
from any ``k`` of ``k + m`` symbols instead (docs/notes/fec.md).

When a shard's last new byte goes out, ``plan`` looks at each usable path:
data that path sent in its last round trip is exposed only if the rest of the
transfer (what is still unsent, at the paths' rates) takes less than that
round trip; otherwise a retransmission is hidden behind the remaining data and
repair would be waste (m = 0: "a round trip is cheap"). The exposed bytes of
all paths, taken from the end of the shard, are cut into blocks; each block's
``m`` is the fewest symbols that keep P(more than m of k+m lost) under a
target at the exposed paths' measured loss. The repair frames wait in
``pending`` and the transmitter sends them before anything else.
"""

from __future__ import annotations

from collections import deque

from wanxport.core import fec_code
from wanxport.core.config import SessionConfig
from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.shards import OutgoingShard
from wanxport.wire.frames import DATA_OVERHEAD, RepairFrame

# P(a step's tail needs a retransmission round trip anyway), split over its blocks.
FAILURE_TARGET = 0.01
MAX_REPAIR_PER_BLOCK = 48
# A path's loss estimate before it has history: one loss in this many datagrams, as
# if observed (a prior that fades as datagrams are counted).
PRIOR_DATAGRAMS = 100
# The estimate covers the last one to two buckets of this many datagrams: recent loss,
# so BBR's start-up overshoot (a burst of queue drops) does not count at the tail.
BUCKET_DATAGRAMS = 1000


class LossEstimate:
    """A path's recent datagram loss rate, from its loss detector's counters.

    Declared losses less spurious ones, per datagram sent (a lost core packet
    almost always lost one of its datagrams), over the current and the previous
    bucket of ``BUCKET_DATAGRAMS``.
    """

    __slots__ = ("datagram_bytes", "mark", "previous")

    def __init__(self, datagram_bytes: int) -> None:
        self.datagram_bytes = max(1, datagram_bytes)
        self.mark = (0, 0)  # (lost, datagrams) when the current bucket began
        self.previous = (0, 0)  # the previous bucket's (lost, datagrams)

    def _counts(self, path: Path) -> tuple[int, int]:
        loss = path.loss
        return max(0, loss.packets_lost - loss.spurious_losses), loss.bytes_sent // self.datagram_bytes

    def observe(self, path: Path) -> None:
        lost, sent = self._counts(path)
        if sent - self.mark[1] >= BUCKET_DATAGRAMS:
            self.previous = (lost - self.mark[0], sent - self.mark[1])
            self.mark = (lost, sent)

    def rate(self, path: Path) -> float:
        lost, sent = self._counts(path)
        lost += self.previous[0] - self.mark[0]
        sent += self.previous[1] - self.mark[1]
        return (max(0, lost) + 1) / (max(0, sent) + PRIOR_DATAGRAMS)


class FecSender:
    """Plans repair blocks at shard ends and queues their REPAIR frames."""

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
        self.pending: deque[RepairFrame] = deque()
        self.repair_bytes = 0
        self.blocks = 0

    def plan(self, shard: OutgoingShard, remaining_bytes: int) -> None:
        """``shard``'s last new byte was handed out; ``remaining_bytes`` of the transfer remain."""
        if not self.enabled:
            return
        usable = [p for p in self.paths if p.usable and p.rtt.has_sample]
        # The measured delivery rate, not the pacing rate: a start-up's or a probe's pacing
        # gain runs well above what the path delivers, and would stretch the window.
        rates = [min(p.bandwidth_bps or p.cc.pacing_rate_bps, p.cc.pacing_rate_bps) / 8 for p in usable]
        total_rate = sum(rates)
        if total_rate <= 0:
            return
        rest_s = remaining_bytes / total_rate
        exposed = 0.0
        weighted_loss = 0.0
        for path, rate in zip(usable, rates, strict=True):
            window = rate * max(0.0, path.rtt.smoothed_s - rest_s)
            exposed += window
            weighted_loss += window * self.losses[path.path_id].rate(path)
        symbol = self.symbol
        covered = min(shard.size, int(exposed))
        if covered <= 0:
            return
        loss = weighted_loss / exposed
        start = (shard.size - covered) // symbol * symbol  # on the datagrams' boundaries
        covered = shard.size - start
        shapes = fec_code.block_shapes(covered, self.symbol)
        target = FAILURE_TARGET / len(shapes)
        for offset, length in shapes:
            k = -(-length // self.symbol)
            m = fec_code.repair_count(k, loss, target, MAX_REPAIR_PER_BLOCK)
            if m:
                self._queue(shard, start + offset, length, k, m)

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
