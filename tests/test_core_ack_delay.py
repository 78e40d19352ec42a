"""How long a receiver's delayed ACK waits: fixed, or an eighth of the path's RTT within bounds."""

from __future__ import annotations

import dataclasses

import pytest

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.digest import shard_digest
from wanxport.core.session import Session
from wanxport.presets import COLLECTIVE, GATEWAY, session_config
from wanxport.wire.frames import DataFrame, ShardOpenFrame

DATA = bytes(range(256)) * 16
FLOOR_S, CEILING_S = 0.001, 0.010


def receiver(min_ack_delay_s: float | None, srtt_s: float | None) -> Session:
    config = SessionConfig(paths=(PathConfig("p", 1500),), max_ack_delay_s=CEILING_S,
                           min_ack_delay_s=min_ack_delay_s, ack_threshold=64)
    session = Session(config)
    if srtt_s is not None:
        session.paths[0].rtt.update(srtt_s, 0.0, 0.0)
    return session


def waits_s(session: Session, now: float = 1.0) -> float:
    """How long the ACK of one ack-eliciting datagram (an open and some data) may wait."""
    frames = [ShardOpenFrame(0, len(DATA), shard_digest(DATA)), DataFrame(0, 0, 100, DATA[:100])]
    session.receive_packet(0, 0, frames, now)
    ack_at = session.paths[0].acks.ack_at
    assert ack_at is not None and not session.paths[0].acks.ack_now
    return ack_at - now


@pytest.mark.parametrize(("srtt_s", "expected_s"), [
    (None, FLOOR_S),  # no RTT sample yet: the floor
    (0.002, FLOOR_S),  # a short path: never longer than the floor
    (0.040, 0.005),  # an eighth of the RTT
    (0.200, CEILING_S),  # a long path: at most the ceiling
])
def test_a_paths_delayed_ack_follows_its_rtt_within_the_bounds(srtt_s: float | None,
                                                               expected_s: float) -> None:
    assert waits_s(receiver(FLOOR_S, srtt_s)) == pytest.approx(expected_s)


@pytest.mark.parametrize("srtt_s", [None, 0.002, 0.200])
def test_without_a_floor_every_delayed_ack_waits_the_configured_delay(srtt_s: float | None) -> None:
    assert waits_s(receiver(None, srtt_s)) == pytest.approx(CEILING_S)


def test_a_data_run_from_the_native_path_waits_the_same() -> None:
    session = receiver(FLOOR_S, 0.040)
    session.receive_packet(0, 0, [ShardOpenFrame(0, len(DATA), shard_digest(DATA))], 1.0)
    session.paths[0].acks.ack_sent()
    session.receive_data_run(0, 1, 3, 0, 0, 300, 2.0)
    assert session.paths[0].acks.ack_at == pytest.approx(2.0 + 0.005)


@pytest.mark.parametrize("bad", [0.0, -0.001, 0.011])
def test_a_floor_outside_zero_to_the_ceiling_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="min_ack_delay_s"):
        SessionConfig(paths=(PathConfig("p"),), max_ack_delay_s=CEILING_S, min_ack_delay_s=bad)


def test_the_presets_delays() -> None:
    """The gateway's ACK delay follows each path's RTT from 1 ms to 10 ms (it serves any path);
    the collective's is a fixed 10 ms (WAN paths only). A user's delay below the gateway's floor
    makes it fixed there."""
    gateway = session_config(["p"], GATEWAY)
    assert (gateway.min_ack_delay_s, gateway.max_ack_delay_s) == (0.001, 0.010)
    collective = session_config(["p"], COLLECTIVE)
    assert (collective.min_ack_delay_s, collective.max_ack_delay_s) == (None, 0.010)
    short = session_config(["p"], dataclasses.replace(GATEWAY, ack_delay_s=0.0005))
    assert short.min_ack_delay_s == short.max_ack_delay_s == 0.0005
