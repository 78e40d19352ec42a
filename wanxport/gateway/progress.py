"""Transfer progress: a rich bar on a terminal, nothing otherwise; a goodput timeline.

The timeline (acknowledged bytes sampled every ``interval_s``) goes into the
run report, so a stall (e.g. around a key rotation) is visible afterwards.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

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


def acked_bytes(endpoint: Any) -> int:
    """Bytes the receiver has acknowledged so far, over all shards of the session."""
    return int(endpoint.session.stats().acked_bytes)


class ProgressMonitor:
    """Samples ``measure()`` until stopped; draws a bar when stderr is a terminal."""

    def __init__(self, description: str, total: int, measure: Callable[[], int],
                 origin: float, show: bool | None = None, interval_s: float = TIMELINE_INTERVAL_S
                 ) -> None:
        self.total = total
        self.origin = origin  # time.monotonic() that timeline times count from
        self.measure = measure
        self.interval_s = interval_s
        self.timeline: list[tuple[float, int]] = []
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

    def sample(self, at: float, value: int) -> None:
        self.timeline.append((at, value))
        if len(self.timeline) > MAX_TIMELINE:
            del self.timeline[1::2]
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
