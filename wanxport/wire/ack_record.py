"""The packet numbers one path received, as its ACK frames report them: the pure-Python reference.

The receiver's side of acknowledgement keeps, per path, which wire packet
numbers arrived and reports the newest ranges in each ACK frame. The native
data path keeps the same record in C (``wanxport._native.AckRecord``, wrapped
by ``wire.native.ack_record``) because the event loop consults it for every
run of datagrams and every ACK; this module is the reference the native one
is held identical to (same ranges, same bounds, hence the same ACK frame
bytes), and the record the simulator and the Python data path use.

Ranges are half-open ``[start, end)``, sorted, disjoint and never touching.
Every ACK repeats the newest ``ACK_FRAME_RANGES``, so with a loss in one packet
of 100 a range is still reported ~3000 packets later: enough for ACK loss and
late (reordered) packets, while the ACK stays about 500 bytes instead of 1 KB
that, with data flowing both ways, competes with the data (16 ranges were too
few with 10 % ACK loss and reordering jitter). The record keeps many more
(``ACK_RANGES_KEPT``): reordering can open dozens of gaps at once, and
forgetting the ranges below them would leave packets whose ACKs were lost
never acknowledged. Past that bound only the newest half is kept.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Protocol

ACK_FRAME_RANGES = 32
ACK_RANGES_KEPT = 256

Ranges = tuple[tuple[int, int], ...]


class PacketRecord(Protocol):
    """What both records offer (this reference and the native one)."""

    total: int

    def __len__(self) -> int: ...

    def add(self, first: int, end: int) -> None: ...

    def contains(self, start: int, end: int) -> bool: ...

    def ranges(self) -> Ranges: ...


class AckRecord:
    """Received packet numbers of one path (reference of the native ``AckRecord``)."""

    __slots__ = ("_starts", "_ends", "total")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0  # packet numbers held

    def __len__(self) -> int:
        return len(self._starts)

    def add(self, first: int, end: int) -> None:
        """Packet numbers ``first .. end - 1`` arrived."""
        if end <= first:
            return
        starts, ends = self._starts, self._ends
        if starts and first == ends[-1]:
            ends[-1] = end  # right after the newest: the common case
            self.total += end - first
            return
        if not starts or first > ends[-1]:
            starts.append(first)
            ends.append(end)
            self.total += end - first
        else:
            lo = bisect_right(starts, first) - 1
            if lo < 0 or ends[lo] < first:
                lo += 1
            hi = bisect_right(starts, end)  # ranges [lo, hi) touch or overlap [first, end)
            if lo == hi:
                starts.insert(lo, first)
                ends.insert(lo, end)
                self.total += end - first
            else:
                new_start, new_end = min(first, starts[lo]), max(end, ends[hi - 1])
                self.total += (new_end - new_start) - sum(ends[lo:hi]) + sum(starts[lo:hi])
                starts[lo:hi] = [new_start]
                ends[lo:hi] = [new_end]
        if len(starts) > ACK_RANGES_KEPT:
            drop = len(starts) - ACK_RANGES_KEPT // 2
            self.total -= sum(ends[:drop]) - sum(starts[:drop])
            del starts[:drop]
            del ends[:drop]

    def contains(self, start: int, end: int) -> bool:
        """Whether every number of ``[start, end)`` arrived."""
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def ranges(self) -> Ranges:
        """The newest ``ACK_FRAME_RANGES`` ranges, inclusive, highest first: an ACK frame's."""
        starts, ends = self._starts, self._ends
        n = len(starts)
        return tuple((starts[i], ends[i] - 1) for i in range(n - 1, max(n - ACK_FRAME_RANGES, 0) - 1, -1))
