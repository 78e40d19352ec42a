"""A path's ACKs applied as one batch (``Session.receive_packets``) or one by one.

The batch path merges the fresh ranges of a drain's ACKs and runs the loss
detector, the rate sample and the controller once. For ACK streams that tell
the sender nothing contradictory (each ACK repeats or extends the previous
one's picture, as on a path without reordering) the sender must end exactly
where applying the ACKs one at a time leaves it.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core import session as session_module
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.ranges import RangeSet
from wanxport.core.session import Session
from wanxport.wire.frames import AckFrame, CreditFrame, Frame, PaddingFrame

SEGMENT, SEGMENTS = 1000, 4
SIZE = 200_000  # 50 core packets of 4 datagrams (the first window: a SHARD_OPEN and 8 of them)


def sender(paths: int = 1) -> tuple[Session, list[int]]:
    """A sender with everything handed out at t=0; returns it and each path's wire top."""
    config = SessionConfig(paths=tuple(PathConfig(f"p{i}", 1500) for i in range(paths)),
                           chunk_bytes=SEGMENT * SEGMENTS, segment_bytes=SEGMENT)
    session = Session(config, allocator=None)
    session.submit(0, bytes(SIZE), 0.0)
    tops = [0] * paths
    for tx in session.poll_transmit(0.0):
        tops[tx.path_id] = max(tops[tx.path_id], tx.first_pn + tx.count)
    return session, tops


def state(session: Session) -> tuple[object, ...]:
    shard = session.outgoing.shards.get(0)
    per_path = tuple((tuple(p.pn for p in path.loss.outstanding()), path.loss.largest_acked,
                      path.loss.bytes_in_flight, path.loss.counters.packets_lost,
                      path.loss.counters.spurious_losses,
                      tuple(path.loss.remembered_losses()), path.rate.delivered_bytes)
                     for path in session.paths)
    return (per_path, sorted(session.outgoing.retransmit),
            shard.acked.ranges() if shard is not None else None)


def cumulative_acks(path_id: int, arrived: list[int], cuts: list[int], delay_us: int) -> list[AckFrame]:
    """The ACKs a receiver sends after each group of arrivals (ascending, so no gap ever
    closes late): its highest 32 received ranges each time, as ``AckTracker`` does."""
    received = RangeSet()
    acks = []
    for i, pn in enumerate(arrived):
        received.add(pn, pn + 1)
        if i in cuts or i == len(arrived) - 1:
            ranges = tuple((lo, hi - 1) for lo, hi in received.last(32))
            acks.append(AckFrame(path_id, delay_us, ranges))
    return acks


def batches_of(acks: list[AckFrame], sizes: list[int]) -> list[list[AckFrame]]:
    out, i = [], 0
    for size in sizes:
        if i >= len(acks):
            break
        out.append(acks[i:i + size])
        i += size
    if i < len(acks):
        out.append(acks[i:])
    return out


@settings(max_examples=80, deadline=None, derandomize=True)
@given(st.data())
def test_a_batch_leaves_the_sender_as_the_same_acks_one_by_one(data: st.DataObject) -> None:
    """Random datagram loss (so packets are partly covered and some declared lost), ACKs
    after random groups of arrivals, cut into random batches with a loss timer between:
    acknowledged set, bytes in flight, losses, largest acknowledged, delivered bytes and
    what is queued again are the same either way."""
    one, tops = sender(paths=2)
    batched, _ = sender(paths=2)
    streams = []
    for path_id, top in enumerate(tops):
        arrived = sorted(data.draw(st.sets(st.integers(0, top - 1), max_size=top),
                                   label=f"arrived {path_id}"))
        cuts = data.draw(st.sets(st.integers(0, max(len(arrived) - 1, 0))), label=f"ack after {path_id}")
        streams.append(cumulative_acks(path_id, arrived, sorted(cuts), data.draw(st.integers(0, 900))))
    # Interleave the two paths' ACKs in one arrival order, each path's in its own order.
    order = data.draw(st.permutations([0] * len(streams[0]) + [1] * len(streams[1])), label="interleave")
    position = [0, 0]
    arrivals: list[AckFrame] = []
    for path_id in order:
        arrivals.append(streams[path_id][position[path_id]])
        position[path_id] += 1
    sizes = data.draw(st.lists(st.integers(1, 6), max_size=len(arrivals)), label="batch sizes")
    now = 0.05
    for batch in batches_of(arrivals, sizes):
        now += data.draw(st.sampled_from([0.0, 0.001, 0.3]), label="gap")
        for session in (one, batched):
            session.on_deadline(now)
        for pn, frame in enumerate(batch):
            one.receive_packet(0, pn, [frame], now)
        batched.receive_packets([(0, pn, [frame]) for pn, frame in enumerate(batch)], now)
        assert state(one) == state(batched)


