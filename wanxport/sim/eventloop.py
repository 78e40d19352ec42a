"""Virtual-time event loop for the simulator.

A long simulated transfer processes millions of events. ``EventLoop`` is the
native one (``ext/simloop``): events are structs in a C binary heap, ordered
by ``(time, seq)`` without tuple comparisons, and scheduling one allocates
nothing. ``ReferenceEventLoop`` is the same loop in plain Python over
``heapq``; it states the semantics, and a test runs both on random schedules
and requires identical traces. ``seq`` increases monotonically and breaks ties
between events at the same time in scheduling order, which makes every run
exactly reproducible.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

from wanxport.sim._eventloop import EventLoop

__all__ = ["EventLoop", "ReferenceEventLoop"]


class ReferenceEventLoop:
    """Discrete-event scheduler over virtual time in float seconds (pure Python).

    ``now`` only moves forward. Scheduling in the past runs the callback "now"
    (after what is already due), never earlier, so time stays monotonic.
    """

    __slots__ = ("now", "_heap", "_seq", "_cancelled", "processed")

    def __init__(self, start: float = 0.0) -> None:
        self.now = start
        self._heap: list[tuple[float, int, Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = 0
        self._cancelled: set[int] = set()
        self.processed = 0  # events run so far (for profiling and benchmarks)

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> int:
        """Run ``fn(*args)`` at virtual time ``t``; returns a handle for ``cancel``."""
        seq = self._seq
        self._seq = seq + 1
        heapq.heappush(self._heap, (t if t > self.now else self.now, seq, fn, args))
        return seq

    def call_later(self, delay: float, fn: Callable[..., Any], *args: Any) -> int:
        """Run ``fn(*args)`` ``delay`` seconds from now."""
        return self.call_at(self.now + delay, fn, *args)

    def cancel(self, handle: int) -> None:
        """Skip a pending callback. Cancel only handles that have not run yet."""
        self._cancelled.add(handle)

    def next_time(self) -> float | None:
        """Time of the earliest pending event (cancelled ones included), or None."""
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)

    def run_until(self, t: float) -> None:
        """Run every event due at or before ``t``, then set ``now = t``."""
        self._run(t, None)
        if t > self.now and not math.isinf(t):
            self.now = t

    def run(self, stop: Callable[[], bool] | None = None, until: float = math.inf) -> None:
        """Run events until none are left, ``stop()`` is true after an event, or ``until``."""
        self._run(until, stop)

    def _run(self, until: float, stop: Callable[[], bool] | None) -> None:
        heap = self._heap
        pop = heapq.heappop
        cancelled = self._cancelled
        count = 0
        try:
            while heap:
                if heap[0][0] > until:
                    break
                t, seq, fn, args = pop(heap)
                if cancelled and seq in cancelled:
                    cancelled.discard(seq)
                    continue
                self.now = t
                count += 1
                fn(*args)
                if stop is not None and stop():
                    break
        finally:
            self.processed += count
