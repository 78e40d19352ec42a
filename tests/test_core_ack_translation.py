"""The session translates ACKs of wire numbers: whole core packets, partial confirmation, skipping."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core import numbering as numbering_module
from wanxport.core import session as session_module
from wanxport.core import transmitter as transmitter_module
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.ranges import RangeSet
from wanxport.core.recovery import LossDetector
from wanxport.core.session import Session
from wanxport.core.transmit import Transmit
from wanxport.wire.frames import AckFrame, DataFrame

SEGMENT, SEGMENTS = 1000, 4


def segmented(**extra: object) -> SessionConfig:
    return SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=SEGMENT * SEGMENTS,
                         segment_bytes=SEGMENT, **extra)  # type: ignore[arg-type]


def first_wire(transmits: list[Transmit]) -> list[int]:
    """Core packet number (in handing-out order on path 0) -> its first wire number."""
    return [tx.first_pn for tx in transmits if tx.path_id == 0]


def test_transmits_number_every_datagram_on_the_wire() -> None:
    session = Session(segmented(), allocator=None)
    session.submit(0, bytes(10_500), 0.0)
    transmits = session.poll_transmit(0.0)
    data = [tx for tx in transmits if isinstance(tx.frames[0], DataFrame)]
    assert [tx.count for tx in data] == [4, 4, 3]  # 4000 + 4000 + 2500 bytes of 1000-byte datagrams
    expected = 0
    for tx in transmits:
        assert tx.first_pn == expected and tx.segment_size == SEGMENT
        expected += tx.count
    overhead = session.config.packet_overhead() + 15  # header + tag + DATA frame header
    assert data[2].size == 3 * overhead + 2500


def test_a_lost_datagram_resends_only_its_own_bytes() -> None:
    """Core packets of 4 datagrams; the peer acknowledges all but one datagram. Once the
    core declares that packet lost, only the missing datagram's bytes are queued again."""
    session = Session(segmented(), allocator=None)
    session.submit(0, bytes(range(256)) * 160, 0.0)  # 40 960 bytes: 10+ core packets
    transmits = session.poll_transmit(0.0)
    assert sum(tx.count for tx in transmits) >= 8
    first_data = next(tx for tx in transmits if isinstance(tx.frames[0], DataFrame))
    frame = first_data.frames[0]
    assert isinstance(frame, DataFrame)
    missing = first_data.first_pn + 2
    top = transmits[-1].first_pn + transmits[-1].count - 1
    session.receive_packet(0, 0, [AckFrame(0, 0, ((missing + 1, top), (0, missing - 1)))], 0.05)
    session.on_deadline(1.0)  # the time threshold has long passed: the packet is lost
    outgoing = session.outgoing
    assert outgoing.retransmit_bytes == SEGMENT
    assert list(outgoing.retransmit) == [(0, frame.offset + 2 * SEGMENT, SEGMENT)]


@pytest.mark.skipif(session_module.__file__.endswith(".so"),
                    reason="patches a core method; a mypyc-compiled core does not let it be replaced")
