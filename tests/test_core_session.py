"""Two sessions wired back to back by hand, on a fake clock, for precise protocol behaviours.

The harness below is a deliberately small network: per path and direction a
fixed one-way delay and a serialisation rate, a ``drop`` hook and a ``mutate``
hook that see every datagram. Datagrams go through the reference data path
with *null* protection, so a mutated byte reaches the session exactly as
corruption in transit would if the AEAD were absent: the shard digest is the
only thing that can catch it.
"""

from __future__ import annotations

import gc
import hashlib
import heapq
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pytest

from wanxport.core.cc import cc_config
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.digest import shard_digest
from wanxport.core.events import (
    Event,
    PathChanged,
    SessionClosed,
    ShardAcknowledged,
    ShardFilled,
    ShardReceived,
)
from wanxport.core.session import Session
from wanxport.wire.datapath import PacketOpener, PacketSealer
from wanxport.wire.frames import AckFrame, DataFrame, Frame, ProbeFrame, ShardOpenFrame, decode_frames
from wanxport.wire.header import HEADER_LEN
from wanxport.wire.protection import NullProtection, Protection

Drop = Callable[[str, int, float, list[Frame]], bool]
Mutate = Callable[[str, int, float, bytes], bytes]
LIVELOCK_STEPS = 20_000  # events at one instant before the harness calls it a livelock


@dataclass
class Delivered:
    at: float
    side: str  # receiving side
    path_id: int
    packet_number: int
    frames: list[Frame]


