"""A call's bookkeeping: its handle, its figures, and the sequence numbers of a channel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from .message import Call
from .schedule import Plan


@dataclass(frozen=True)
class CallStats:
    """One collective as this site saw it: from its call to its result, on the monotonic clock."""

    seq: int
    op: str
    count: int
    compress: str | None
    started_s: float
    elapsed_s: float
    sent_bytes: int  # collective bytes this site sent for it (headers included), all peers
    received_bytes: int
    ok: bool
    schedule: str = "direct"  # the all-reduce's schedule (``schedule.SCHEDULES``) ...
    predicted_s: float | None = None  # ... its predicted time (None: chosen before any measurement) ...
    plan: Plan | None = None  # ... and its trees (None with two sites: one exchange each way)


@dataclass
class Tally:
    sent: int = 0
    received: int = 0
    schedule: str = "direct"
    predicted_s: float | None = None
    plan: Plan | None = None


class Handle:
    """A collective in flight: ``await handle`` (or ``await handle.wait()``) for its result."""

    def __init__(self, call: Call, work: Coroutine[Any, Any, Any]) -> None:
        self.call = call
        self._started = time.monotonic()
        self._elapsed: float | None = None
        self._task = asyncio.ensure_future(self._timed(work))

    async def _timed(self, work: Coroutine[Any, Any, Any]) -> Any:
        try:
            return await work
        finally:
            self._elapsed = time.monotonic() - self._started

    @property
    def seq(self) -> int:
        return self.call.seq

    @property
    def elapsed_s(self) -> float | None:
        """Seconds from the call to the result (None while it runs)."""
        return self._elapsed

    def done(self) -> bool:
        return self._task.done()

    @property
    def future(self) -> asyncio.Future[Any]:
        """The call's task: a thread waiting on it hooks its own callback here directly."""
        return self._task

    @staticmethod
    def after_result(then: Callable[[], None]) -> None:
        """Run ``then`` once the running call's result (or error) has reached whoever waits
        for it: the callbacks they registered on the call run first, and ``then`` does not
        delay them (a point-to-point receive's answer to the sender, say)."""
        task = asyncio.current_task()
        assert task is not None
        task.add_done_callback(lambda _: then())

    async def wait(self) -> Any:
        return await self._task

    def __await__(self) -> Any:
        return self._task.__await__()


class CallSequence:
    """One sequence of calls: the next number to take, and which numbers are over here."""

    def __init__(self) -> None:
        self.next = 0
        self.low = 0  # every number below this is over
        self.finished: set[int] = set()

    def take(self) -> int:
        self.next += 1
        return self.next - 1

    def over(self, seq: int) -> None:
        self.finished.add(seq)
        while self.low in self.finished:
            self.finished.discard(self.low)
            self.low += 1

    def is_over(self, seq: int) -> bool:
        return seq < self.low or seq in self.finished
