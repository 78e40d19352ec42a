"""Event loop choice: uvloop when installed (its UDP and timer paths are C), else asyncio's."""

from __future__ import annotations

import asyncio
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