@dataclass
class Pair:
    """Sessions ``a`` and ``b``; ``run`` moves packets and fires timers in time order."""

    config: SessionConfig
    owd_s: list[float]
    rate_bps: list[float]
    drop: Drop = lambda side, path_id, at, frames: False  # noqa: E731
    mutate: Mutate | None = None
    checks: list[Callable[[Pair], None]] = field(default_factory=list)
    # Deferred verification: a ShardFilled shard gets its verdict this long after, as
    # from a worker thread (None: the session hashes on the spot).
    verify_after_s: float | None = None

    def __post_init__(self) -> None:
        self.buffers: dict[str, dict[int, memoryview]] = {"a": {}, "b": {}}
        defer = self.verify_after_s is not None
        self.sessions = {side: Session(self.config, allocator=self._allocator(side), defer_verification=defer)
                         for side in "ab"}
        self._verdicts: list[tuple[float, str, int, bool]] = []
        keys: dict[int, Protection] = {0: NullProtection()}
        n = len(self.config.paths)
        self.sealer = {side: PacketSealer(0, keys) for side in "ab"}
        self.opener = {side: PacketOpener(0, n, keys) for side in "ab"}
        self.now = 0.0
        self._heap: list[tuple[float, int, str, int, bytes]] = []
        self._seq = 0
        self._busy = {(side, p): 0.0 for side in "ab" for p in range(n)}
        self.events: dict[str, list[tuple[float, Event]]] = {"a": [], "b": []}
        self.delivered: list[Delivered] = []
        self.dropped: list[tuple[str, int, float, list[Frame]]] = []

    @property
    def a(self) -> Session:
        return self.sessions["a"]

    @property
    def b(self) -> Session:
        return self.sessions["b"]

    def _allocator(self, side: str) -> Callable[[int, int, bytes], memoryview]:
        def allocate(shard_id: int, size: int, meta: bytes) -> memoryview:
            buffer = memoryview(bytearray(size))
            self.buffers[side][shard_id] = buffer
            return buffer
        return allocate

    def submit(self, side: str, shard_id: int, data: bytes) -> None:
        self.sessions[side].submit(shard_id, data, self.now)
        self.service(side)

    def service(self, side: str) -> None:
        session = self.sessions[side]
        other = "b" if side == "a" else "a"
        for tx in session.poll_transmit(self.now):
            key = (side, tx.path_id)
            depart = max(self.now, tx.not_before, self._busy[key])
            self._busy[key] = depart + tx.size * 8 / self.rate_bps[tx.path_id]
            if self.drop(side, tx.path_id, depart, tx.frames):
                self.dropped.append((side, tx.path_id, depart, tx.frames))
                continue
            datagram = self.sealer[side].seal(tx.path_id, tx.first_pn, tx.frames)
            if self.mutate is not None:
                datagram = self.mutate(side, tx.path_id, depart, datagram)
            arrival = self._busy[key] + self.owd_s[tx.path_id]
            heapq.heappush(self._heap, (arrival, self._seq, other, tx.path_id, datagram))
            self._seq += 1
        for event in session.events():
            self.events[side].append((self.now, event))
            if isinstance(event, ShardFilled):
                assert self.verify_after_s is not None
                ok = shard_digest(event.buffer) == event.digest
                heapq.heappush(self._verdicts, (self.now + self.verify_after_s, side, event.shard_id, ok))

    def run(self, until: float, stop: Callable[[Pair], bool] | None = None) -> None:
        same_instant = 0
        while True:
            times = [t for t in (self.a.next_deadline(), self.b.next_deadline()) if t is not None]
            if self._heap:
                times.append(self._heap[0][0])
            if self._verdicts:
                times.append(self._verdicts[0][0])
            if not times or min(times) > until:
                self.now = max(self.now, until)
                return
            t = max(self.now, min(times))
            same_instant = same_instant + 1 if t == self.now else 0
            assert same_instant < LIVELOCK_STEPS, f"livelock: time stuck at {t!r}"
            self.now = t
            if self._verdicts and self._verdicts[0][0] <= t:
                _, side, shard_id, ok = heapq.heappop(self._verdicts)
                self.sessions[side].shard_verified(shard_id, ok, t)
                self.service(side)
            elif self._heap and self._heap[0][0] <= t:
                _, _, side, path_id, datagram = heapq.heappop(self._heap)
                opened = self.opener[side].open(datagram)
                if opened is not None:
                    assert opened.header.path_id == path_id
                    self.delivered.append(Delivered(t, side, path_id, opened.header.packet_number,
                                                    opened.frames))
                    self.sessions[side].receive_packet(path_id, opened.header.packet_number,
                                                       opened.frames, t)
                self.service(side)
            else:
                for side in "ab":
                    deadline = self.sessions[side].next_deadline()
                    if deadline is not None and deadline <= t:
                        self.sessions[side].on_deadline(t)
                        self.service(side)
            for check in self.checks:
                check(self)
            if stop is not None and stop(self):
                return

    def received(self, side: str) -> list[ShardReceived]:
        return [e for _, e in self.events[side] if isinstance(e, ShardReceived)]

    def acknowledged(self, side: str) -> list[ShardAcknowledged]:
        return [e for _, e in self.events[side] if isinstance(e, ShardAcknowledged)]


def make_config(paths: int = 2, **overrides: object) -> SessionConfig:
    return SessionConfig(paths=tuple(PathConfig(f"p{i}") for i in range(paths)), tag_bytes=0,
                         **overrides)  # type: ignore[arg-type]


def payloads(count: int, size: int, seed: int = 1) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(size) for _ in range(count)]


def all_acknowledged(count: int) -> Callable[[Pair], bool]:
    return lambda pair: len(pair.acknowledged("a")) >= count


def data_frames(frames: list[Frame]) -> list[DataFrame]:
    return [f for f in frames if isinstance(f, DataFrame)]


# -- completion and integrity ---------------------------------------------------------


