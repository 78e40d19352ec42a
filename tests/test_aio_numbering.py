"""Wire numbering and send planning: pure logic under the asyncio endpoint."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.aio.feed import receive_control
from wanxport.aio.numbering import WireNumbering
from wanxport.aio.plan import ControlPlan, DataPlan, plan_transmits
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.ranges import RangeSet
from wanxport.core.session import Session, Transmit
from wanxport.wire.frames import AckFrame, DataFrame, ProbeFrame


def numbering_with(counts: list[int]) -> WireNumbering:
    numbering = WireNumbering()
    for core_pn, count in enumerate(counts):
        numbering.allocate(core_pn, count)
    return numbering


def test_allocate_hands_out_contiguous_wire_numbers() -> None:
    numbering = WireNumbering()
    assert [numbering.allocate(pn, c) for pn, c in enumerate([3, 1, 4])] == [0, 3, 4]
    assert numbering.next_wire == 8


def test_allocate_refuses_out_of_order_core_numbers() -> None:
    numbering = numbering_with([1])
    with pytest.raises(ValueError, match="out of order"):
        numbering.allocate(5, 1)


@pytest.mark.parametrize(
    ("wire_ranges", "core_ranges"),
    [
        (((0, 7),), ((0, 2),)),  # everything: packets 0 (0-2), 1 (3), 2 (4-7)
        (((4, 7), (0, 2)), ((2, 2), (0, 0))),  # wire 3 missing: packet 1 is not acknowledged
        (((1, 7),), ((1, 2),)),  # wire 0 missing: packet 0 is not
        (((0, 5),), ((0, 1),)),  # packet 2 half acknowledged: not yet
        (((5, 6),), ()),
    ],
)
def test_ack_ranges_cover_whole_core_packets_only(wire_ranges: tuple[tuple[int, int], ...],
                                                  core_ranges: tuple[tuple[int, int], ...]) -> None:
    numbering = numbering_with([3, 1, 4])
    assert numbering.core_ranges(wire_ranges) == core_ranges


def test_translate_keeps_path_and_delay_and_drops_empty_acks() -> None:
    numbering = numbering_with([2, 2])
    assert numbering.translate(AckFrame(3, 250, ((0, 3),))) == AckFrame(3, 250, ((0, 1),))
    assert numbering.translate(AckFrame(3, 250, ((1, 2),))) is None


def tx(path: int, pn: int, frames: list, not_before: float = 0.0) -> Transmit:  # type: ignore[type-arg]
    return Transmit(path, pn, frames, 0, not_before)


def test_plan_merges_contiguous_whole_segment_transmits_into_one_burst() -> None:
    buffers = {7: memoryview(bytes(100))}
    numbering = [WireNumbering(), WireNumbering()]
    transmits = [
        tx(0, 0, [DataFrame(7, 0, 20)]),
        tx(0, 1, [DataFrame(7, 20, 20)]),
        tx(1, 0, [DataFrame(7, 40, 15)]),  # other path: its own plan
        tx(0, 2, [DataFrame(7, 40, 5)]),  # contiguous on path 0: merged (20 % 10 == 0)
        tx(0, 3, [DataFrame(7, 45, 10)]),  # previous one ends mid-segment: new burst
        tx(0, 4, [ProbeFrame(1)]),
        tx(0, 5, [DataFrame(7, 55, 10)]),  # after a control datagram: new burst
    ]
    plans = plan_transmits(transmits, numbering, [10, 10], buffers.__getitem__)
    summary = [(type(p).__name__, p.path_id, p.first_pn if isinstance(p, DataPlan) else p.pn,
                getattr(p, "offset", None), getattr(p, "length", None)) for p in plans]
    assert summary == [
        ("DataPlan", 0, 0, 0, 45),
        ("DataPlan", 1, 0, 40, 15),
        ("DataPlan", 0, 5, 45, 10),
        ("ControlPlan", 0, 6, None, None),
        ("DataPlan", 0, 7, 55, 10),
    ]
    assert isinstance(plans[3], ControlPlan)
    # Path 0: core packets 0-1 are wire 0-3, packet 2 (5 bytes) wire 4, packet 3 wire 5.
    assert numbering[0].core_ranges(((4, 4),)) == ((2, 2),)
    assert numbering[0].core_ranges(((0, 7),)) == ((0, 5),)  # wire 6 is the probe, 7 the last


def test_reserved_numbers_belong_to_no_core_packet() -> None:
    numbering = WireNumbering()
    assert numbering.reserve(1) == 0  # the path probe sent before any data
    assert numbering.allocate(0, 3) == 1
    assert numbering.core_ranges(((0, 0),)) == ()
    assert numbering.core_ranges(((0, 3),)) == ((0, 0),)
    assert numbering.core_ranges(((1, 3),)) == ((0, 0),)


def test_reserve_is_refused_once_core_packets_exist() -> None:
    numbering = numbering_with([2])
    with pytest.raises(ValueError, match="before the first core packet"):
        numbering.reserve(1)


@pytest.mark.parametrize(
    ("wire_ranges", "partial"),
    [
        (((0, 7),), []),  # packets 0 (wire 0-2), 1 (3), 2 (4-7) all whole
        (((4, 7), (0, 2)), []),  # packet 1 missing entirely: nothing partial
        (((1, 7),), [(0, 1, 2)]),  # wire 0 missing: datagrams 1-2 of packet 0 arrived
        (((0, 5),), [(2, 0, 1)]),  # packet 2 half there
        (((5, 6),), [(2, 1, 2)]),  # one range inside one packet
        (((6, 9), (1, 4)), [(2, 2, 3), (0, 1, 2), (2, 0, 0)]),  # beyond the last is ignored
    ],
)
def test_partly_covered_names_the_datagrams_that_arrived(
        wire_ranges: tuple[tuple[int, int], ...], partial: list[tuple[int, int, int]]) -> None:
    assert numbering_with([3, 1, 4]).partly_covered(wire_ranges) == partial


def test_a_lost_datagram_resends_only_its_own_bytes() -> None:
    """Core packets of 4 datagrams; the peer acknowledges all but one datagram. Once the
    core declares that packet lost, only the missing datagram's bytes are queued again."""
    segment, segments = 1000, 4
    session = Session(SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=segment * segments),
                      allocator=None)
    session.submit(0, bytes(range(256)) * 160, 0.0)  # 40 960 bytes: 10+ core packets
    numbering = [WireNumbering()]
    plans = plan_transmits(session.poll_transmit(0.0), numbering, [segment], lambda sid: memoryview(b""))
    sent = sum(p.count for p in plans if isinstance(p, DataPlan))
    assert sent >= 8
    # Every wire number but one (datagram 2 of the first DATA packet) arrives.
    first_data = next(p for p in plans if isinstance(p, DataPlan))
    missing = first_data.first_pn + 2
    top = numbering[0].next_wire - 1
    ack = AckFrame(0, 0, ((missing + 1, top), (0, missing - 1)))
    receive_control(session, numbering, [segment], 0, 0, [ack], 0.05)
    session.on_deadline(1.0)  # the time threshold has long passed: the packet is lost
    outgoing = session.outgoing
    assert outgoing.retransmit_bytes == segment
    assert list(outgoing.retransmit) == [(0, first_data.offset + 2 * segment, segment)]


