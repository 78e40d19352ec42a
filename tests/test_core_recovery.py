"""Loss detection timers: a loss deadline, when it fires, must declare the packet lost.

If ``loss_deadline`` says "at t" but ``detect_losses(t)`` finds nothing, the
driver re-arms the same timer at the same instant forever: virtual time stops.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wanxport.core import recovery
from wanxport.core.cc import BbrConfig, CcContext
from wanxport.core.paths import Path
from wanxport.core.sent_packets import SentPacket

MSS = 1400


def new_path() -> Path:
    cc = BbrConfig(probe_rtt=True).build(CcContext(mss_bytes=MSS + 16, initial_rtt_s=0.1))
    return Path(0, "p", MSS, cc, 0.1)


def send(path: Path, at: float) -> SentPacket:
    pn = path.take_pn()
    packet = SentPacket(pn, at, MSS + 16, [(0, pn * MSS, MSS)], None, True, True,
                        path.rate.on_packet_sent(at, path.bytes_in_flight))
    recovery.on_packet_sent(path, packet)
    return packet


def loss_timer_fires(sent_at: float, rtt_s: float) -> None:
    path = new_path()
    first = send(path, sent_at)
    send(path, sent_at)
    # The second packet is acknowledged one RTT later; the first is not (yet) lost.
    acked, lost = recovery.on_ack(path, ((1, 1),), 0.0, sent_at + rtt_s)
    assert [p.pn for p in acked] == [1]
    if lost:
        return  # the time threshold was already met: nothing left to test
    deadline = recovery.loss_deadline(path)
    assert deadline is not None
    lost = recovery.detect_losses(path, deadline)
    assert first in lost, (
        f"loss deadline {deadline!r} fired but the packet sent at {sent_at!r} was not declared lost; "
        f"loss delay {recovery.loss_delay_s(path)!r}")


def test_loss_deadline_from_a_simulator_hang() -> None:
    """Floats seen when a 2-path simulation stopped advancing time (see the report)."""
    path = new_path()
    path.time_threshold = 1.0
    first = send(path, 0.028124999999999997)
    send(path, 0.028124999999999997)
    recovery.on_ack(path, ((1, 1),), 0.0, 0.0282)
    delay = 0.12493877928448763
    path.rtt.smoothed_s = path.rtt.latest_s = delay
    deadline = recovery.loss_deadline(path)
    assert deadline == 0.1530637792844876
    assert first in recovery.detect_losses(path, deadline), "timer fires, nothing is lost: livelock"


@pytest.mark.parametrize("sent_at,rtt_s", [(0.1, 0.2), (1.0, 0.05), (3.3, 0.0123)])
def test_loss_deadline_declares_loss(sent_at: float, rtt_s: float) -> None:
    loss_timer_fires(sent_at, rtt_s)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.floats(0.0, 100.0, allow_nan=False), st.floats(0.001, 0.5, allow_nan=False))
def test_loss_deadline_always_declares_loss(sent_at: float, rtt_s: float) -> None:
    loss_timer_fires(sent_at, rtt_s)