def test_shard_reported_only_when_complete_and_verified() -> None:
    shards = payloads(6, 40_000)
    first_chunk_drops = [0]

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        # Withhold the first byte of shard 0 three times: the shard must wait for it.
        if any(f.shard_id == 0 and f.offset == 0 for f in data_frames(frames)) and first_chunk_drops[0] < 3:
            first_chunk_drops[0] += 1
            return True
        return False

    seen: set[int] = set()

    def check(pair: Pair) -> None:
        for event in pair.received("b"):
            if event.shard_id in seen:
                continue
            seen.add(event.shard_id)
            assert event.ok
            assert bytes(pair.buffers["b"][event.shard_id]) == shards[event.shard_id], (
                "reported received before every byte was in place")

    # Without the coded tail: the withheld byte must arrive as DATA, not be rebuilt from repair.
    pair = Pair(make_config(fec="off"), owd_s=[0.01, 0.03], rate_bps=[20e6, 10e6], drop=drop, checks=[check])
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    assert first_chunk_drops[0] == 3
    assert sorted(e.shard_id for e in pair.received("b")) == list(range(len(shards)))
    acked = sorted((e.shard_id, e.ok) for e in pair.acknowledged("a"))
    assert acked == [(i, True) for i in range(len(shards))]
    first_byte_arrival = min(d.at for d in pair.delivered if d.side == "b" and any(
        f.shard_id == 0 and f.offset == 0 for f in data_frames(d.frames)))
    (received_0,) = [at for at, e in pair.events["b"] if isinstance(e, ShardReceived) and e.shard_id == 0]
    assert received_0 >= first_byte_arrival
    assert pair.a.sending_done


def test_corrupted_data_byte_is_caught_by_the_digest_never_reported_ok() -> None:
    shards = payloads(4, 30_000, seed=2)
    victim = 2
    corrupted = [False]

    def mutate(side: str, path_id: int, at: float, datagram: bytes) -> bytes:
        if corrupted[0] or side != "a":
            return datagram
        frames = decode_frames(datagram[HEADER_LEN:])
        if len(frames) == 1 and isinstance(frames[0], DataFrame) and frames[0].shard_id == victim \
                and frames[0].offset > 0:
            damaged = bytearray(datagram)
            damaged[HEADER_LEN + 15 + 7] ^= 0x20  # a byte of the DATA frame's data
            corrupted[0] = True
            return bytes(damaged)
        return datagram

    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6], mutate=mutate)
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    assert corrupted[0]
    received = {e.shard_id: e.ok for e in pair.received("b")}
    acknowledged = {e.shard_id: e.ok for e in pair.acknowledged("a")}
    assert received == {0: True, 1: True, 2: False, 3: True}
    assert acknowledged == {0: True, 1: True, 2: False, 3: True}
    assert [e.shard_id for e in pair.received("b")].count(victim) == 1, "reported exactly once"


def test_deferred_verification_hands_over_only_after_the_verdict() -> None:
    """The driver checks digests off its loop: nothing is reported or acknowledged before its
    verdict, each shard is announced for checking once, and a corrupted shard still fails."""
    shards = payloads(4, 30_000, seed=3)
    victim = 1
    corrupted = [False]

    def mutate(side: str, path_id: int, at: float, datagram: bytes) -> bytes:
        frames = decode_frames(datagram[HEADER_LEN:])
        if corrupted[0] or side != "a" or not (len(frames) == 1 and isinstance(frames[0], DataFrame)
                                               and frames[0].shard_id == victim):
            return datagram
        damaged = bytearray(datagram)
        damaged[HEADER_LEN + 15 + 3] ^= 0x01
        corrupted[0] = True
        return bytes(damaged)

    delay = 0.2  # longer than a round trip, so the sender keeps retransmitting meanwhile
    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6], mutate=mutate,
                verify_after_s=delay)
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    filled = {e.shard_id: at for at, e in pair.events["b"] if isinstance(e, ShardFilled)}
    received = {e.shard_id: (at, e.ok) for at, e in pair.events["b"] if isinstance(e, ShardReceived)}
    acknowledged = {e.shard_id: (at, e.ok) for at, e in pair.events["a"] if isinstance(e, ShardAcknowledged)}
    assert sorted(filled) == sorted(received) == sorted(acknowledged) == list(range(len(shards)))
    assert [e.shard_id for _, e in pair.events["b"] if isinstance(e, ShardFilled)].count(victim) == 1
    for shard_id, at in filled.items():
        assert received[shard_id][0] == pytest.approx(at + delay)
        assert acknowledged[shard_id][0] > at + delay
    assert {i: ok for i, (_, ok) in received.items()} == {0: True, 1: False, 2: True, 3: True}
    assert {i: ok for i, (_, ok) in acknowledged.items()} == {0: True, 1: False, 2: True, 3: True}
    for i in (0, 2, 3):
        assert bytes(pair.buffers["b"][i]) == shards[i]