def test_ranges_below_what_is_outstanding_are_skipped() -> None:
    """An ACK repeats its old ranges; once the packets they name are settled they
    reach neither the datagram bookkeeping nor the session, and the rest still does."""
    segment, segments = 1000, 4
    session = Session(SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=segment * segments),
                      allocator=None)
    session.submit(0, bytes(range(256)) * 160, 0.0)
    numbering = [WireNumbering()]
    plan_transmits(session.poll_transmit(0.0), numbering, [segment], lambda sid: memoryview(b""))
    wire = numbering[0]
    # The first three core packets are acknowledged in full.
    settled = wire.first_wire(3) - 1
    receive_control(session, numbering, [segment], 0, 0, [AckFrame(0, 0, ((0, settled),))], 0.05)
    assert session.oldest_acknowledgement_of_interest(0) == 3
    seen: list[list[object]] = []
    original = session.receive_packet
    session.receive_packet = lambda path_id, pn, frames, now: (  # type: ignore[method-assign]
        seen.append(list(frames)), original(path_id, pn, frames, now))
    # A later ACK: one new range (core packet 3) and the old one repeated.
    new = (wire.first_wire(3), wire.first_wire(4) - 1)
    receive_control(session, numbering, [segment], 0, 1, [AckFrame(0, 7, (new, (0, settled)))], 0.06)
    assert seen[-1] == [AckFrame(0, 7, ((3, 3),))]
    assert session.oldest_acknowledgement_of_interest(0) == 4
    # Only old ranges: the ACK has nothing to say and is dropped before the session.
    receive_control(session, numbering, [segment], 0, 2, [AckFrame(0, 7, ((0, settled),))], 0.07)
    assert seen[-1] == []


