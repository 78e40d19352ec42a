"""The ACK tracker: what a path received, and when the receiver acknowledges it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.ack_tracker import AckTracker
from wanxport.wire.ack_record import ACK_FRAME_RANGES as MAX_ACK_RANGES
from wanxport.wire.ack_record import ACK_RANGES_KEPT as RECEIVED_RANGES_KEPT

THRESHOLD = 4
DELAY_S = 0.025


def receive(tracker: AckTracker, pn: int, now: float = 0.0, eliciting: bool = True) -> None:
    tracker.on_packet_received(pn, eliciting, now, THRESHOLD, DELAY_S)


def test_in_order_packets_wait_for_the_delay_or_the_threshold() -> None:
    tracker = AckTracker()
    assert not tracker.has_unacked and not tracker.ack_due(0.0)
    receive(tracker, 0, now=1.0)
    assert tracker.ack_at == 1.0 + DELAY_S and not tracker.ack_now
    assert not tracker.ack_due(1.0) and tracker.ack_due(1.0 + DELAY_S)
    assert not tracker.on_timer(1.0) and not tracker.ack_now  # another timer of the path
    receive(tracker, 1, now=1.01)
    receive(tracker, 2, now=1.02)
    assert not tracker.ack_now and tracker.ack_at == 1.0 + DELAY_S  # the first packet set the deadline
    receive(tracker, 3, now=1.03)
    assert tracker.ack_now  # THRESHOLD eliciting packets: acknowledge at once
    assert (tracker.largest, tracker.largest_at) == (3, 1.03)
    assert tracker.ack_ranges() == ((0, 3),)
    tracker.ack_sent()
    assert (tracker.unacked_eliciting, tracker.ack_at, tracker.ack_now) == (0, None, False)
    assert not tracker.has_unacked
    receive(tracker, 4, now=2.0)
    assert tracker.on_timer(2.0 + DELAY_S) and tracker.ack_now  # the delayed ACK's deadline


def test_a_gap_asks_for_an_ack_at_once_but_an_ack_only_packet_does_not() -> None:
    tracker = AckTracker()
    receive(tracker, 0)
    receive(tracker, 5, eliciting=False)  # a gap, but only an ACK: no ping-pong
    assert not tracker.ack_now
    receive(tracker, 7)
    assert tracker.ack_now
    assert tracker.ack_ranges() == ((7, 7), (5, 5), (0, 0))  # highest first, inclusive


def test_a_reordered_late_packet_does_not_move_the_largest() -> None:
    tracker = AckTracker()
    receive(tracker, 4, now=1.0)
    receive(tracker, 2, now=2.0)
    assert (tracker.largest, tracker.largest_at) == (4, 1.0)


def test_an_ack_only_packet_is_recorded_but_owes_no_ack() -> None:
    tracker = AckTracker()
    receive(tracker, 0, eliciting=False)
    assert tracker.received.total == 1
    assert tracker.ack_at is None and not tracker.has_unacked


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(0, 50), st.integers(2, 40), st.integers(0, 3))
def test_a_data_run_equals_its_packets_one_by_one(start: int, count: int, before: int) -> None:
    """A run's packets but the last, then the last one: as if each had arrived alone."""
    one, run = AckTracker(), AckTracker()
    for pn in range(before):
        receive(one, pn)
        receive(run, pn)
    for pn in range(start, start + count):
        receive(one, pn, now=1.0)
    run.on_data_run(start, start + count, 1.0, THRESHOLD, DELAY_S)
    assert one.received.ranges() == run.received.ranges()
    assert (one.largest, one.largest_at, one.unacked_eliciting) == (run.largest, run.largest_at,
                                                                    run.unacked_eliciting)
    # A gap before the run asks for an ACK in both; so does reaching the threshold.
    assert one.ack_now == run.ack_now


