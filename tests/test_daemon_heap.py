"""The daemon hands the C heap's free pages back once a minute (``daemon/heap.py``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from wanxport.daemon.heap import malloc_trim, trim_periodically


def rss_anon_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise RuntimeError("no RssAnon in /proc/self/status")


def test_malloc_trim_returns_free_pages_between_live_chunks() -> None:
    """What the daemon's heap did for hours: freed chunks between live ones stay resident
    (free() gives back only the heap's top) until malloc_trim releases them."""
    trim = malloc_trim()
    if trim is None:
        pytest.skip("not glibc: no malloc_trim")
    trim()
    blocks = [bytes(8192) for _ in range(6000)]  # ~47 MiB from the heap (below mmap's threshold)
    kept = blocks[::8]  # one live block in eight pins the heap's top
    del blocks
    before = rss_anon_kib()
    trim()
    released = before - rss_anon_kib()
    assert len(kept) == 750
    assert released > 24 * 1024, f"malloc_trim released {released} KiB of ~41 MiB free"


def test_the_trim_runs_every_period_until_cancelled() -> None:
    calls: list[int] = []

    class Enough(Exception):
        pass

    def trim() -> int:
        calls.append(1)
        if len(calls) == 3:
            raise Enough
        return 1

    with pytest.raises(Enough):
        asyncio.run(trim_periodically(0.0, trim))
    assert len(calls) == 3