def test_first_wire_of_core_packets() -> None:
    numbering = numbering_with([3, 1, 4])
    assert [numbering.first_wire(pn) for pn in range(4)] == [0, 3, 4, 8]


class EveryRange(WireNumbering):
    """The reference: every ACK range is translated, repeated or not."""

    __slots__ = ()

    def unseen(self, wire_ranges: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        return wire_ranges


def sender_state(session: Session) -> tuple[object, ...]:
    path = session.paths[0]
    shard = session.outgoing.shards.get(0)
    loss = path.loss
    return ([p.pn for p in loss.outstanding()], loss.largest_acked, loss.bytes_in_flight, loss.packets_lost,
            loss.spurious_losses, loss.remembered_losses(),
            sorted(session.outgoing.retransmit), shard.acked.ranges() if shard else None)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.data())
def test_skipping_repeated_ranges_leaves_the_sender_exactly_as_translating_all(data: st.DataObject) -> None:
    """Random datagram loss, late arrivals that close gaps, ACKs of the last 32 ranges
    delivered in a shuffled order, loss timers in between: the sender ends in the same
    state whether repeated ranges are skipped or translated again."""
    segment, segments = 1000, 4
    config = SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=segment * segments)
    sides = []
    for numbering_type in (WireNumbering, EveryRange):
        session = Session(config, allocator=None)
        session.submit(0, bytes(200_000), 0.0)
        numbering = [numbering_type()]
        plan_transmits(session.poll_transmit(0.0), numbering, [segment], lambda sid: memoryview(b""))
        sides.append((session, numbering))
    top = sides[0][1][0].next_wire
    assert top == sides[1][1][0].next_wire
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
        for session, numbering in sides:
            session.on_deadline(now)
            receive_control(session, numbering, [segment], 0, 0, [acks[index]], now)
    assert sender_state(sides[0][0]) == sender_state(sides[1][0])


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
        session.confirm_part(0, pn, start, end, 0.01)
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
    segment, segments = 1000, 4
    session = Session(SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=segment * segments),
                      allocator=None)
    session.submit(0, bytes(40_000), 0.0)
    numbering = [WireNumbering()]
    plan_transmits(session.poll_transmit(0.0), numbering, [segment], lambda sid: memoryview(b""))
    path, wire = session.paths[0], numbering[0]
    first = 1  # core packet 0 is the SHARD_OPEN
    sizes = {p.pn: p.size for p in path.loss.outstanding()}
    chunk = next(p for p in path.loss.outstanding() if p.pn == first).chunks[0][2]  # type: ignore[index]
    hole = wire.first_wire(first) + 2
    top = wire.first_wire(first + 3) - 1  # core packets first .. first + 2
    ack = AckFrame(0, 0, ((hole + 1, top), (0, hole - 1)))
    receive_control(session, numbering, [segment], 0, 0, [ack], 0.05)
    whole = sizes[0] + sizes[first + 1] + sizes[first + 2]
    partial = sizes[first] * 3 * segment // chunk
    assert path.rate.delivered_bytes == whole + partial
    assert session.outgoing.shards[0].acked.total >= 3 * segment * 2 + 3 * segment
    # The missing datagram arrives late: the packet is acknowledged whole, counted once.
    receive_control(session, numbering, [segment], 0, 1, [AckFrame(0, 0, ((0, top),))], 0.06)
    assert not path.loss.is_outstanding(first)
    assert path.rate.delivered_bytes == whole + sizes[first]
