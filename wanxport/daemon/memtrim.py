"""Hand the C heap's free pages back to the kernel once a minute (glibc ``malloc_trim``).

Python frees its larger objects (over 512 bytes: datagrams, JSON bodies, buffers)
into glibc's heap, and glibc gives memory back to the kernel only from the heap's
top. Free pages between live chunks stay resident, so over a warm daemon's life the
heap's resident size ratchets up while what it holds does not grow: heaptrack on
``benchmarks/leak.py`` (100 transfers of 32 MiB) shows the live heap flat within
72 KB, while ``[heap]`` in smaps grew 452 KiB; with ``malloc_trim(0)`` before each
reading it grew 36 KiB. ``malloc_trim(0)`` also
releases whole free pages inside the heap, so calling it now and then keeps the
daemon's anonymous memory at what it uses. A minute is rare enough to cost nothing
measurable (a walk of a heap of ~12 MiB) and often enough that the ratchet never
shows. Not glibc (musl, another platform): nothing to do.

Before its first trim the daemon also settles CPython's table of interned strings
(``settle_interned_strings``): the last late step of the soaks, ~0.95 MiB at ~40 minutes.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

TRIM_EVERY_S = 60.0
# Enough one-at-a-time interns to use up the free slots of any interned-string table of
# up to 2**18 slots (two thirds of them are usable), i.e. live counts up to ~87,000.
SETTLE_INTERNS = 1 << 18


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


def settle_interned_strings(count: int = SETTLE_INTERNS) -> None:
    """Make CPython rebuild its interned-string table now, at the size its live count needs.

    Python 3.11's ``pathlib`` interns every path component, so each transfer interns a
    few unique names (ids, digests, file names) and releases them. A released name
    leaves a dead slot, and the table is rebuilt only when its free slots run out, sized
    for the strings then alive (three slots each, rounded up to a power of two). The
    gateway's table is left after start-up at 2**16 slots while ~26,900 strings live in
    it, a count that needs 2**17: so after ~17,000 transfer names the one rebuild that
    was always due came, at ~40 minutes of the soak, +0.95 MiB (a 1.9 MB table
    replacing a 0.96 MB one; ``perf record -e syscalls:sys_enter_mmap`` caught it in
    ``PyUnicode_InternInPlace`` under ``PurePath.__truediv__``; gdb read
    ``interned->ma_used`` flat at 26,853). Bounded, but it is one late step in a
    long-running daemon's memory. Interning ``count`` unique throwaway names one at a
    time brings that rebuild forward (each is freed at once, so the live count the
    table is sized for stays the daemon's own); later rebuilds keep the size.
    """
    intern = sys.intern
    for index in range(count):
        intern(f"\x00wanxport-settle-{index}")


async def trim_periodically(every_s: float = TRIM_EVERY_S,
                            trim: Callable[[], int] | None = None) -> None:
    """Until cancelled: ``trim`` (default ``malloc_trim``) every ``every_s`` seconds.

    The first period also settles the interned-string table, once start-up and the
    first sessions have interned what the daemon keeps.
    """
    trim = trim or malloc_trim()
    await asyncio.sleep(every_s)
    settle_interned_strings()
    if trim is None:
        log.debug("no malloc_trim (not glibc): the heap is left to the allocator")
        return
    while True:
        trim()
        await asyncio.sleep(every_s)
