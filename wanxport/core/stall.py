"""Stall detection for incoming data, as a session deadline.

A sender that opens shards and then stops sending (while the rest of the
connection stays alive) would hold the receiver's budget, and whatever waits
for the shards, for ever. Progress is any new byte of any shard, a shard
opened or one handed over, so shards waiting their turn behind others do not
count as stalled. The clock is the session's deadline, not a driver's poll, so
the simulator runs the same detection the gateway does.
"""

from __future__ import annotations

from wanxport.core.deadlines import DeadlineHeap
from wanxport.core.events import Event, ReceiveStalled
from wanxport.core.incoming import IncomingData


class StallWatch:
    """Arms one key of the session's deadline heap while a timeout is set; lazily re-armed:
    progress only records its time, the deadline moves when it fires early."""

    __slots__ = ("timeout_s", "_deadlines", "_key", "_events", "_progress_at", "_armed")

    def __init__(self, deadlines: DeadlineHeap, key: int, events: list[Event]) -> None:
        """``key``: this watch's in ``deadlines``; a stall is appended to ``events``."""
        self.timeout_s: float | None = None
        self._deadlines = deadlines
        self._key = key
        self._events = events
        self._progress_at = 0.0
        self._armed = False

    def watch(self, timeout_s: float | None, now: float) -> None:
        """Report a stall after ``timeout_s`` without progress (None: never), counted from now."""
        if timeout_s is not None and not timeout_s > 0.0:
            raise ValueError(f"a stall timeout must be > 0 s (or None), got {timeout_s!r}")
        self.timeout_s = timeout_s
        self._armed = False
        self._deadlines.set(self._key, float("inf"))
        self.progress(now)

    def progress(self, now: float) -> None:
        if self.timeout_s is None:
            return
        self._progress_at = now
        if not self._armed:
            self._armed = True
            self._deadlines.set(self._key, now + self.timeout_s)

    def fire(self, now: float, incoming: IncomingData) -> None:
        """The key fell due: a stall, when shards are open and nothing moved for the timeout."""
        self._armed = False
        timeout = self.timeout_s
        if timeout is None:
            return
        due = self._progress_at + timeout
        if now < due:  # progress since it was armed: wait for the rest
            self._armed = True
            self._deadlines.set(self._key, due)
            return
        waiting = [shard for shard in incoming.shards.values() if not shard.complete]
        if not waiting:
            return  # nothing owed; the next shard opened arms it again
        first = min(waiting, key=lambda shard: shard.shard_id)
        self._events.append(ReceiveStalled(len(waiting), first.shard_id, first.received.total, first.size,
                                           timeout, now))
