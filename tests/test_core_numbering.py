"""Wire numbering: core packets <-> the wire numbers of their datagrams (pure logic)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.numbering import WireNumbering, merge_ranges
from wanxport.wire.frames import AckFrame


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
    assert numbering.cover(wire_ranges)[0] == core_ranges


def test_ranges_covering_no_whole_packet_translate_to_none() -> None:
    numbering = numbering_with([2, 2])
    assert numbering.cover(((0, 3),))[0] == ((0, 1),)
    assert numbering.cover(((1, 2),))[0] == ()


def test_reserved_numbers_belong_to_no_core_packet() -> None:
    numbering = WireNumbering()
    assert numbering.reserve(1) == 0  # the path probe sent before any data
    assert numbering.allocate(0, 3) == 1
    assert numbering.cover(((0, 0),))[0] == ()
    assert numbering.cover(((0, 3),))[0] == ((0, 0),)
    assert numbering.cover(((1, 3),))[0] == ((0, 0),)


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
    assert numbering_with([3, 1, 4]).cover(wire_ranges)[1] == partial


def reference_cover(counts: list[int], reserved: int, wire_ranges: tuple[tuple[int, int], ...]
                    ) -> tuple[tuple[tuple[int, int], ...], list[tuple[int, int, int]]]:
    """``cover`` datagram by datagram: per range, the packets it holds whole (as runs) and
    the ones it holds in part."""
    spans = []
    begin = reserved
    for count in counts:
        spans.append((begin, begin + count - 1))
        begin += count
    whole: list[tuple[int, int]] = []
    parts: list[tuple[int, int, int]] = []
    for lo, hi in wire_ranges:
        inside = [pn for pn, (b, e) in enumerate(spans) if lo <= b and e <= hi]
        if inside:
            whole.append((inside[0], inside[-1]))
        for pn, (b, e) in enumerate(spans):
            a, z = max(lo, b), min(hi, e)
            if a <= z and (a, z) != (b, e):
                parts.append((pn, a - b, z - b))
    return tuple(whole), parts


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.integers(1, 5), max_size=8), st.integers(0, 3),
       st.lists(st.integers(0, 40), max_size=10))
def test_cover_matches_counting_datagram_by_datagram(counts: list[int], reserved: int,
                                                     cuts: list[int]) -> None:
    """Any packet sizes, reserved numbers before the first packet, any valid ACK ranges
    (descending, disjoint, not adjacent; some beyond what was sent)."""
    numbering = WireNumbering()
    if reserved:
        numbering.reserve(reserved)
    for core_pn, count in enumerate(counts):
        numbering.allocate(core_pn, count)
    edges = sorted(set(cuts))
    ranges = tuple((lo, hi) for lo, hi in zip(edges[0::2], edges[1::2], strict=False))
    ranges = tuple(r for i, r in enumerate(ranges) if i == 0 or r[0] > ranges[i - 1][1] + 1)[::-1]
    assert numbering.cover(ranges) == reference_cover(counts, reserved, ranges)


def test_first_wire_of_core_packets() -> None:
    numbering = numbering_with([3, 1, 4])
    assert [numbering.first_wire(pn) for pn in range(4)] == [0, 3, 4, 8]




def test_translate_fresh_skips_ranges_below_interest_and_repeats() -> None:
    numbering = numbering_with([3, 1, 4])  # packets 0 (wire 0-2), 1 (3), 2 (4-7)
    # Below the oldest of interest (packet 1 starts at wire 3): the (0, 2) range is skipped.
    ack, parts, delay = numbering.translate_fresh([AckFrame(0, 9, ((5, 7), (3, 3), (0, 2)))], 1)
    assert ack == ((1, 1),)
    assert parts == [(2, 1, 3)]
    assert delay == 9
    # The same ranges again: nothing new to say.
    assert numbering.translate_fresh([AckFrame(0, 9, ((5, 7), (3, 3), (0, 2)))], 1) == ((), [], 9)
    # A gap closing changes the range: translated again.
    ack, parts, _ = numbering.translate_fresh([AckFrame(0, 9, ((3, 7),))], 1)
    assert ack == ((1, 2),)
    assert parts == []


def test_translate_fresh_merges_a_batch_of_acks() -> None:
    """Two ACKs whose ranges only together cover packet 2 (wire 4-7) acknowledge it whole,
    and the delay is the newest ACK's: the one naming the highest wire number."""
    numbering = numbering_with([3, 1, 4, 2])  # packets 0 (0-2), 1 (3), 2 (4-7), 3 (8-9)
    batch = [AckFrame(0, 5, ((4, 5), (0, 2))), AckFrame(0, 7, ((8, 8), (6, 7), (0, 2)))]
    ack, parts, delay = numbering.translate_fresh(batch, 0)
    assert ack == ((2, 2), (0, 0))
    assert parts == [(3, 0, 0)]
    assert delay == 7
    # Reordered ACKs: the delay still goes with the highest wire number.
    numbering = numbering_with([3, 1, 4, 2])
    assert numbering.translate_fresh(batch[::-1], 0)[2] == 7


def test_translate_fresh_of_an_empty_batch_says_nothing() -> None:
    assert numbering_with([3, 1]).translate_fresh([], 0) == ((), [], 0)


def test_translate_fresh_ignores_wire_numbers_beyond_those_sent() -> None:
    """Ranges past ``next_wire`` (a misbehaving peer) name no core packet."""
    numbering = numbering_with([3, 1])  # wire 0-3 sent
    ack, parts, _ = numbering.translate_fresh([AckFrame(0, 0, ((10, 1 << 40), (3, 6)))], 0)
    assert ack == ((1, 1),)
    assert parts == []


@pytest.mark.parametrize(("ranges", "union"), [
    ([(5, 7), (0, 2), (3, 4)], ((0, 7),)),  # adjacent ranges join (inclusive numbers)
    ([(0, 10), (2, 3), (12, 12)], ((12, 12), (0, 10))),  # contained, and a gap of one
    ([(4, 4), (4, 4)], ((4, 4),)),
    ([(0, 1), (5, 9), (3, 3), (2, 2)], ((5, 9), (0, 3))),
])
def test_merge_ranges(ranges: list[tuple[int, int]], union: tuple[tuple[int, int], ...]) -> None:
    assert merge_ranges(ranges) == union


def test_spans_below_the_oldest_of_interest_are_forgotten() -> None:
    """A months-long session keeps the spans of outstanding packets, not of every packet."""
    numbering = WireNumbering()
    for pn in range(100_000):
        numbering.allocate(pn, 4)  # core packet pn is wire [4 pn, 4 pn + 3]
        if pn % 64 == 63:  # the peer acknowledges all but the last 10 packets
            top = 4 * (pn - 10) + 3
            numbering.translate_fresh([AckFrame(0, 0, ((0, top),))], pn - 10)
    assert len(numbering._starts) < 4 * 1024
    assert numbering.first_wire(99_995) == 4 * 99_995
    ack, parts, _ = numbering.translate_fresh([AckFrame(0, 0, ((4 * 99_990, 4 * 99_998 + 1),))], 99_990)
    assert ack == ((99_990, 99_997),)
    assert parts == [(99_998, 0, 1)]
