"""Hedging: at the very end, send a second copy of data a slower path still carries.

Once every byte has been sent at least once, a path with room would otherwise
idle while the last chunks are still on their way over slow (or lossy) paths.
It takes instead the outstanding chunk expected to arrive *latest*, if it would
deliver that chunk sooner itself; whichever copy arrives first completes it.
Each chunk is hedged at most once while its shard is unfinished; a finished shard's
entries are forgotten (a warm session hedges the tail of every transfer for months).
"""

from __future__ import annotations

from collections.abc import Iterator

from wanxport.core.outgoing import OutgoingData
from wanxport.core.paths import Path
from wanxport.core.scheduling.order import expected_arrival
from wanxport.core.sent_packets import Chunk

# The queue of candidates is rebuilt at most this often (and half a min RTT of the
# asking path): walking every path's outstanding packets is the costly part.
MIN_REBUILD_S = 0.002


def outstanding_chunks(paths: list[Path]) -> Iterator[tuple[float, Chunk, int]]:
    """(expected arrival, chunk, path id) of every chunk in flight on any path."""
    for path in paths:
        for sent_at, chunk in path.loss.outstanding_chunks():
            yield sent_at + path.one_way_s, chunk, path.path_id


class Hedger:
    """Picks which outstanding chunk a path with room should carry a second copy of."""

    def __init__(self) -> None:
        self.hedged: set[tuple[int, int]] = set()  # (shard id, offset) of chunks hedged, live shards
        self._queue: list[tuple[float, Chunk, int]] = []  # latest expected arrival last
        self._built_at = -1.0

    def next_chunk(self, path: Path, now: float, paths: list[Path], outgoing: OutgoingData) -> Chunk | None:
        """A chunk in flight on another path that ``path`` would deliver sooner, or None."""
        if now - self._built_at > max(MIN_REBUILD_S, path.rtt.min_s / 2):
            self._rebuild(now, paths)
        arrival = expected_arrival(path, now)
        while self._queue:
            eta, chunk, owner = self._queue[-1]
            if owner == path.path_id or outgoing.is_acked(chunk):
                self._queue.pop()
                continue
            if eta <= arrival:
                return None  # the latest remaining chunk is already due sooner elsewhere
            self._queue.pop()
            self.hedged.add((chunk[0], chunk[1]))
            return chunk
        return None

    def forget_shard(self, shard_id: int) -> None:
        """The shard is done: none of its chunks will be a candidate again."""
        if self.hedged:
            self.hedged = {hedged for hedged in self.hedged if hedged[0] != shard_id}

    def _rebuild(self, now: float, paths: list[Path]) -> None:
        """Outstanding chunks ordered so the one expected latest is hedged first."""
        items = [item for item in outstanding_chunks(paths) if (item[1][0], item[1][1]) not in self.hedged]
        items.sort(key=lambda item: item[0])
        self._queue = items
        self._built_at = now