def test_a_verdict_for_no_pending_shard_is_ignored() -> None:
    session = Session(make_config(), defer_verification=True)
    session.shard_verified(7, True, 0.0)
    assert list(session.events()) == []
    assert session.poll_transmit(0.0) == []


def acknowledged_pns(session: Session, now: float) -> set[int]:
    session.on_deadline(now)  # the ack timer
    acks = [f for tx in session.poll_transmit(now) for f in tx.frames if isinstance(f, AckFrame)]
    return {pn for ack in acks for lo, hi in ack.ranges for pn in range(lo, hi + 1)}


def test_data_before_its_shard_open_is_held_acknowledged_and_placed_on_open() -> None:
    data = b"abcdefgh"
    b = Session(make_config(paths=1))
    b.receive_packet(0, 0, [DataFrame(5, 4, 4, memoryview(bytearray(data[4:])))], 0.0)
    assert b.counters.data_dropped == 0
    assert 0 in acknowledged_pns(b, 1.0)  # held: the sender need not re-send it
    assert b.events() == []
    b.receive_packet(0, 1, [ShardOpenFrame(5, 8, shard_digest(data))], 1.1)
    b.receive_packet(0, 2, [DataFrame(5, 0, 4, data[:4])], 1.2)
    received = [e for e in b.events() if isinstance(e, ShardReceived)]
    assert [(e.shard_id, e.ok) for e in received] == [(5, True)]  # the held half was placed, bytes intact


def test_early_data_past_the_hold_limit_is_dropped_unacknowledged() -> None:
    b = Session(make_config(paths=1))
    b._rx.early.limit = 6
    b.receive_packet(0, 0, [DataFrame(5, 0, 4, b"abcd")], 0.0)  # held
    b.receive_packet(0, 1, [DataFrame(5, 4, 4, b"efgh")], 0.0)  # 8 > 6 bytes: dropped
    assert (b.counters.data_dropped, b._rx.early.refused) == (1, 1)
    b.receive_packet(0, 2, [ProbeFrame(9)], 0.002)  # eliciting and accepted: acknowledged
    acked = acknowledged_pns(b, 1.0)
    assert {0, 2} <= acked and 1 not in acked  # the ACK leaves the dropped packet out


def test_early_data_outside_the_shard_its_open_announces_closes_the_session() -> None:
    b = Session(make_config(paths=1))
    b.receive_packet(0, 0, [DataFrame(5, 100, 4, b"abcd")], 0.0)  # held and acknowledged
    b.receive_packet(0, 1, [ShardOpenFrame(5, 50, bytes(32))], 0.1)  # ... but the shard has 50 bytes
    closed = [e for e in b.events() if isinstance(e, SessionClosed)]
    assert len(closed) == 1 and "outside" in closed[0].error and b.closed is not None


def test_data_that_overtakes_its_shard_open_is_held_not_resent() -> None:
    """Both copies of shard 1's OPEN are lost: its DATA arrives first, is held and acknowledged."""
    shards = payloads(3, 50_000, seed=3)
    dropped_opens = [0]

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        if any(isinstance(f, ShardOpenFrame) and f.shard_id == 1 for f in frames) and dropped_opens[0] < 2:
            dropped_opens[0] += 1
            return True
        return False

    # Without the coded tail: a REPAIR of the unopened shard is dropped (and counted) too.
    pair = Pair(make_config(fec="off"), owd_s=[0.01, 0.015], rate_bps=[20e6, 20e6], drop=drop)
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    assert dropped_opens[0] == 2
    opened_at = min(d.at for d in pair.delivered if d.side == "b" and any(
        isinstance(f, ShardOpenFrame) and f.shard_id == 1 for f in d.frames))
    early = {(d.path_id, d.packet_number) for d in pair.delivered
             if d.side == "b" and d.at < opened_at and any(f.shard_id == 1 for f in data_frames(d.frames))}
    assert early, "the scenario must deliver shard 1 data before its SHARD_OPEN"
    acked = {(ack.path_id, pn) for d in pair.delivered if d.side == "a"
             for ack in d.frames if isinstance(ack, AckFrame)
             for lo, hi in ack.ranges for pn in range(lo, hi + 1)}
    assert early <= acked, "early DATA was held, so it is acknowledged"
    assert pair.b.counters.data_dropped == 0
    assert sum(p.counters.retransmitted_bytes for p in pair.a.paths) == 0  # nothing had to be re-sent
    assert all(e.ok for e in pair.received("b")) and len(pair.received("b")) == 3
    assert sorted((e.shard_id, e.ok) for e in pair.acknowledged("a")) == [(0, True), (1, True), (2, True)]