def test_ranges_below_what_is_outstanding_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ACK repeats its old ranges; once the packets they name are settled they do not
    reach loss recovery again, and the rest still does."""
    session = Session(segmented(), allocator=None)
    session.submit(0, bytes(range(256)) * 160, 0.0)
    starts = first_wire(session.poll_transmit(0.0))
    settled = starts[3] - 1  # the first three core packets, acknowledged in full
    seen: list[tuple[tuple[int, int], ...]] = []
    original = LossDetector.on_ack
    monkeypatch.setattr(LossDetector, "on_ack",
                        lambda loss, ranges, delay, now, *arrived: (
                            seen.append(ranges), original(loss, ranges, delay, now, *arrived))[1])
    session.receive_packet(0, 0, [AckFrame(0, 0, ((0, settled),))], 0.05)
    assert seen[-1] == ((0, 2),)
    new = (starts[3], starts[4] - 1)
    session.receive_packet(0, 1, [AckFrame(0, 7, (new, (0, settled)))], 0.06)
    assert seen[-1] == ((3, 3),)  # the repeated range is gone
    assert not session.paths[0].loss.is_outstanding(3)
    session.receive_packet(0, 2, [AckFrame(0, 7, ((0, settled),))], 0.07)
    assert len(seen) == 2  # only old ranges: nothing reached recovery


class EveryRange(numbering_module.WireNumbering):
    """The reference: every ACK range is translated, repeated or not."""

    __slots__ = ()

    def unseen(self, wire_ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        return wire_ranges


def sender_state(session: Session) -> tuple[object, ...]:
    path = session.paths[0]
    shard = session.outgoing.shards.get(0)
    loss = path.loss
    return ([p.pn for p in loss.outstanding()], loss.largest_acked, loss.bytes_in_flight,
            loss.counters.packets_lost, loss.counters.spurious_losses, loss.remembered_losses(),
            sorted(session.outgoing.retransmit), shard.acked.ranges() if shard else None)


@pytest.mark.skipif(session_module.__file__.endswith(".so"),
                    reason="swaps the transmitter's WireNumbering class; a mypyc-compiled module "
                           "binds it natively, so the swap would compare a session with itself")
@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_skipping_repeated_ranges_leaves_the_sender_exactly_as_translating_all(data: st.DataObject) -> None:
    """Random datagram loss, late arrivals that close gaps, ACKs of the last 32 ranges
    delivered in a shuffled order, loss timers in between: the sender ends in the same
    state whether repeated ranges are skipped or translated again."""
    sides = []
    tops = []
    for numbering_type in (numbering_module.WireNumbering, EveryRange):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(transmitter_module, "WireNumbering", numbering_type)
            session = Session(segmented(), allocator=None)
        session.submit(0, bytes(200_000), 0.0)
        transmits = session.poll_transmit(0.0)
        tops.append(transmits[-1].first_pn + transmits[-1].count)
        sides.append(session)
    assert tops[0] == tops[1]
    top = tops[0]
    arrived = sorted(data.draw(st.sets(st.integers(0, top - 1), max_size=top), label="arrived"))
    late = data.draw(st.sets(st.sampled_from(arrived), max_size=8), label="late") if arrived else set()
    received = RangeSet()
    acks = []
    for pn in [p for p in arrived if p not in late] + sorted(late):
        received.add(pn, pn + 1)
        ranges = tuple((lo, hi - 1) for lo, hi in received.last(32))
        acks.append(AckFrame(0, 0, ranges))
    order = data.draw(st.permutations(range(len(acks))), label="delivery order") if acks else []
    now = 0.05
    for index in order:
        now += data.draw(st.sampled_from([0.0, 0.001, 0.2]), label="gap")
        for session in sides:
            session.on_deadline(now)
            session.receive_packet(0, 0, [acks[index]], now)
    assert sender_state(sides[0]) == sender_state(sides[1])


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.integers(0, 4500), st.integers(0, 4500)), max_size=12))
def test_overlapping_confirmations_count_each_byte_once(spans: list[tuple[int, int]]) -> None:
    """However the confirmed parts of one packet overlap, the rate estimate is credited with
    the packet's share of their union, and the shard learns exactly those bytes."""
    session = Session(SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=4000), allocator=None)
    session.submit(0, bytes(40_000), 0.0)
    session.poll_transmit(0.0)
    path = session.paths[0]
    packet = next(p for p in path.loss.outstanding() if p.chunks)
    pn = packet.pn
    (shard_id, offset, length), = packet.chunks  # type: ignore[misc]
    before = path.rate.delivered_bytes
    union: set[int] = set()
    for a, b in spans:
        start, end = min(a, b), max(a, b)
        session._acks._confirm_part(path, pn, start, end, 0.01)  # the unit under an ACK's partial cover
        union |= set(range(start, min(end, length)))
    assert packet.credited == packet.size * len(union) // length
    assert path.rate.delivered_bytes - before == packet.credited
    acked = session.outgoing.shards[shard_id].acked
    assert acked.total == len(union)
    assert all(acked.contains(offset + i, offset + i + 1) for i in union)


def test_the_arrived_part_of_a_packet_counts_as_delivered_once() -> None:
    """A core packet of 4 datagrams missing one: its other 3 count as delivered for the rate
    estimate when the ACK says so (not only if the packet is ever acknowledged whole), and
    acknowledging it whole later adds only the rest."""
    session = Session(segmented(), allocator=None)
    session.submit(0, bytes(40_000), 0.0)
    starts = first_wire(session.poll_transmit(0.0))
    path = session.paths[0]
    first = 1  # core packet 0 is the SHARD_OPEN
    sizes = {p.pn: p.size for p in path.loss.outstanding()}
    chunk = next(p for p in path.loss.outstanding() if p.pn == first).chunks[0][2]  # type: ignore[index]
    hole = starts[first] + 2
    top = starts[first + 3] - 1  # core packets first .. first + 2
    session.receive_packet(0, 0, [AckFrame(0, 0, ((hole + 1, top), (0, hole - 1)))], 0.05)
    whole = sizes[0] + sizes[first + 1] + sizes[first + 2]
    partial = sizes[first] * 3 * SEGMENT // chunk
    assert path.rate.delivered_bytes == whole + partial
    assert session.outgoing.shards[0].acked.total >= 3 * SEGMENT * 2 + 3 * SEGMENT
    # The missing datagram arrives late: the packet is acknowledged whole, counted once.
    session.receive_packet(0, 1, [AckFrame(0, 0, ((0, top),))], 0.06)
    assert not path.loss.is_outstanding(first)
    assert path.rate.delivered_bytes == whole + sizes[first]


def test_handshake_probes_take_numbers_outside_every_core_packet() -> None:
    session = Session(SessionConfig(paths=(PathConfig("a"), PathConfig("b"))), allocator=None)
    probes = session.handshake_probes(0.0)
    assert [(tx.path_id, tx.first_pn, tx.count) for tx in probes] == [(0, 0, 1), (1, 0, 1)]
    session.submit(0, bytes(5000), 0.0)
    assert min(tx.first_pn for tx in session.poll_transmit(0.0) if tx.path_id == 0) == 1
    with pytest.raises(ValueError, match="before the first core packet"):
        session.handshake_probes(0.1)