def test_ack_ranges_are_bounded_and_the_record_forgets_the_oldest() -> None:
    tracker = AckTracker()
    for pn in range(0, 4 * RECEIVED_RANGES_KEPT, 2):  # every other packet: one range each
        receive(tracker, pn)
    assert len(tracker.received) <= RECEIVED_RANGES_KEPT
    ranges = tracker.ack_ranges()
    assert len(ranges) == MAX_ACK_RANGES
    top = 4 * RECEIVED_RANGES_KEPT - 2
    assert ranges[0] == (top, top)
    assert tracker.received.contains(top, top + 1) and not tracker.received.contains(0, 1)


def test_an_ack_only_packet_that_overtook_data_is_no_gap() -> None:
    """The peer's acknowledgement-only packets leave ahead of its queued data (the
    transmitter's ``overtake``): when that data arrives, no number is missing and no ACK
    is owed at once; a real hole still asks for one, and so does a late data packet."""
    tracker = AckTracker()  # (ack_sent() after each check keeps THRESHOLD out of it)
    receive(tracker, 0)
    tracker.ack_sent()
    receive(tracker, 4, eliciting=False)  # the peer's ACK, ahead of its data 1..3
    tracker.on_data_run(1, 4, 0.0, THRESHOLD, DELAY_S)  # data 1, 2, 3 in one run
    assert not tracker.ack_now
    tracker.ack_sent()
    receive(tracker, 5)  # right after the ACK-only 4: in order
    assert not tracker.ack_now
    tracker.ack_sent()
    receive(tracker, 7)  # 6 is missing
    assert tracker.ack_now
    tracker.ack_sent()
    receive(tracker, 6)  # late
    assert tracker.ack_now
    tracker.ack_sent()
    receive(tracker, 9, eliciting=False)
    tracker.on_data_run(10, 13, 0.0, THRESHOLD, DELAY_S)  # 8 missing below an ACK-only 9: still a hole
    assert tracker.ack_now


# A receiver's history: single packets (eliciting or not), data runs, ACKs sent.
_EVENTS = st.lists(st.one_of(
    st.tuples(st.just("packet"), st.integers(0, 600), st.booleans()),
    st.tuples(st.just("run"), st.integers(0, 600), st.integers(1, 70)),
    st.tuples(st.just("ack"), st.just(0), st.just(0)),
), max_size=60)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(_EVENTS)
def test_runs_leave_the_tracker_as_their_packets_one_by_one(events: list[tuple[str, int, int]]) -> None:
    """Whatever came before (gaps, late packets, ACK-only packets, ACKs sent, ranges
    forgotten), a run leaves what it records and what ACK it owes as its packets would."""
    one, run = AckTracker(), AckTracker()
    for step, (kind, pn, arg) in enumerate(events):
        now = step * 0.001
        if kind == "packet":
            receive(one, pn, now, eliciting=bool(arg))
            receive(run, pn, now, eliciting=bool(arg))
        elif kind == "run":
            for p in range(pn, pn + arg):
                receive(one, p, now)
            run.on_data_run(pn, pn + arg, now, THRESHOLD, DELAY_S)
        else:
            one.ack_sent()
            run.ack_sent()
        assert one.received.ranges() == run.received.ranges()
        assert (one.largest, one.largest_at, one.largest_eliciting, one.unacked_eliciting) == (
            run.largest, run.largest_at, run.largest_eliciting, run.unacked_eliciting)
        assert one.ack_now == run.ack_now and one.has_unacked == run.has_unacked
        if not one.ack_now:  # an ACK owed at once makes the delayed-ACK deadline moot
            assert one.ack_at == run.ack_at
        assert one.ack_ranges() == run.ack_ranges()


def test_a_run_that_overflows_the_record_forgets_like_its_packets() -> None:
    one, run = AckTracker(), AckTracker()
    for pn in range(0, 2 * RECEIVED_RANGES_KEPT, 2):  # one range each: the record is full
        receive(one, pn)
        receive(run, pn)
    top = 2 * RECEIVED_RANGES_KEPT + 1  # after a gap: one range more than the record keeps
    for pn in range(top, top + 5):
        receive(one, pn)
    run.on_data_run(top, top + 5, 0.0, THRESHOLD, DELAY_S)
    assert len(run.received) <= RECEIVED_RANGES_KEPT
    assert one.received.ranges() == run.received.ranges()
