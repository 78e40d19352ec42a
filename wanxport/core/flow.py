"""Receive credits: the receiver's memory bound, which the sender never exceeds.

Credit is cumulative bytes of shard payload the sender may have *opened*. The
receiver grants its budget up front and extends the limit by a shard's size
when that shard is complete and handed to the application, so at most
``budget`` bytes of destination buffers exist at once, whatever the sender does.
"""

from __future__ import annotations


class SendCredit:
    """Sender side: how much may still be opened."""

    __slots__ = ("limit", "used")

    def __init__(self, initial_limit: int) -> None:
        self.limit = initial_limit
        self.used = 0

    def can_open(self, size: int) -> bool:
        return self.used + size <= self.limit

    def open(self, size: int) -> None:
        self.used += size

    def update(self, limit: int) -> None:
        """A CREDIT frame; limits only grow, so a reordered old frame is harmless."""
        self.limit = max(self.limit, limit)


class ReceiveBudget:
    """Receiver side: refuses openings beyond the granted limit."""

    __slots__ = ("budget", "opened", "released")

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.opened = 0
        self.released = 0

    @property
    def limit(self) -> int:
        return self.released + self.budget

    def try_open(self, size: int) -> bool:
        if self.opened + size > self.limit:
            return False
        self.opened += size
        return True

    def release(self, size: int) -> int:
        """A shard left the receiver's hands; return the new limit to advertise."""
        self.released += size
        return self.limit
