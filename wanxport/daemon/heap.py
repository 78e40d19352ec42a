"""Hand the C heap's free pages back to the kernel once a minute (glibc ``malloc_trim``).

Python frees its larger objects (over 512 bytes: datagrams, JSON bodies, buffers)
into glibc's heap, and glibc gives memory back to the kernel only from the heap's
top. Free pages between live chunks stay resident, so over a warm daemon's life the
heap's resident size ratchets up while what it holds does not grow: heaptrack on
``benchmarks/leak.py`` (100 transfers of 32 MiB) shows the live heap flat within
72 KB, while ``[heap]`` in smaps grew 452 KiB; with ``malloc_trim(0)`` before each
reading it grew 36 KiB (docs/results/soak.md, third pass). ``malloc_trim(0)`` also
releases whole free pages inside the heap, so calling it now and then keeps the
daemon's anonymous memory at what it uses. A minute is rare enough to cost nothing
measurable (a walk of a heap of ~12 MiB) and often enough that the ratchet never
shows. Not glibc (musl, another platform): nothing to do.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_S = 60.0


def malloc_trim() -> Callable[[], int] | None:
    """glibc's ``malloc_trim(0)`` (1 when it released memory), or None without glibc."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


async def trim_periodically(every_s: float = TRIM_EVERY_S,
                            trim: Callable[[], int] | None = None) -> None:
    """Until cancelled: ``trim`` (default ``malloc_trim``) every ``every_s`` seconds."""
    trim = trim or malloc_trim()
    if trim is None:
        log.debug("no malloc_trim (not glibc): the heap is left to the allocator")
        return
    while True:
        await asyncio.sleep(every_s)
        trim()
