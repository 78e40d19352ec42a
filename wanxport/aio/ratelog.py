"""At most one log line per key per interval, with a count of what it held back.

A path that flaps (a lossy link crossing the probe timeout again and again) changes
state many times a minute; a line for each change buried a daemon's log (890 lines in
12 minutes on one path). This logger lets the first change of a key through, holds
the next ones for ``interval_s``, and then writes one line: the latest change with
how many were held back, so the log still ends on the path's current state. The
clock and the scheduler are injected (tests drive them; the endpoint gives its event
loop's).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

Schedule = Callable[[float, Callable[[], None]], Any]  # (delay_s, callback): call it later


class RateLimitedLog:
    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, *,
                 clock: Callable[[], float] = time.monotonic, schedule: Schedule | None = None) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self.schedule = schedule
        self._last: dict[str, float] = {}  # key -> when its latest line was written
        self._held: dict[str, tuple[int, str, tuple[Any, ...], int]] = {}  # key -> (level, msg, args, count)

    def log(self, key: str, level: int, msg: str, *args: Any) -> None:
        now = self.clock()
        last = self._last.get(key)
        if last is None or now - last >= self.interval_s:
            held = self._held.pop(key, None)
            self._write(key, level, msg, args, held[3] if held else 0, now)
            return
        count = self._held[key][3] + 1 if key in self._held else 1
        if key not in self._held and self.schedule is not None:
            self.schedule(last + self.interval_s - now, lambda: self.flush(key))
        self._held[key] = (level, msg, args, count)

    def flush(self, key: str) -> None:
        """Write the latest held line of ``key`` now (its interval has passed)."""
        held = self._held.pop(key, None)
        if held is not None:
            level, msg, args, count = held
            self._write(key, level, msg, args, count - 1, self.clock())

    def flush_all(self) -> None:
        for key in list(self._held):
            self.flush(key)

    def _write(self, key: str, level: int, msg: str, args: tuple[Any, ...], suppressed: int,
               now: float) -> None:
        self._last[key] = now
        if suppressed:
            msg += f" ({suppressed} more changes in the last {self.interval_s:.0f} s not logged)"
        self.logger.log(level, msg, *args)
