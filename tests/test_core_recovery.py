"""The loss detector: sole owner of a path's sent packets, their loss timers and bytes in flight.

Loss deadlines first: if ``loss_deadline`` says "at t" but ``detect_losses(t)``
finds nothing, the driver re-arms the same timer at the same instant forever:
virtual time stops.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core.cc import BbrConfig, CcContext
from wanxport.core.delivery_rate import DeliveryRateEstimator
from wanxport.core.recovery import (
    INITIAL_REORDER_THRESHOLD,
    INITIAL_TIME_THRESHOLD,
    PROBE_MEMORY_S,
    LossDetector,
)
from wanxport.core.rtt import RttEstimator
from wanxport.core.sent_packets import SentPacket

MSS = 1400
SIZE = MSS + 16


def new_detector() -> LossDetector:
    cc = BbrConfig(probe_rtt=True).build(CcContext(mss_bytes=SIZE, initial_rtt_s=0.1))
    return LossDetector(RttEstimator(initial_rtt_s=0.1), DeliveryRateEstimator(), cc)


def send(loss: LossDetector, at: float) -> SentPacket:
    pn = loss.take_pn()
    packet = SentPacket(pn, at, SIZE, [(0, pn * MSS, MSS)], None, True, True,
                        loss.rate.on_packet_sent(at, loss.bytes_in_flight))
    loss.on_packet_sent(packet)
    return packet


def send_probe(loss: LossDetector, at: float) -> SentPacket:
    """A probe: ack-eliciting, not in flight, nothing to re-send."""
    packet = SentPacket(loss.take_pn(), at, 60, None, None, True, False, None)
    loss.on_packet_sent(packet)
    return packet


def loss_timer_fires(sent_at: float, rtt_s: float) -> None:
    loss = new_detector()
    first = send(loss, sent_at)
    send(loss, sent_at)
    # The second packet is acknowledged one RTT later; the first is not (yet) lost.
    acked, lost, _ = loss.on_ack(((1, 1),), 0.0, sent_at + rtt_s)
    assert [p.pn for p in acked] == [1]
    if lost:
        return  # the time threshold was already met: nothing left to test
    deadline = loss.loss_deadline()
    assert deadline is not None
    lost = loss.detect_losses(deadline)
    assert first in lost, (
        f"loss deadline {deadline!r} fired but the packet sent at {sent_at!r} was not declared lost; "
        f"loss delay {loss.loss_delay_s()!r}")


def test_loss_deadline_from_a_simulator_hang() -> None:
    """Floats seen when a 2-path simulation stopped advancing time (see the report)."""
    loss = new_detector()
    loss.time_threshold = 1.0
    first = send(loss, 0.028124999999999997)
    send(loss, 0.028124999999999997)
    loss.on_ack(((1, 1),), 0.0, 0.0282)
    delay = 0.12493877928448763
    loss.rtt.smoothed_s = loss.rtt.latest_s = delay
    deadline = loss.loss_deadline()
    assert deadline == 0.1530637792844876
    assert first in loss.detect_losses(deadline), "timer fires, nothing is lost: livelock"


@pytest.mark.parametrize("sent_at,rtt_s", [(0.1, 0.2), (1.0, 0.05), (3.3, 0.0123)])
def test_loss_deadline_declares_loss(sent_at: float, rtt_s: float) -> None:
    loss_timer_fires(sent_at, rtt_s)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.floats(0.0, 100.0, allow_nan=False), st.floats(0.001, 0.5, allow_nan=False))
def test_loss_deadline_always_declares_loss(sent_at: float, rtt_s: float) -> None:
    loss_timer_fires(sent_at, rtt_s)


def test_bytes_in_flight_follow_sends_acks_and_losses() -> None:
    loss = new_detector()
    for _ in range(6):
        send(loss, 0.0)
    send_probe(loss, 0.0)  # not in flight: counted as sent, not in flight
    assert loss.bytes_in_flight == 6 * SIZE
    assert (loss.counters.packets_sent, loss.counters.bytes_sent) == (7, 6 * SIZE + 60)
    acked, lost, sample = loss.on_ack(((5, 5),), 0.0, 0.1)
    # Packet threshold 3: pns 5 - 3 = 2 and below are lost; 3 and 4 wait.
    assert [p.pn for p in acked] == [5]
    assert [p.pn for p in lost] == [0, 1, 2]
    assert sample is not None
    assert loss.bytes_in_flight == 2 * SIZE
    assert loss.counters.packets_lost == 3
    assert [p.pn for p in loss.outstanding()] == [3, 4, 6]
    assert loss.largest_acked == 5 and loss.last_ack_at == 0.1


def test_the_time_an_ack_waited_in_the_driver_is_no_part_of_the_round_trip() -> None:
    held, prompt = new_detector(), new_detector()
    for loss in (held, prompt):
        send(loss, 0.0)
        send(loss, 0.010)
    # The same ACKs: one drained at once, one after a 4 ms receive hold-off.
    prompt.on_ack(((0, 0),), 0.0, 0.050)
    held.on_ack(((0, 0),), 0.0, 0.054, held.arrival(0.054, 0.004))
    prompt.on_ack(((1, 1),), 0.0, 0.070)
    held.on_ack(((1, 1),), 0.0, 0.073, held.arrival(0.073, 0.003))
    for rtt in (held.rtt, prompt.rtt):
        assert (rtt.min_s, rtt.latest_s) == (pytest.approx(0.050), pytest.approx(0.060))
    assert held.rtt.smoothed_s == pytest.approx(prompt.rtt.smoothed_s)
    assert held.last_ack_at == 0.073  # handled when it was: only the samples are taken earlier
    assert held.arrival(0.080, 0.020) == pytest.approx(0.070)  # never before the previous arrival


def test_an_ack_of_nothing_outstanding_changes_nothing() -> None:
    loss = new_detector()
    send(loss, 0.0)
    assert loss.on_ack(((3, 7),), 0.0, 0.1) == ([], [], None)  # beyond anything sent
    assert loss.bytes_in_flight == SIZE and loss.largest_acked == -1


def test_a_spurious_loss_widens_both_thresholds_and_is_counted() -> None:
    loss = new_detector()
    for _ in range(10):
        send(loss, 0.0)
    _, lost, _ = loss.on_ack(((9, 9),), 0.0, 0.1)
    assert [p.pn for p in lost] == list(range(7))
    assert loss.remembered_losses() == list(range(7))
    loss.on_ack(((0, 9),), 0.0, 0.11)  # every "lost" packet arrived after all: reordering
    assert loss.counters.spurious_losses == 7
    assert loss.remembered_losses() == []
    assert loss.reorder_threshold == 10  # the largest gap seen: 9 - 0 + 1
    assert loss.time_threshold == 4.0  # x1.25 per spurious loss, capped at 4 smoothed RTTs
    assert INITIAL_TIME_THRESHOLD * 1.25 ** 7 > 4.0
    assert INITIAL_REORDER_THRESHOLD < loss.reorder_threshold


def test_a_probe_timeouts_spurious_losses_are_counted_but_widen_neither_threshold() -> None:
    """A timeout that declares the whole flight lost, which then arrives, says an end stalled
    (or a queue held the ACKs), not that the path reorders: the thresholds must stay as they
    were, or one stall slows this path's loss detection for good."""
    loss = new_detector()
    for _ in range(10):
        send(loss, 0.0)
    assert [p.pn for p in loss.declare_all_lost(0.3)] == list(range(10))
    loss.on_ack(((0, 9),), 0.0, 0.31)  # all of it arrived: the timeout was spurious
    assert loss.counters.spurious_losses == 10 and loss.remembered_losses() == []
    assert loss.reorder_threshold == INITIAL_REORDER_THRESHOLD
    assert loss.time_threshold == INITIAL_TIME_THRESHOLD
    for _ in range(5):  # the thresholds' own spurious losses still widen them
        send(loss, 0.4)
    _, lost, _ = loss.on_ack(((14, 14),), 0.0, 0.5)
    assert [p.pn for p in lost] == [10, 11]
    loss.on_ack(((10, 14),), 0.0, 0.51)
    assert loss.counters.spurious_losses == 12
    assert loss.reorder_threshold == 5  # the gap: 14 - 10 + 1
    assert loss.time_threshold == pytest.approx(INITIAL_TIME_THRESHOLD * 1.25 ** 2)


