"""The earliest of a fixed set of deadlines, updated in place.

A session has one deadline per path (ack, loss, probe, pacing wake-up, the
earliest of them), and it moves on almost every packet. A plain ``heapq`` of
``(time, path)`` entries either needs a push per move, leaving stale entries
that pile up (tens of thousands with a few hundred paths, every heap operation
paying for them), or a scan. This binary heap holds each key at most once and
knows where: moving a deadline is one sift of at most log2(paths) levels, and
it compares plain floats instead of tuples.
"""

from __future__ import annotations

INFINITY = float("inf")

__all__ = ["DeadlineHeap"]


class DeadlineHeap:
    """Keys ``0..size-1``, each with a deadline (``inf``: none), earliest first.

    Ties between equal deadlines go to the lower key, so the order in which
    keys fall due never depends on the order of updates.
    """

    __slots__ = ("_at", "_heap", "_pos")

    def __init__(self, size: int) -> None:
        self._at: list[float] = [INFINITY] * size  # each key's deadline
        self._heap: list[int] = []  # the keys with a finite deadline, heap-ordered
        self._pos: list[int] = [-1] * size  # each key's index in _heap, -1 when absent

    def __len__(self) -> int:
        return len(self._heap)

    def earliest(self) -> float:
        """The earliest deadline, ``inf`` when there is none."""
        heap = self._heap
        return self._at[heap[0]] if heap else INFINITY

    def at(self, key: int) -> float:
        """``key``'s deadline (``inf``: none)."""
        return self._at[key]

    def set(self, key: int, at: float) -> None:
        """Give ``key`` the deadline ``at`` (``inf`` removes it)."""
        old = self._at[key]
        if at == old:
            return
        self._at[key] = at
        pos = self._pos[key]
        if pos < 0:
            heap = self._heap
            heap.append(key)
            self._pos[key] = len(heap) - 1
            self._sift_up(len(heap) - 1)
        elif at == INFINITY:
            self._remove(pos)
        elif at < old:
            self._sift_up(pos)
        else:
            self._sift_down(pos)

    def pop_due(self, now: float) -> list[int]:
        """Remove and return, in key order, every key whose deadline is at or before ``now``."""
        due: list[int] = []
        heap = self._heap
        at = self._at
        while heap and at[heap[0]] <= now:
            key = heap[0]
            at[key] = INFINITY
            self._remove(0)
            due.append(key)
        due.sort()
        return due

    def _before(self, a: int, b: int) -> bool:
        at_a = self._at[a]
        at_b = self._at[b]
        return at_a < at_b or (at_a == at_b and a < b)

    def _remove(self, pos: int) -> None:
        heap = self._heap
        key = heap[pos]
        last = heap.pop()
        self._pos[key] = -1
        if pos < len(heap):
            heap[pos] = last
            self._pos[last] = pos
            self._sift_up(pos)
            self._sift_down(self._pos[last])

    def _sift_up(self, pos: int) -> None:
        heap = self._heap
        positions = self._pos
        key = heap[pos]
        while pos > 0:
            parent = (pos - 1) >> 1
            above = heap[parent]
            if not self._before(key, above):
                break
            heap[pos] = above
            positions[above] = pos
            pos = parent
        heap[pos] = key
        positions[key] = pos

    def _sift_down(self, pos: int) -> None:
        heap = self._heap
        positions = self._pos
        size = len(heap)
        key = heap[pos]
        while True:
            child = 2 * pos + 1
            if child >= size:
                break
            right = child + 1
            if right < size and self._before(heap[right], heap[child]):
                child = right
            below = heap[child]
            if not self._before(below, key):
                break
            heap[pos] = below
            positions[below] = pos
            pos = child
        heap[pos] = key
        positions[key] = pos