# -- receive credit -------------------------------------------------------------------------


def test_sender_never_exceeds_receive_credit() -> None:
    budget = 64 * 1024
    shards = payloads(16, 16 * 1024, seed=4)
    blocked = [0]

    def check(pair: Pair) -> None:
        held = pair.b.incoming.budget.opened - pair.b.incoming.budget.released
        assert held <= budget
        if pair.a.outgoing.waiting:
            blocked[0] += 1  # a submitted shard is held back for lack of credit
        assert pair.a.outgoing.credit.used <= pair.a.outgoing.credit.limit
        assert pair.b.incoming.protocol_errors == 0, "the receiver never had to refuse an opening"

    config = make_config(receive_budget_bytes=budget, peer_credit_bytes=budget)
    pair = Pair(config, owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6], checks=[check])
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    assert sorted(e.shard_id for e in pair.received("b") if e.ok) == list(range(16))
    assert blocked[0] > 0, "the budget must actually constrain this transfer"
    assert pair.a.outgoing.credit.limit == budget + 16 * 16 * 1024


# -- path failure and readmission -----------------------------------------------------------


def test_blackholed_path_fails_its_data_moves_and_it_is_readmitted() -> None:
    down_from, down_until = 0.08, 2.5
    shards = payloads(8, 128 * 1024, seed=5)

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        return path_id == 1 and down_from <= at < down_until

    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[30e6, 30e6], drop=drop)
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=down_until)  # keep running after completion: failure takes a few probe timeouts

    assert len(pair.received("b")) == len(shards), "the transfer finishes on the surviving path"
    assert all(e.ok for e in pair.received("b"))
    changes = [e for _, e in pair.events["a"] if isinstance(e, PathChanged)]
    transitions = [(e.old, e.new) for e in changes if e.path_id == 1]
    assert transitions[:2] == [("active", "degraded"), ("degraded", "failed")]
    assert not [e for e in changes if e.path_id == 0]
    lost = {(f.shard_id, o) for side, path_id, at, frames in pair.dropped if side == "a" and path_id == 1
            for f in data_frames(frames) for o in range(f.offset, f.offset + f.length, 997)}
    assert lost, "path 1 was carrying data when it went down"
    via_path_0 = [(f.shard_id, f.offset, f.offset + f.length) for d in pair.delivered
                  if d.side == "b" and d.path_id == 0 for f in data_frames(d.frames)]
    for shard_id, offset in lost:
        assert any(s == shard_id and lo <= offset < hi for s, lo, hi in via_path_0), (
            f"byte {offset} of shard {shard_id} lost on path 1 never arrived on path 0")
    for i, data in enumerate(shards):
        assert hashlib.sha256(pair.buffers["b"][i]).digest() == hashlib.sha256(data).digest()

    failed_events = len(transitions)
    pair.run(until=down_until + 3.0)
    later = [(e.old, e.new) for _, e in pair.events["a"]
             if isinstance(e, PathChanged) and e.path_id == 1][failed_events:]
    assert ("failed", "probing") in later, f"path 1 was not readmitted: {later}"
    assert pair.a.paths[1].usable


# -- batched receive (native data path) -------------------------------------------------------


def feed_one_by_one(session: Session, pns: list[int], offsets: list[int], data: bytes, chunk: int) -> None:
    for pn, offset in zip(pns, offsets, strict=True):
        session.receive_packet(0, pn, [DataFrame(9, offset, min(chunk, len(data) - offset),
                                                 data[offset:offset + chunk])], 0.5)


