"""Sorted, disjoint integer ranges: received bytes of a shard, acknowledged packets.

Ranges are half-open ``[start, end)``. Adding is O(log n + merged), and the
common case, appending right after the last range, is O(1).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterator


class RangeSet:
    """A set of integers stored as sorted, disjoint, non-touching ``[start, end)`` ranges."""

    __slots__ = ("_starts", "_ends", "total")

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        self.total = 0  # how many integers the set holds

    def __len__(self) -> int:
        return len(self._starts)

    def __iter__(self) -> Iterator[tuple[int, int]]:
        return iter(zip(self._starts, self._ends, strict=True))

    def add(self, start: int, end: int) -> int:
        """Add ``[start, end)``; return how many integers were new."""
        if end <= start:
            return 0
        starts, ends = self._starts, self._ends
        if not starts or start > ends[-1]:
            starts.append(start)
            ends.append(end)
            self.total += end - start
            return end - start
        if start == ends[-1]:
            ends[-1] = end
            self.total += end - start
            return end - start
        # First range that could touch: the last one starting at or before `start`.
        lo = bisect_right(starts, start) - 1
        if lo < 0 or ends[lo] < start:
            lo += 1
        hi = bisect_right(starts, end)  # ranges [lo, hi) touch or overlap
        if lo == hi:
            starts.insert(lo, start)
            ends.insert(lo, end)
            self.total += end - start
            return end - start
        new_start = min(start, starts[lo])
        new_end = max(end, ends[hi - 1])
        old = sum(e - s for s, e in zip(starts[lo:hi], ends[lo:hi], strict=True))
        starts[lo:hi] = [new_start]
        ends[lo:hi] = [new_end]
        added = (new_end - new_start) - old
        self.total += added
        return added

    def contains(self, start: int, end: int) -> bool:
        """True when every integer of ``[start, end)`` is in the set."""
        i = bisect_right(self._starts, start) - 1
        return i >= 0 and self._ends[i] >= end

    def contains_point(self, value: int) -> bool:
        i = bisect_right(self._starts, value) - 1
        return i >= 0 and self._ends[i] > value

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The parts of ``[start, end)`` that are not in the set, ascending."""
        out: list[tuple[int, int]] = []
        i = max(bisect_right(self._starts, start) - 1, 0)
        pos = start
        starts, ends = self._starts, self._ends
        while pos < end and i < len(starts):
            s, e = starts[i], ends[i]
            if e <= pos:
                i += 1
                continue
            if s >= end:
                break
            if s > pos:
                out.append((pos, s))
            pos = max(pos, e)
            i += 1
        if pos < end:
            out.append((pos, end))
        return out

    def first_gap_after(self, value: int) -> int:
        """The smallest integer >= value that is not in the set."""
        i = bisect_right(self._starts, value) - 1
        if i >= 0 and self._ends[i] > value:
            return self._ends[i]
        return value

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def last(self, count: int) -> list[tuple[int, int]]:
        """The ``count`` highest ranges, highest first."""
        n = len(self._starts)
        return [(self._starts[i], self._ends[i]) for i in range(n - 1, max(n - count, 0) - 1, -1)]

    def discard_below(self, value: int) -> None:
        """Forget everything below ``value`` (bounded memory for packet-number sets)."""
        i = bisect_left(self._ends, value + 1)
        if i:
            self.total -= sum(e - s for s, e in zip(self._starts[:i], self._ends[:i], strict=True))
            del self._starts[:i]
            del self._ends[:i]
        if self._starts and self._starts[0] < value:
            self.total -= value - self._starts[0]
            self._starts[0] = value
