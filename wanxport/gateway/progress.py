"""Transfer progress: a rich bar on a terminal, nothing otherwise; a goodput timeline.

The timeline (acknowledged bytes sampled every ``interval_s``) goes into the
run report, so a stall (e.g. around a key rotation) is visible afterwards.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable

import numpy as np
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

TIMELINE_INTERVAL_S = 0.1
# A daemon's receiving session samples for as long as it is warm (months): past this many
# samples the timeline keeps every other one and samples half as often, so it covers
# the whole run at a resolution that halves, in bounded memory.
MAX_TIMELINE = 2048


class Timeline:
    """(time, value) samples in two arrays allocated at their bound when created.

    A list of tuples would grow (and its objects scatter over the heap) until it first
    reached the bound, which a warm session sampling ever more slowly takes hours to
    do: to an operator watching the daemon's memory that is growth. Here the memory
    is the same from the first sample on (32 KiB at the default bound).
    """

    def __init__(self, capacity: int = MAX_TIMELINE) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"timeline capacity: {capacity} is not valid; use an even number >= 2")
        self._at = np.zeros(capacity, dtype=np.float64)
        self._value = np.zeros(capacity, dtype=np.int64)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, at: float, value: int) -> bool:
        """Append a sample; True when the timeline was full and kept every other sample first."""
        thinned = self._n == len(self._at)
        if thinned:
            half = self._n // 2
            self._at[:half] = self._at[0:self._n:2]  # numpy copies overlapping ranges safely
            self._value[:half] = self._value[0:self._n:2]
            self._n = half
        self._at[self._n] = at
        self._value[self._n] = value
        self._n += 1
        return thinned

    def samples(self) -> list[tuple[float, int]]:
        """The samples, oldest first (for the run report)."""
        return list(zip(self._at[:self._n].tolist(), self._value[:self._n].tolist(), strict=True))


class ProgressMonitor:
    """Samples ``measure()`` until stopped; draws a bar when stderr is a terminal."""

    def __init__(self, description: str, total: int, measure: Callable[[], int],
                 origin: float, show: bool | None = None, interval_s: float = TIMELINE_INTERVAL_S
                 ) -> None:
        self.total = total
        self.origin = origin  # time.monotonic() that timeline times count from
        self.measure = measure
        self.interval_s = interval_s
        self._timeline = Timeline()
        self._show = sys.stderr.isatty() if show is None else show
        self._description = description
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    @property
    def timeline(self) -> list[tuple[float, int]]:
        return self._timeline.samples()

    def sample(self, at: float, value: int) -> None:
        if self._timeline.add(at, value):
            self.interval_s *= 2

    async def _run(self) -> None:
        progress = (Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                             TransferSpeedColumn(), TimeRemainingColumn(), transient=True,
                             console=None) if self._show else None)
        try:
            if progress is not None:
                progress.start()
                task = progress.add_task(self._description, total=self.total)
            while True:
                value = self.measure()
                self.sample(round(time.monotonic() - self.origin, 3), value)
                if progress is not None:
                    progress.update(task, completed=min(value, self.total))
                await asyncio.sleep(self.interval_s)
        finally:
            if progress is not None:
                progress.stop()