def test_a_remembered_loss_keeps_the_oldest_packet_of_interest() -> None:
    loss = new_detector()
    for _ in range(6):
        send(loss, 0.0)
    assert loss.oldest_of_interest() == 0
    loss.on_ack(((5, 5),), 0.0, 0.1)  # 0, 1, 2 lost; 3 and 4 outstanding
    assert loss.oldest_of_interest() == 0  # a late ACK of 0 would prove its loss spurious
    loss.on_ack(((3, 5),), 0.0, 0.1 + 10.0)  # long after: the losses are forgotten
    assert loss.oldest_of_interest() is None


def test_declare_all_lost_keeps_probes_and_forget_probes_drops_old_ones() -> None:
    loss = new_detector()
    send(loss, 0.0)
    old_probe = send_probe(loss, 0.5)
    send(loss, 1.0)
    new_probe = send_probe(loss, 2.0)
    lost = loss.declare_all_lost(3.0)
    assert [p.pn for p in lost] == [0, 2]
    assert loss.bytes_in_flight == 0
    assert loss.outstanding() == [old_probe, new_probe]
    loss.forget_probes_before(1.0)
    assert loss.outstanding() == [new_probe]
    assert loss.is_outstanding(new_probe.pn) and not loss.is_outstanding(old_probe.pn)