@pytest.mark.parametrize("first_pn", [1, 5])  # right after the open packet, or after a gap
def test_receive_data_run_equals_one_packet_at_a_time(first_pn: int) -> None:
    """The native path's batched call must leave the session exactly as per-packet calls would."""
    data = random.Random(9).randbytes(10 * 1000)
    chunk, count = 1000, 6
    sessions = []
    for batched in (False, True):
        buffers: dict[int, memoryview] = {}

        def allocate(shard_id: int, size: int, meta: bytes, into: dict[int, memoryview] = buffers
                     ) -> memoryview:
            into[shard_id] = memoryview(bytearray(size))
            return into[shard_id]

        session = Session(make_config(paths=1, ack_threshold=100), allocator=allocate)
        session.receive_packet(0, 0, [ShardOpenFrame(9, len(data), shard_digest(data))], 0.0)
        pns = list(range(first_pn, first_pn + count))
        offsets = [i * chunk for i in range(count)]
        if batched:
            buffers[9][:count * chunk] = data[:count * chunk]  # the native receiver placed the bytes
            session.receive_data_run(0, first_pn, count, 9, 0, count * chunk, 0.5)
        else:
            feed_one_by_one(session, pns, offsets, data, chunk)
        # the rest of the shard arrives one packet at a time in both cases
        rest = list(range(count * chunk, len(data), chunk))
        feed_one_by_one(session, list(range(first_pn + count, first_pn + count + len(rest))), rest, data,
                        chunk)
        sessions.append(session)

    plain, batched_session = sessions
    for a, b in [(plain.paths[0].acks, batched_session.paths[0].acks)]:
        assert a.received.ranges() == b.received.ranges()
        assert (a.largest, a.unacked_eliciting, a.ack_now) == (b.largest, b.unacked_eliciting, b.ack_now)
    received = [[e for e in s.events() if isinstance(e, ShardReceived)] for s in sessions]
    assert received[0] == received[1] and received[0][0].ok

    def acks(session: Session) -> list[AckFrame]:
        return [f for tx in session.poll_transmit(1.0) for f in tx.frames if isinstance(f, AckFrame)]

    assert [a.ranges for a in acks(plain)] == [a.ranges for a in acks(batched_session)]


def test_the_ack_delay_covers_the_time_a_run_waited_in_the_driver() -> None:
    """A receive hold-off delays the ACK: the delay it reports starts at the arrival, so the
    sender's round-trip sample leaves the hold out (``core.holdoff``)."""
    delays = []
    for held_s in (0.0, 0.004):
        session = Session(make_config(paths=1, ack_threshold=1))
        session.receive_packet(0, 0, [ShardOpenFrame(9, 8000, bytes(32))], 0.0)
        session.poll_transmit(0.0)
        session.receive_data_run(0, 1, 4, 9, 0, 4000, 0.5, held_s)
        [ack] = [f for tx in session.poll_transmit(0.5) for f in tx.frames if isinstance(f, AckFrame)]
        delays.append(ack.ack_delay_us)
    assert delays[1] - delays[0] == 4000


def test_receive_data_run_for_an_unopened_shard_is_not_acknowledged() -> None:
    session = Session(make_config(paths=1))
    session.receive_data_run(0, 0, 4, 3, 0, 4000, 0.0)
    assert session.counters.data_dropped >= 1
    assert session.paths[0].acks.received.total == 0
    assert not [f for tx in session.poll_transmit(1.0) for f in tx.frames if isinstance(f, AckFrame)]


# -- closing and user errors ------------------------------------------------------------------


def test_close_reaches_the_peer_and_stops_submissions() -> None:
    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[10e6, 10e6])
    pair.a.close(pair.now, 7, "step done")
    pair.service("a")
    pair.run(until=1.0)
    closed = [e for _, e in pair.events["b"] if isinstance(e, SessionClosed)]
    assert [(e.code, e.error) for e in closed] == [(7, "step done")]
    with pytest.raises(RuntimeError):
        pair.a.submit(1, b"late", pair.now)


