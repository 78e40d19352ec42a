"""A peer with valid credentials that misbehaves, against a receiving core session.

The datagrams authenticate (the driver hands them to ``receive_packet``), so only
the protocol stands between the peer and the receiver's memory and data: a
shard opened beyond the granted credit, a shard larger than the whole budget,
a shard re-opened with another size, and the same offsets sent again with other
contents. Each opening violation closes the session with the reason, to the
peer (CLOSE) and to our driver (``SessionClosed``), with no buffer allocated
beyond the budget; conflicting contents never reach the application as
verified data.
"""

from __future__ import annotations

import random

import pytest

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.digest import shard_digest
from wanxport.core.events import SessionClosed, ShardReceived
from wanxport.core.session import CLOSE_PROTOCOL_VIOLATION, Session
from wanxport.wire.frames import (
    STATUS_INTEGRITY_FAILURE,
    STATUS_VERIFIED,
    CloseFrame,
    DataFrame,
    Frame,
    ShardDoneFrame,
    ShardOpenFrame,
)

BUDGET = 100_000


class CountingAllocator:
    def __init__(self) -> None:
        self.allocated = 0
        self.buffers: list[bytearray] = []

    def __call__(self, shard_id: int, size: int, meta: bytes) -> memoryview:
        self.allocated += size
        self.buffers.append(bytearray(size))
        return memoryview(self.buffers[-1])


def receiver() -> tuple[Session, CountingAllocator]:
    alloc = CountingAllocator()
    config = SessionConfig(paths=(PathConfig("p0"),), tag_bytes=0, receive_budget_bytes=BUDGET,
                           peer_credit_bytes=BUDGET)
    return Session(config, allocator=alloc), alloc


class Peer:
    """Writes packets straight into the receiver, numbering them like a real sender."""

    def __init__(self, session: Session) -> None:
        self.session, self.pn, self.now = session, 0, 0.0

    def send(self, *frames: Frame) -> None:
        self.now += 0.001
        self.session.receive_packet(0, self.pn, list(frames), self.now)
        self.pn += 1


def closes_sent(session: Session) -> list[CloseFrame]:
    return [f for t in session.poll_transmit(1.0) for f in t.frames if isinstance(f, CloseFrame)]


def closed_events(session: Session) -> list[SessionClosed]:
    return [e for e in session.events() if isinstance(e, SessionClosed)]


@pytest.mark.parametrize("openings,expected", [
    ([(1, 60_000), (2, 60_000)], "shard 2 of 60000 bytes exceeds the receive credit"),
    ([(1, BUDGET + 1)], f"shard 1 of {BUDGET + 1} bytes exceeds the receive credit"),
    ([(1, 1000), (1, 2000)], "shard 1 re-opened as 2000 bytes"),
])
def test_opening_violations_close_with_the_reason(openings: list[tuple[int, int]], expected: str) -> None:
    session, alloc = receiver()
    peer = Peer(session)
    for shard_id, size in openings:
        peer.send(ShardOpenFrame(shard_id, size, bytes(32)))
    (event,) = closed_events(session)
    assert event.code == CLOSE_PROTOCOL_VIOLATION and expected in event.error, event.error
    (close,) = closes_sent(session)
    assert close.code == CLOSE_PROTOCOL_VIOLATION and close.reason == event.error
    assert alloc.allocated <= BUDGET, "no destination buffer beyond the budget"
    assert session.incoming.budget.opened <= BUDGET


def test_a_sender_within_its_credit_is_never_refused() -> None:
    session, alloc = receiver()
    peer = Peer(session)
    peer.send(ShardOpenFrame(1, 60_000, bytes(32)), ShardOpenFrame(2, 40_000, bytes(32)))
    assert session.closed is None and closed_events(session) == [] and alloc.allocated == BUDGET


@pytest.mark.parametrize("forged_first", [False, True])
def test_same_offsets_with_other_contents_never_deliver_wrong_bytes(forged_first: bool) -> None:
    """Received bytes are never rewritten (a hasher may be reading them), so the first copy
    of each byte stays: forged copies after the original change nothing, forged copies
    before it make the shard fail its digest (SHARD_DONE integrity failure), and in
    neither case does the application get bytes it was not sent as verified."""
    rng = random.Random(5)
    original, forged = rng.randbytes(4000), rng.randbytes(4000)
    session, alloc = receiver()
    peer = Peer(session)
    peer.send(ShardOpenFrame(7, len(original), shard_digest(original)))
    if forged_first:
        peer.send(DataFrame(7, 1000, 2000, forged[1000:3000]))
    peer.send(DataFrame(7, 0, 2000, original[:2000]))
    peer.send(DataFrame(7, 2000, 2000, original[2000:]))
    peer.send(DataFrame(7, 0, 2000, forged[:2000]))  # after the shard was handed over: ignored
    (got,) = [e for e in session.events() if isinstance(e, ShardReceived)]
    assert got.ok is not forged_first
    (buffer,) = alloc.buffers
    assert bytes(buffer) == (original if not forged_first else original[:1000] + forged[1000:3000]
                             + original[3000:])
    done = [f for t in session.poll_transmit(1.0) for f in t.frames if isinstance(f, ShardDoneFrame)]
    assert [(f.shard_id, f.status) for f in done] == [
        (7, STATUS_INTEGRITY_FAILURE if forged_first else STATUS_VERIFIED)]
    assert session.closed is None
