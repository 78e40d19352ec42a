"""Per-path replay window: accept each packet number at most once."""

from __future__ import annotations

WINDOW = 4096


class ReplayWindow:
    """Highest accepted packet number plus a bitmap of the WINDOW numbers below it.

    A number older than the window is rejected even if never seen: the sender
    never sends that far out of order, and remembering everything would be
    unbounded memory.
    """

    __slots__ = ("highest", "_bits")

    def __init__(self) -> None:
        self.highest = -1
        self._bits = 0  # bit i set: highest - i accepted

    def check(self, pn: int) -> bool:
        """Would ``pn`` be accepted? (Does not record it.)"""
        if pn > self.highest:
            return True
        age = self.highest - pn
        return age < WINDOW and not (self._bits >> age) & 1

    def record(self, pn: int) -> None:
        """Mark ``pn`` accepted; call only after the packet authenticated."""
        if pn > self.highest:
            shift = pn - self.highest
            self._bits = ((self._bits << shift) | 1) & ((1 << WINDOW) - 1) if shift < WINDOW else 1
            self.highest = pn
        else:
            self._bits |= 1 << (self.highest - pn)
