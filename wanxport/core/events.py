"""What a session tells its driver (popped with ``Session.events()``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ShardReceived:
    """Receiver: every byte is in and the digest matched (or ``ok`` is False: it did not)."""

    shard_id: int
    size: int
    meta: bytes
    ok: bool
    at: float


@dataclass(frozen=True, slots=True)
class ShardAcknowledged:
    """Sender: the receiver confirmed the shard verified (``ok``) or reported a failure."""

    shard_id: int
    ok: bool
    at: float


@dataclass(frozen=True, slots=True)
class PathChanged:
    """A path moved between probing, active, degraded and failed."""

    path_id: int
    name: str
    old: str
    new: str
    at: float


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The peer closed, or the session gave up; ``error`` is empty for a clean close."""

    code: int
    error: str
    at: float


Event = ShardReceived | ShardAcknowledged | PathChanged | SessionClosed