def test_a_late_gap_closing_in_the_same_batch_is_an_acknowledgement_not_a_spurious_loss() -> None:
    """What batching changes: one by one, an ACK declares a packet lost (three behind the
    largest) and the next ACK of the same drain shows it arrived -- a spurious loss that
    re-queues its bytes and widens the thresholds. As a batch, it is simply acknowledged."""
    one, tops = sender()
    batched, _ = sender()
    first = AckFrame(0, 0, ((9, tops[0] - 1), (0, 4)))  # core packet 2 (wire 5-8) missing
    second = AckFrame(0, 0, ((0, tops[0] - 1),))  # ... and then there after all
    one.receive_packet(0, 0, [first], 0.05)
    one.receive_packet(0, 1, [second], 0.05)
    batched.receive_packets([(0, 0, [first]), (0, 1, [second])], 0.05)
    assert one.paths[0].loss.counters.spurious_losses == 1
    counted = batched.paths[0].loss.counters
    assert counted.spurious_losses == 0 and counted.packets_lost == 0
    for session in (one, batched):
        assert session.paths[0].loss.bytes_in_flight == 0
        assert session.paths[0].loss.largest_acked == session.paths[0].loss.next_pn - 1
    shard = batched.outgoing.shards[0]
    assert shard.acked.total == shard.next_offset  # all that was sent
    assert not batched.outgoing.retransmit


def test_an_empty_batch_changes_nothing() -> None:
    session, _ = sender()
    before = state(session)
    session.receive_packets([], 0.05)
    assert state(session) == before


def test_an_ack_for_an_unknown_path_is_ignored_and_the_rest_of_the_batch_applied() -> None:
    session, tops = sender()
    session.receive_packets([(0, 0, [AckFrame(7, 0, ((0, 100),))]),
                             (0, 1, [AckFrame(0, 0, ((0, tops[0] - 1),))]),
                             (5, 2, [AckFrame(0, 0, ((0, 9),))])], 0.05)  # on a path we lack
    assert session.paths[0].loss.bytes_in_flight == 0
    assert session.counters.data_dropped == 1  # the datagram that came in on path 5


def test_ranges_beyond_what_was_sent_acknowledge_only_what_was() -> None:
    """A misbehaving peer acknowledges wire numbers never sent: they name nothing."""
    session, tops = sender()
    half = tops[0] // 2
    session.receive_packets([(0, 0, [AckFrame(0, 0, ((half, 1 << 60),))]),
                             (0, 1, [AckFrame(0, 0, ((tops[0] + 5, 1 << 62), (0, half - 1)))])], 0.05)
    loss = session.paths[0].loss
    assert loss.bytes_in_flight == 0 and loss.largest_acked == loss.next_pn - 1
    shard = session.outgoing.shards[0]
    assert shard.acked.total == shard.next_offset  # all that was sent


class RecordingAcks:
    """Stands in for the session's ``SenderAcks``: records each call's frames."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[AckFrame]]] = []

    def apply(self, path_id: int, frames: list[AckFrame], now: float, held_s: float = 0.0) -> None:
        self.calls.append((path_id, list(frames)))


@pytest.mark.skipif(session_module.__file__.endswith(".so"),
                    reason="replaces a typed attribute; a mypyc-compiled session refuses another type")
def test_acks_are_batched_per_path_up_to_the_next_other_frame() -> None:
    """ACKs of a path back to back (padding and other paths' ACKs between) are one call;
    any other frame applies the ACKs before it first, so it sees what they said."""
    session, _ = sender(paths=2)
    recording = RecordingAcks()
    session._acks = recording  # type: ignore[assignment]
    a, b, c, d = (AckFrame(p, 0, ((0, n),)) for p, n in ((0, 3), (1, 3), (0, 7), (0, 11)))
    packets: list[tuple[int, int, list[Frame]]] = [
        (0, 0, [a, PaddingFrame(10)]), (1, 0, [b]), (0, 1, [c]),
        (1, 1, [CreditFrame(1 << 30)]), (0, 2, [d])]
    session.receive_packets(packets, 0.05)
    assert recording.calls == [(0, [a, c]), (1, [b]), (0, [d])]
