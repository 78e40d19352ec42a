"""The native event loop against the pure-Python reference, and the timer heap.

Both loops are driven by the same seeded random program (events that schedule
more events, at the same time, in the past, with many arguments; cancels;
``run_until``; ``stop``) and must produce the same trace of (time, label).
"""

from __future__ import annotations

import gc
import math
import random
import weakref
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.deadlines import DeadlineHeap
from wanxport.sim.eventloop import EventLoop, ReferenceEventLoop


def _program(loop: Any, seed: int) -> list[tuple[float, object]]:
    """Run a random self-scheduling workload on ``loop``; return what ran, when."""
    rng = random.Random(seed)
    trace: list[tuple[float, object]] = []
    handles: list[int] = []

    def event(label: int, *extra: int) -> None:
        trace.append((loop.now, (label, extra)))
        for _ in range(rng.randrange(3)):
            child = rng.randrange(1_000_000)
            choice = rng.random()
            if choice < 0.2:
                t = loop.now  # a tie with whatever else is due now
            elif choice < 0.3:
                t = loop.now - rng.random()  # in the past: runs now, after what is due
            else:
                t = loop.now + rng.choice([0.5, 0.25, rng.random()])
            args = tuple(rng.randrange(10) for _ in range(rng.randrange(7)))
            handles.append(loop.call_at(t, event, child, *args))
        if handles and rng.random() < 0.1:
            loop.cancel(handles.pop(rng.randrange(len(handles))))

    for i in range(20):
        loop.call_later(rng.random(), event, -i)
    loop.run_until(1.5)
    trace.append((loop.now, "run_until"))
    budget = [rng.randrange(50, 300)]

    def stop() -> bool:
        budget[0] -= 1
        return budget[0] <= 0

    loop.run(stop=stop, until=8.0)
    trace.append((loop.now, ("stopped", len(loop), loop.next_time())))
    loop.run(until=12.0)
    trace.append((loop.now, ("end", len(loop), loop.processed)))
    return trace


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_native_loop_matches_reference(seed: int) -> None:
    assert _program(EventLoop(), seed) == _program(ReferenceEventLoop(), seed)


def test_ties_run_in_scheduling_order_and_the_past_runs_now() -> None:
    loop = EventLoop(start=5.0)
    seen: list[tuple[float, str]] = []
    loop.call_at(6.0, lambda: seen.append((loop.now, "b")))
    loop.call_at(6.0, lambda: seen.append((loop.now, "c")))
    loop.call_at(1.0, lambda: seen.append((loop.now, "a")))
    loop.run()
    assert seen == [(5.0, "a"), (6.0, "b"), (6.0, "c")]
    loop.run_until(9.0)
    assert loop.now == 9.0
    loop.run_until(math.inf)
    assert loop.now == 9.0


def test_callback_errors_propagate_and_leave_the_loop_usable() -> None:
    loop = EventLoop()
    seen: list[int] = []

    def boom() -> None:
        raise RuntimeError("boom")

    loop.call_at(1.0, boom)
    loop.call_at(2.0, seen.append, 2)
    with pytest.raises(RuntimeError, match="boom"):
        loop.run()
    assert loop.processed == 1
    loop.run()
    assert seen == [2] and loop.processed == 2


def test_bad_arguments_are_clear_errors() -> None:
    loop = EventLoop()
    with pytest.raises(TypeError):
        loop.call_at(1.0, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        loop.call_at(math.nan, print)
    with pytest.raises(TypeError):
        loop.call_at("soon", print)  # type: ignore[arg-type]
    assert len(loop) == 0


def test_pending_callbacks_are_released_with_the_loop() -> None:
    """A loop that holds callbacks into its owner (a cycle) is still collected."""

    class Owner:
        def __init__(self) -> None:
            self.loop = EventLoop()
            self.loop.call_at(1.0, self.tick, self)

        def tick(self, _: object) -> None:
            pass

    owner = Owner()
    ref = weakref.ref(owner)
    del owner
    gc.collect()
    assert ref() is None


def test_deadline_heap_matches_a_scan() -> None:
    rng = random.Random(7)
    heap = DeadlineHeap(40)
    truth = [math.inf] * 40
    now = 0.0
    for _ in range(5000):
        key = rng.randrange(40)
        at = math.inf if rng.random() < 0.2 else now + rng.choice([0.0, 1.0, rng.random() * 3])
        heap.set(key, at)
        truth[key] = at
        assert heap.earliest() == min(truth)
        assert len(heap) == sum(1 for t in truth if t != math.inf)
        if rng.random() < 0.1:
            now += rng.random()
            due = heap.pop_due(now)
            assert due == [k for k in range(40) if truth[k] <= now]
            for k in due:
                truth[k] = math.inf
            assert heap.earliest() == min(truth)  # the keys that fell due are gone
