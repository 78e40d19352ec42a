"""Shared helpers of the CPU accounting tests: burning a thread's CPU, in a role."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from wanxport.aio import threadcpu


def spin(seconds: float) -> None:
    """Burn this thread's CPU for ``seconds`` of its own clock."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


@contextlib.contextmanager
def busy_in_role(role: str, seconds: float) -> Iterator[None]:
    """Inside the block, a thread holding ``role`` has spent ``seconds`` of CPU and is still
    alive (its clock is read under that role); it ends when the block does."""
    done, go_on = threading.Event(), threading.Event()

    def work_then_wait() -> None:
        with threadcpu.thread_role(role):
            spin(seconds)
            done.set()
            go_on.wait(5.0)

    thread = threading.Thread(target=work_then_wait)
    thread.start()
    try:
        done.wait(5.0)
        yield
    finally:
        go_on.set()
        thread.join()
