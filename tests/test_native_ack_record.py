"""The native record of a path's received packet numbers against its pure-Python reference.

Both are fed the same packet-number sequences (in order, reordered, duplicated,
gappy enough to pass the bound on kept ranges) and must hold the same ranges,
answer the same gap queries, and give byte-identical ACK frames.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.wire import native
from wanxport.wire.ack_record import ACK_FRAME_RANGES, ACK_RANGES_KEPT, AckRecord, PacketRecord
from wanxport.wire.frames import AckFrame, decode_frames, encode_frames

pytestmark = pytest.mark.skipif(not native.NATIVE_AVAILABLE, reason=str(native.import_error))

MAX_PN = (1 << 62) - 1


def ack_bytes(record: PacketRecord, path_id: int = 3, delay_us: int = 1234) -> bytes:
    return encode_frames([AckFrame(path_id, delay_us, record.ranges())])


def assert_same(ref: AckRecord, nat: PacketRecord) -> None:
    assert (len(nat), nat.total, nat.ranges()) == (len(ref), ref.total, ref.ranges())
    assert ack_bytes(nat) == ack_bytes(ref)


# A run of packet numbers: where it starts relative to the previous one (back for
# reordering and duplicates, a little ahead for gaps) and how many it holds.
runs = st.lists(st.tuples(st.integers(-40, 12), st.integers(0, 9)), max_size=400)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(runs=runs, base=st.sampled_from([0, 1 << 40, MAX_PN - 20_000]))
def test_the_same_runs_give_the_same_record_and_the_same_ack_bytes(runs: list[tuple[int, int]],
                                                                   base: int) -> None:
    ref, nat = AckRecord(), native.ack_record()
    pn = base
    for step, count in runs:
        pn = min(max(base, pn + step), MAX_PN)
        end = min(pn + count, MAX_PN + 1)
        ref.add(pn, end)
        nat.add(pn, end)
        pn = end
        assert_same(ref, nat)
        for lo in (pn - 30, pn - 9, pn - 1):
            lo = max(lo, 0)
            assert nat.contains(lo, pn) == ref.contains(lo, pn)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(order=st.permutations(range(3 * ACK_RANGES_KEPT)))
def test_every_other_packet_in_any_order_passes_the_bound_alike(order: list[int]) -> None:
    ref, nat = AckRecord(), native.ack_record()
    for i in order:
        ref.add(2 * i, 2 * i + 1)  # one range each until the bound drops the oldest half
        nat.add(2 * i, 2 * i + 1)
    assert_same(ref, nat)
    assert len(nat) <= ACK_RANGES_KEPT


def test_an_ack_frame_holds_the_newest_ranges_highest_first() -> None:
    nat = native.ack_record()
    for pn in range(0, 4 * ACK_RANGES_KEPT, 2):
        nat.add(pn, pn + 1)
    nat.add(4 * ACK_RANGES_KEPT - 1, 4 * ACK_RANGES_KEPT + 5)  # joins the newest range
    ranges = nat.ranges()
    assert len(ranges) == ACK_FRAME_RANGES
    assert ranges[0] == (4 * ACK_RANGES_KEPT - 2, 4 * ACK_RANGES_KEPT + 4)
    assert ranges[1] == (4 * ACK_RANGES_KEPT - 4, 4 * ACK_RANGES_KEPT - 4)
    [frame] = decode_frames(ack_bytes(nat, path_id=7, delay_us=9))
    assert frame == AckFrame(7, 9, ranges)


def test_an_empty_run_changes_nothing_and_bad_numbers_are_refused_in_one_line() -> None:
    nat = native.ack_record()
    nat.add(5, 5)
    nat.add(9, 3)
    assert (len(nat), nat.total, nat.ranges()) == (0, 0, ())
    assert not nat.contains(0, 1)
    for first, end in ((-1, 2), (0, MAX_PN + 2)):
        with pytest.raises(ValueError) as err:
            nat.add(first, end)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError):
        nat.add(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        nat.add("1", 2)  # type: ignore[arg-type]