@pytest.mark.parametrize("shard_id,data", [(-1, b"x"), (1 << 32, b"x"), (0, b"")])
def test_submit_rejects_bad_shards(shard_id: int, data: bytes) -> None:
    with pytest.raises(ValueError):
        Session(make_config()).submit(shard_id, data, 0.0)


@pytest.mark.parametrize("kwargs,field", [
    ({"paths": ()}, "path"),
    ({"paths": (PathConfig("tiny", mtu=60),)}, "tiny"),
    ({"chunk_bytes": 0}, "chunk_bytes"),
    ({"ack_threshold": 0}, "ack_threshold"),
    ({"initial_cwnd_packets": 0}, "initial_cwnd_packets"),
    ({"failed_probe_interval_s": 0.0}, "failed_probe_interval_s"),
    ({"max_probe_interval_s": -1.0}, "max_probe_interval_s"),
])
def test_config_errors_name_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"paths": (PathConfig("p0"),), **kwargs}
    with pytest.raises(ValueError, match=field):
        SessionConfig(**args)  # type: ignore[arg-type]


@pytest.mark.parametrize("cc", ["bbr", "cubic"])
@pytest.mark.parametrize("segments", [1, 4, 16, 32])
def test_initial_window_counts_datagrams_whatever_a_core_packet_holds(cc: str, segments: int) -> None:
    """A core packet of many datagrams must not multiply the first flight on the wire."""
    path = PathConfig("p0", mtu=1500)
    plain = SessionConfig(paths=(path,), congestion_control=cc_config(cc), initial_cwnd_packets=64)
    datagram = plain.datagram_payload(path)
    chunked = SessionConfig(paths=(path,), congestion_control=cc_config(cc), initial_cwnd_packets=64,
                            chunk_bytes=segments * datagram)
    overhead = chunked.packet_overhead()
    window = Session(chunked).paths[0].cc.cwnd_bytes
    payload = window * chunked.data_payload(path) // (chunked.data_payload(path) + overhead)
    # 64 datagrams' payload, rounded up to whole core packets (at least the controllers' 4).
    expected_packets = max(4, -(-64 // segments))
    assert payload == expected_packets * segments * datagram
    assert Session(plain).paths[0].cc.cwnd_bytes == 64 * (datagram + plain.packet_overhead())


def test_unknown_scheduler_is_named() -> None:
    """(Unknown controller names: cc_config, tests/test_cc_registry.py.)"""
    with pytest.raises(ValueError, match="valid"):
        Session(make_config(scheduler="fastest"))


def test_shard_larger_than_the_peer_budget_is_refused_at_submit() -> None:
    session = Session(make_config(receive_budget_bytes=64 * 1024, peer_credit_bytes=64 * 1024))
    with pytest.raises(ValueError, match="budget|credit"):
        session.submit(0, bytes(100 * 1024), 0.0)


def test_sender_releases_the_shard_buffer_once_acknowledged() -> None:
    data = np.frombuffer(random.Random(3).randbytes(64 * 1024), dtype=np.uint8).copy()
    alive = weakref.ref(data)
    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6])
    pair.submit("a", 0, data)  # type: ignore[arg-type]
    del data
    pair.run(until=10.0, stop=all_acknowledged(1))
    assert [e.ok for e in pair.acknowledged("a")] == [True]
    gc.collect()
    assert alive() is None, "the sender still holds the application's buffer"