def test_forget_stale_needs_no_ack_to_forget_old_losses_and_probes() -> None:
    """What holds ``oldest_of_interest`` down goes with time alone: a path that carries
    only acknowledgements after an outage gets no ACK back to prune it (the daemon's
    receiver kept every acknowledgement's wire span for hours)."""
    loss = new_detector()
    send(loss, 0.0)
    probe = send_probe(loss, 0.5)
    loss.declare_all_lost(1.0)  # the outage: the data is lost, the probe is kept
    assert loss.oldest_of_interest() == 0
    loss.forget_stale(1.1)  # still of interest: a late ACK would prove the loss spurious
    assert loss.oldest_of_interest() == 0
    later = 1.5  # past the loss memory (0.25 s and 3 smoothed RTTs), within the probe's
    loss.forget_stale(later)  # the loss is forgotten, the probe not yet
    assert loss.oldest_of_interest() == probe.pn and loss.is_outstanding(probe.pn)
    fresh = send_probe(loss, later)
    loss.forget_stale(probe.sent_at + PROBE_MEMORY_S + 0.01)
    assert not loss.is_outstanding(probe.pn)
    assert loss.oldest_of_interest() == fresh.pn  # the recent probe stays


def test_forget_stale_keeps_what_is_in_flight_however_old() -> None:
    loss = new_detector()
    old = send(loss, 0.0)
    send_probe(loss, 0.1)
    loss.forget_stale(100.0)
    assert loss.oldest_of_interest() == old.pn and loss.bytes_in_flight == SIZE


def test_pto_backs_off_and_an_ack_resets_it() -> None:
    loss = new_detector()
    assert loss.pto_deadline(0.025) is None  # nothing in flight: no probe timer
    send(loss, 1.0)
    base = loss.pto_s(0.025)
    assert loss.pto_deadline(0.025) == pytest.approx(1.0 + base)
    for _ in range(10):
        loss.on_pto()
    assert loss.pto_s(0.025) == pytest.approx(base * 64)  # the backoff is capped at 2**6
    send(loss, 1.1)
    loss.on_ack(((1, 1),), 0.0, 1.2)
    assert loss.pto_count == 0


def test_outstanding_chunks_and_partial_confirmation() -> None:
    loss = new_detector()
    first = send(loss, 0.0)
    send(loss, 0.01)
    assert list(loss.outstanding_chunks()) == [(0.0, (0, 0, MSS)), (0.01, (0, MSS, MSS))]
    assert loss.confirm_part(first.pn, 100, 700, 0.05) == (0, 100, 600)
    assert loss.confirm_part(first.pn, 200, 600, 0.05) is None  # nothing new
    assert loss.confirm_part(first.pn, 700, 10 * MSS, 0.05) == (0, 700, MSS - 700)  # clipped to the chunk
    assert first.credited == SIZE * (MSS - 100) // MSS
    assert loss.confirm_part(99, 0, 10, 0.05) is None  # not outstanding


def test_a_tail_lost_at_a_steps_end_waits_for_the_next_steps_acks_not_a_probe_timeout() -> None:
    """The last packet of a step is lost and nothing behind it reveals that. Once the path
    resumes after the session ran out of data, the timeout counts from then, so the next step's
    first acknowledgement declares the old tail lost by the time threshold instead of a timeout
    suspecting the path and re-sending all the new step's data."""
    loss = new_detector()
    send(loss, 0.0)
    tail = send(loss, 0.01)
    loss.on_ack(((0, 0),), 0.0, 0.1)
    assert loss.pto_deadline(0.025) == pytest.approx(0.1 + loss.pto_s(0.025))
    loss.on_app_idle()
    send(loss, 0.15)
    assert loss.pto_deadline(0.025) == pytest.approx(0.15 + loss.pto_s(0.025))
    _, lost, _ = loss.on_ack(((2, 2),), 0.0, 0.25)
    assert lost == [tail]
    assert loss.pto_deadline(0.025) is None


def test_a_range_of_several_packets_acknowledges_up_to_its_highest() -> None:
    """Acknowledged packets come back ascending across and within ranges, so the largest
    acknowledged is the range's top and the RTT sample is taken from it (it was the
    range's lowest: the oldest packet's RTT, and the packet threshold lagging behind)."""
    loss = new_detector()
    for i in range(8):
        send(loss, 0.001 * i)
    acked, lost, _ = loss.on_ack(((5, 7), (0, 3)), 0.0, 0.1)
    assert [p.pn for p in acked] == [0, 1, 2, 3, 5, 6, 7]
    assert loss.largest_acked == 7
    assert loss.rtt.latest_s == pytest.approx(0.1 - 0.007)
    assert [p.pn for p in lost] == [4]  # three acknowledged after it: the packet threshold
