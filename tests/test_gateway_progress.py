"""The goodput timeline stays bounded over a session that lasts for months."""

from __future__ import annotations

import tracemalloc

from wanxport.gateway.progress import MAX_TIMELINE, ProgressMonitor


def test_a_long_timeline_is_thinned_not_grown() -> None:
    monitor = ProgressMonitor("receiving", 0, lambda: 0, origin=0.0, show=False, interval_s=0.1)
    for i in range(20 * MAX_TIMELINE):
        monitor.sample(i * 0.1, i)
    assert len(monitor.timeline) <= MAX_TIMELINE
    assert monitor.timeline[0] == (0.0, 0)  # still starts at the start...
    assert monitor.timeline[-1][1] >= 19 * MAX_TIMELINE  # ...and reaches the recent past
    values = [v for _, v in monitor.timeline]
    assert values == sorted(values)
    assert monitor.interval_s > 0.1  # sampling slowed down as the run got longer


def test_the_timeline_memory_is_allocated_once_at_its_bound() -> None:
    """A session samples for months: its timeline's memory must not grow with the
    samples (a list of tuples grew for hours before first reaching the bound)."""
    monitor = ProgressMonitor("receiving", 0, lambda: 0, origin=0.0, show=False, interval_s=0.1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3 * MAX_TIMELINE):
            monitor.sample(i * 0.1 + 1e6, (1 << 40) + i)  # floats and ints Python cannot cache
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 4096
    assert monitor.timeline[-1] == ((3 * MAX_TIMELINE - 1) * 0.1 + 1e6, (1 << 40) + 3 * MAX_TIMELINE - 1)