def test_a_long_session_keeps_no_state_per_finished_shard() -> None:
    """A warm daemon session carries shards for months: once acknowledged, a shard leaves
    the sender's and receiver's tables (only merged id ranges and byte totals remain)."""
    pair = Pair(make_config(), owd_s=[0.01, 0.02], rate_bps=[20e6, 20e6])
    shards = payloads(40, 20_000)
    for wave in range(4):
        for i in range(wave * 10, wave * 10 + 10):
            pair.submit("a", i, shards[i])
        pair.run(until=30.0 * (wave + 1), stop=all_acknowledged(wave * 10 + 10))
    a, b = pair.a, pair.b
    assert sorted(e.shard_id for e in pair.acknowledged("a")) == list(range(40))
    assert a.outgoing.shards == {} and b.incoming.shards == {}
    assert len(a.outgoing.finished) == 1 and len(b.incoming.finished) == 1
    assert all(not p.needs_open for p in a.paths)
    assert a.stats().acked_bytes == sum(len(d) for d in shards)  # still counts the finished ones
    hedger = a.scheduler.hedger  # type: ignore[attr-defined]
    assert a.stats().hedged_bytes > 0 and hedger.hedged == set(), "every tail was hedged, none is kept"
    with pytest.raises(ValueError):
        pair.a.submit(3, b"again", pair.now)  # a finished id is still refused


def test_a_path_whose_shard_open_is_lost_is_not_left_silent() -> None:
    """Every OPEN on the longer path is lost: the copy on the shortest path opens the shards.

    Without that copy, the longer path's DATA of such a shard went unacknowledged
    (unknown shard) and the path heard nothing until its probe timeout suspected it.
    """
    shards = payloads(4, 200_000, seed=5)
    lost_opens = [0]
    ptos = [0]

    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        if side == "a" and path_id == 1 and any(isinstance(f, ShardOpenFrame) for f in frames):
            lost_opens[0] += 1
            return True
        return False

    def no_probe_timeout(pair: Pair) -> None:
        ptos[0] = max(ptos[0], pair.a.paths[1].loss.pto_count)

    pair = Pair(make_config(), owd_s=[0.005, 0.04], rate_bps=[20e6, 20e6], drop=drop,
                checks=[no_probe_timeout])
    for i, data in enumerate(shards):
        pair.submit("a", i, data)
    pair.run(until=30.0, stop=all_acknowledged(len(shards)))

    assert lost_opens[0] > 0, "the longer path must have sent (and lost) OPENs of its own"
    assert sorted((e.shard_id, e.ok) for e in pair.acknowledged("a")) == [(i, True) for i in range(4)]
    assert ptos[0] == 0, "the longer path waited for a probe timeout"
    assert pair.b.counters.data_dropped == 0


# -- pacing wake-ups served late --------------------------------------------------------


@pytest.mark.parametrize("late_s, counted", [(0.0, 0), (0.001, 0), (0.005, 5)])
def test_pacing_wake_ups_served_late_are_counted(late_s: float, counted: int) -> None:
    """A driver whose loop runs the pacing timer late (short of CPU) shows in ``late_wakes``;
    on time, or within a timer's granularity, it does not."""
    config = SessionConfig(paths=(PathConfig("p0", max_rate_bps=10e6),), tag_bytes=0)
    session = Session(config)
    session.submit(0, bytes(1_000_000), 0.0)
    assert session.poll_transmit(0.0)
    for _ in range(5):
        due = session.next_deadline()
        assert due is not None and session.paths[0].pacing_wake == due  # held by pacing
        session.on_deadline(due + late_s)
        assert session.poll_transmit(due + late_s)
    assert session.stats().paths[0].late_wakes == counted


def test_a_pacing_wake_judges_nothing_and_a_probe_timeout_does() -> None:
    """A driver reads its sockets before a deadline that acts on what the peer sent or failed
    to send (here a probe timeout: nothing was acknowledged), not before one that only wakes
    the pacing: ``judgement_due`` tells the two apart."""
    config = SessionConfig(paths=(PathConfig("p0", max_rate_bps=10e6),), tag_bytes=0)
    session = Session(config)
    session.submit(0, bytes(1_000_000), 0.0)
    assert session.poll_transmit(0.0)
    due = session.next_deadline()
    assert due is not None and session.paths[0].pacing_wake == due
    assert not session.judgement_due(due)
    assert not session.judgement_due(due - 1e-3)
    pto = session.paths[0].loss.pto_deadline(config.max_ack_delay_s)
    assert pto is not None and pto > due
    assert session.paths[0].judged_at(config.max_ack_delay_s) == pto
    assert session.judgement_due(pto)
