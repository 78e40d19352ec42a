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
    digest: bytes | None = None  # the digest the shard was checked against (None: virtual)


@dataclass(frozen=True, slots=True)
class ShardFilled:
    """Receiver, with deferred verification: every byte of ``buffer`` is in; check it.

    The driver hashes ``buffer`` away from its event loop (SHA-256 of a 64 MiB
    shard takes ~50 ms, long enough to stall acknowledgements on every path),
    compares with ``digest`` and calls ``Session.shard_verified``. Nothing
    writes to ``buffer`` meanwhile: the session places no more data in it.
    """

    shard_id: int
    buffer: memoryview
    digest: bytes
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


@dataclass(frozen=True, slots=True)
class ReceiveStalled:
    """Receiver: shards are open and no data arrived for ``timeout_s`` (``Session.watch_stall``).

    ``open_shards`` were waiting; the lowest-numbered of them, ``shard_id``, held
    ``received_bytes`` of ``size``. The driver decides what ends (the gateway fails
    the session with this as the reason).
    """

    open_shards: int
    shard_id: int
    received_bytes: int
    size: int
    timeout_s: float
    at: float

    def describe(self) -> str:
        return (f"the sender stalled: no data for {self.timeout_s:g} s with {self.open_shards} shard(s) "
                f"open (shard {self.shard_id}: {self.received_bytes} of {self.size} bytes)")


Event = ShardReceived | ShardFilled | ShardAcknowledged | PathChanged | SessionClosed | ReceiveStalled
