"""Core liveness bugs found by the asyncio endpoint, reproduced with two bare ``Session``s.

They guard a stall that existed in ``Transmitter._emit_data`` (a path beyond its pacing
horizon was skipped without arming its pacing wake). Virtual time, no sockets:
the driver delivers every packet a fixed one-way delay after the poll that
produced it, as the Python data path does
(it sends at once and leaves pacing to the core's horizon).
"""

from __future__ import annotations

import heapq
import itertools

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.events import ShardAcknowledged
from wanxport.core.session import Session
from wanxport.wire.frames import Frame

ONE_WAY_S = 0.00005  # loopback-like: ACKs return long before the next pacing slot
LIMIT_S = 5.0


def run_until_acknowledged(size: int) -> float | None:
    """Send one ``size``-byte shard a -> b; the virtual time it is acknowledged, or None (stall)."""
    config = SessionConfig(paths=(PathConfig("p0"), PathConfig("p1")))
    a, b = Session(config), Session(config)
    now = 0.0
    a.submit(0, bytes(range(256)) * (size // 256), now)
    seq = itertools.count()
    wire: list[tuple[float, int, Session, int, int, list[Frame]]] = []
    while now < LIMIT_S:
        for sender, receiver in ((a, b), (b, a)):
            for tx in sender.poll_transmit(now):
                heapq.heappush(wire, (now + ONE_WAY_S, next(seq), receiver, tx.path_id,
                                      tx.first_pn, tx.frames))
        if any(isinstance(e, ShardAcknowledged) for e in a.events()):
            return now
        b.events()
        deadlines = [d for d in (a.next_deadline(), b.next_deadline()) if d is not None]
        if wire:
            deadlines.append(wire[0][0])
        if not deadlines:
            return None  # nothing in flight, no timer armed: nobody will ever act again
        now = max(now, min(deadlines))
        while wire and wire[0][0] <= now:
            _, _, receiver, path_id, pn, frames = heapq.heappop(wire)
            receiver.receive_packet(path_id, pn, frames, now)
        for session in (a, b):
            deadline = session.next_deadline()
            if deadline is not None and deadline <= now:
                session.on_deadline(now)
    return None


def test_sender_wakes_when_an_ack_arrives_before_the_next_pacing_slot() -> None:
    assert run_until_acknowledged(2 << 20) is not None
