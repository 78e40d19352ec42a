"""Which of the paths ready to send is filled first.

The order decides which path gets the next chunk when several have room at
once; each path then takes chunks until its window or pacing stops it. While
every path is kept busy, the order changes *which* bytes a path carries, not
how many: what each path moves is set by its own rate.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from wanxport.core.paths import Path


def expected_arrival(path: Path, now: float) -> float:
    """When a packet handed to ``path`` now would arrive: its departure plus one-way delay."""
    return max(now, path.next_send_at) + path.one_way_s


class PathOrder(ABC):
    @abstractmethod
    def order(self, candidates: list[Path], now: float) -> list[Path]:
        """Candidates in the order they should be filled."""


class ExpectedArrivalOrder(PathOrder):
    """The path that would deliver first goes first (docs/design.md section 3)."""

    def order(self, candidates: list[Path], now: float) -> list[Path]:
        return sorted(candidates, key=lambda p: expected_arrival(p, now))


class RotatingOrder(PathOrder):
    """Ignores delays: each call starts one path further along (round robin)."""

    def __init__(self) -> None:
        self._turn = 0

    def order(self, candidates: list[Path], now: float) -> list[Path]:
        self._turn += 1
        k = self._turn % len(candidates) if candidates else 0
        return candidates[k:] + candidates[:k]
