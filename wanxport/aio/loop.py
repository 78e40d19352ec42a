"""Event loop choice: uvloop when installed (its UDP and timer paths are C), else asyncio's;
and how to arm its timers so they fire on time."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from wanxport.aio.threadcpu import thread_role

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when available; the calling thread counts as the ``loop``
    role (``aio.threadcpu``) while it runs."""
    with thread_role("loop"), asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def timer_delay_s(remaining_s: float) -> float:
    """The delay to arm a timer with so that it fires at, not before, ``remaining_s`` from now.

    uvloop counts timers in whole milliseconds and rounds: below 0.5 ms a timer
    runs on the next loop iteration, i.e. early. Each early run found nothing
    due and re-armed for the same deadline, so a paced sender spun through
    ~8,000 empty timer runs a second. Rounding up to the millisecond fires at
    most 1 ms late, well inside the pacing horizon that hands packets out ahead.
    """
    if remaining_s <= 0.0:
        return 0.0
    return math.ceil(remaining_s * 1000.0) / 1000.0
