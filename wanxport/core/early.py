"""DATA that arrives before its shard's SHARD_OPEN: held, bounded, until the OPEN comes.

Why: each path sends a shard's SHARD_OPEN just before its first DATA of the
shard, and a copy also goes on the shortest path (``core.transmitter``); when
the copy and a path's own OPEN are both lost, or the OPEN is merely overtaken
by DATA on a faster route, that DATA used to be dropped unacknowledged, and the
path heard nothing back until its probe timeout declared everything it had in
flight lost (docs/notes/steps.md). Holding the bytes and acknowledging them
lets the transfer go on; the OPEN, re-sent like any lost control frame,
arrives a round trip later at most, and the held bytes are placed then.

Bounded: at most ``limit`` bytes are held per session; past it, DATA of an
unknown shard is dropped unacknowledged as before (the sender re-sends it). A
held byte has been acknowledged, so it must not be lost: held data outside the
shard the OPEN then announces is a protocol violation of the peer (the session
closes, saying so).
"""

from __future__ import annotations

from wanxport.wire.frames import DataFrame

#: Bytes of early DATA a session holds at most (a few round trips of one path's tail).
HOLD_LIMIT_BYTES = 4 << 20


class EarlyData:
    """DATA frames of shards not opened yet, by shard id, with their bytes copied."""

    __slots__ = ("limit", "held", "held_bytes", "refused")

    def __init__(self, limit: int = HOLD_LIMIT_BYTES) -> None:
        self.limit = limit
        self.held: dict[int, list[DataFrame]] = {}
        self.held_bytes = 0
        self.refused = 0  # frames not held: the limit was reached

    def hold(self, frame: DataFrame) -> bool:
        """Keep ``frame`` (copying its bytes) until its shard opens; False if over the limit."""
        if self.held_bytes + frame.length > self.limit:
            self.refused += 1
            return False
        data = None if frame.data is None else bytes(frame.data)
        self.held.setdefault(frame.shard_id, []).append(
            DataFrame(frame.shard_id, frame.offset, frame.length, data))
        self.held_bytes += frame.length
        return True

    def release(self, shard_id: int) -> list[DataFrame]:
        """The shard opened: its held frames, oldest first (none if nothing was held)."""
        frames = self.held.pop(shard_id, [])
        self.held_bytes -= sum(frame.length for frame in frames)
        return frames
