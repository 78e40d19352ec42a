"""Which path carries the next burst: schedule by expected arrival (DESIGN.md section 3).

The earliest-arrival scheduler sends each burst on the path where it is
expected to be delivered first: departure (pacing) plus one-way delay. While
plenty of data remains, every path with room is kept busy. Near the end it
water-fills: given the bytes left R, it finds the time T at which paths
starting in order of expected arrival would together deliver R, and a path
whose first byte would arrive after T gets nothing, so all paths run dry
together instead of a slow path delivering the last byte late.

Schedulers are registered by name, like congestion controllers.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

from wanxport.core.paths import Path


class Scheduler(ABC):
    name: str

    @abstractmethod
    def cutoff(self, paths: list[Path], now: float, remaining_bytes: int) -> float:
        """Latest expected arrival at which a path should still take new data."""

    @abstractmethod
    def order(self, candidates: list[Path], now: float) -> list[Path]:
        """Candidates in the order they should be filled."""


def expected_arrival(path: Path, now: float) -> float:
    return max(now, path.next_send_at) + path.one_way_s


class EarliestArrivalScheduler(Scheduler):
    name = "earliest-arrival"

    def cutoff(self, paths: list[Path], now: float, remaining_bytes: int) -> float:
        starts = sorted((expected_arrival(p, now), p.send_rate_Bps()) for p in paths)
        rate_sum = 0.0
        weighted = 0.0
        for i, (arrival, rate) in enumerate(starts):
            rate_sum += rate
            weighted += rate * arrival
            finish = (remaining_bytes + weighted) / rate_sum if rate_sum > 0 else float("inf")
            if i + 1 == len(starts) or finish <= starts[i + 1][0]:
                return finish
        return float("inf")

    def order(self, candidates: list[Path], now: float) -> list[Path]:
        return sorted(candidates, key=lambda p: expected_arrival(p, now))


class RoundRobinScheduler(Scheduler):
    """Ignores delays: the naive striping baseline, for comparison."""

    name = "round-robin"

    def __init__(self) -> None:
        self._turn = 0

    def cutoff(self, paths: list[Path], now: float, remaining_bytes: int) -> float:
        return float("inf")

    def order(self, candidates: list[Path], now: float) -> list[Path]:
        self._turn += 1
        k = self._turn % len(candidates) if candidates else 0
        return candidates[k:] + candidates[:k]


_REGISTRY: dict[str, Callable[[], Scheduler]] = {}


def register_scheduler(name: str, factory: Callable[[], Scheduler]) -> None:
    _REGISTRY[name] = factory


def create_scheduler(name: str) -> Scheduler:
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise ValueError(
            f"unknown scheduler {name!r}; valid: {', '.join(sorted(_REGISTRY))}"
        ) from None


def available_schedulers() -> list[str]:
    return sorted(_REGISTRY)


register_scheduler("earliest-arrival", EarliestArrivalScheduler)
register_scheduler("round-robin", RoundRobinScheduler)
