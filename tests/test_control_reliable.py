"""Exactly-once sequencing across reconnects, and the data-plane key schedule."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.control.framing import MsgFrame
from wanxport.control.keys import KeySchedule, RotationLimits
from wanxport.control.messages import ControlProtocolError
from wanxport.control.reliable import ReliableState


def _body(i: int) -> dict[str, object]:
    return {"type": "bye", "reason": str(i)}


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_switching_links_loses_and_duplicates_nothing(seed: int, total: int) -> None:
    """Messages go over a sequence of links; each link dies after delivering a
    random prefix of what was put on it. The receiver still consumes 1..total once."""
    rng = random.Random(seed)
    sender, receiver = ReliableState(window=64), ReliableState(window=64)
    got: list[int] = []
    in_flight: list[MsgFrame] = []
    produced = 0
    for _ in range(1000):
        if len(got) == total:
            break
        if produced < total and sender.has_room and rng.random() < 0.6:
            produced += 1
            in_flight.append(sender.stamp(_body(produced)))
        elif rng.random() < 0.15:
            # the link dies: some frames in flight never arrive; re-attach
            in_flight = in_flight[: rng.randint(0, len(in_flight))]
            for frame in in_flight:
                if receiver.on_msg(frame):
                    got.append(int(frame.body["reason"]))  # type: ignore[arg-type]
                    receiver.on_consumed()
            in_flight = sender.resend(receiver.consumed)
        elif in_flight:
            frame = in_flight.pop(0)
            if receiver.on_msg(frame):
                got.append(int(frame.body["reason"]))  # type: ignore[arg-type]
                receiver.on_consumed()
                sender.on_ack(receiver.consumed)
    assert got == list(range(1, total + 1))


def test_gap_and_bogus_ack_are_protocol_errors() -> None:
    state = ReliableState()
    with pytest.raises(ControlProtocolError, match="skips ahead"):
        state.on_msg(MsgFrame(2, 0, _body(2)))
    with pytest.raises(ControlProtocolError, match="never sent"):
        state.on_ack(1)


def test_window_gives_backpressure() -> None:
    state = ReliableState(window=2)
    state.stamp(_body(1))
    state.stamp(_body(2))
    assert not state.has_room
    state.on_ack(1)
    assert state.has_room and state.unacked == 1


def test_key_schedule_rotation_flow() -> None:
    counter = iter(range(1, 10_000))
    schedule = KeySchedule(
        "initiator->responder",
        limits=RotationLimits(packets=10, bytes=1000, seconds=5.0),
        random_bytes=lambda n: bytes([next(counter) % 256]) * n,
    )
    first = schedule.current
    assert first.key_phase == 0 and len(first.key) == 32 and len(first.iv) == 12
    assert not schedule.should_rotate(999, 9, 4.9)
    assert schedule.should_rotate(0, 10, 0.0)
    assert schedule.should_rotate(1000, 0, 0.0)
    assert schedule.should_rotate(0, 0, 5.0)
    nxt = schedule.rotate()
    assert nxt.key_phase == 1 and nxt.key != first.key and nxt.iv != first.iv
    assert schedule.current is first  # keep sealing with the old key until confirmed
    assert not schedule.should_rotate(10**9, 10**9, 10**9)  # one rotation at a time
    with pytest.raises(ValueError, match="key_update.key_phase"):
        schedule.confirm(2)
    assert schedule.confirm(1) is nxt and schedule.pending is None


def test_key_schedule_defaults_and_validation() -> None:
    schedule = KeySchedule("responder->initiator", cipher="chacha20-poly1305")
    assert not schedule.should_rotate(64 * 2**30 - 1, 2**30 - 1, 3599.0)
    assert schedule.should_rotate(0, 2**30, 0.0)
    assert schedule.current.key != KeySchedule("responder->initiator").current.key
    with pytest.raises(ValueError, match="direction"):
        KeySchedule("sideways")
    with pytest.raises(ValueError, match="packets"):
        RotationLimits(packets=0)
