"""How much faster one run was than another, honest about runs that did not finish.

A run stopped at its deadline has no completion time, only a lower bound on it
(the deadline). A ratio against such a run is therefore a bound too: when the
slower run did not finish, "wanxport was X times faster" is only known to be
*more than* X; when the faster one did not finish, *less than* X; when neither
did, nothing. Bounds are rounded so that the printed number is still a true
bound (down for "more than", up for "less than").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DNF = "did not finish"


def finished(report: dict[str, Any]) -> bool:
    """Whether a run report's transfer completed before its deadline."""
    if "finished" in report:
        return bool(report["finished"])
    return not report.get("timed_out", False)


@dataclass(frozen=True)
class Ratio:
    """slow / fast completion, and what it is: "=" exact, ">" lower bound, "<" upper bound,
    None unknown (neither finished)."""

    value: float | None
    bound: str | None

    def text(self, digits: int = 1) -> str:
        if self.value is None or self.bound is None:
            return "n/a (neither finished)"
        scale = 10 ** digits
        if self.bound == ">":
            return f"> {math.floor(self.value * scale) / scale:.{digits}f} ×"
        if self.bound == "<":
            return f"< {math.ceil(self.value * scale) / scale:.{digits}f} ×"
        return f"{self.value:.{digits}f} ×"


def completion_ratio(slow_s: float, slow_finished: bool, fast_s: float, fast_finished: bool) -> Ratio:
    """``slow_s / fast_s``, bounded by which of the two runs finished."""
    if not (slow_s > 0 and fast_s > 0):
        raise ValueError("completion times must be positive")
    value = slow_s / fast_s
    if slow_finished and fast_finished:
        return Ratio(value, "=")
    if not slow_finished and fast_finished:
        return Ratio(value, ">")
    if slow_finished and not fast_finished:
        return Ratio(value, "<")
    return Ratio(None, None)


def speedup(baseline: dict[str, Any], ours: dict[str, Any]) -> Ratio:
    """How many times faster ``ours`` completed than ``baseline`` (two run reports)."""
    return completion_ratio(float(baseline["completion_s"]), finished(baseline),
                            float(ours["completion_s"]), finished(ours))


def completion_text(report: dict[str, Any]) -> str:
    """``12.34 s``, or ``> 60.00 s (did not finish)`` for a run stopped at its deadline."""
    if finished(report):
        return f"{report['completion_s']:.2f} s"
    return f"> {report['completion_s']:.2f} s ({DNF})"
