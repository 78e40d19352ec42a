"""Data flowing both ways on the same paths: acknowledgements stay cheap and in order."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.session import Session
from wanxport.scenario import parse_scenario
from wanxport.sim.network import Link
from wanxport.sim.runner import SimOptions, SimRun
from wanxport.wire.frames import AckFrame, DataFrame, ShardOpenFrame

BOTH_WAYS = """
name = "both-ways"
seed = 11
[transfer]
size = "24MiB"
shards = 4
direction = "both"
[[paths]]
name = "p1"
rtt_ms = 40.0
bandwidth_mbps = 60.0
loss = 0.002
[[paths]]
name = "p2"
rtt_ms = 70.0
bandwidth_mbps = 40.0
loss = 0.001
"""


def test_both_directions_spend_little_on_acknowledgements(monkeypatch: pytest.MonkeyPatch) -> None:
    """ACK-only packets must stay a small share of each direction's bytes.

    They were a third of it: ACKs left at once, overtaking paced data with lower
    packet numbers, the peer took that for reordering and answered every data
    packet with an immediate ACK carrying 64 ranges.
    """
    run = SimRun(parse_scenario(BOTH_WAYS), SimOptions(payload_mode="virtual"))
    sent: Counter[str] = Counter()
    original = Link.send

    def counting_send(link: Link, packet: Any, size: int) -> None:
        frames = packet.frames  # a virtual datagram: None for DATA
        kind = "data" if frames is None or any(isinstance(f, DataFrame) for f in frames) else "control"
        sent[kind] += size
        original(link, packet, size)

    monkeypatch.setattr(Link, "send", counting_send)
    report = run.run()
    assert report["intact"]
    assert sent["control"] < 0.05 * sent["data"], sent


def _session() -> Session:
    config = SessionConfig(paths=(PathConfig("p", 1500),), receive_budget_bytes=1 << 30,
                           peer_credit_bytes=1 << 30, initial_rtt_s=0.05)
    return Session(config, allocator=lambda shard_id, size, meta: None)


def test_an_ack_never_leaves_before_data_handed_out_earlier() -> None:
    """Packets leave a path in packet-number order, the ACK included, and its delay says so."""
    sender = _session()
    sender.submit(0, None, 0.0, size=4 << 20)
    handed_out = [tx for tx in sender.poll_transmit(0.0) if any(isinstance(f, DataFrame) for f in tx.frames)]
    last_departure = max(tx.not_before for tx in handed_out)
    assert last_departure > 0.0  # paced: some data departs later than now
    # The peer's data arrives now: the ACK for it must queue behind our data.
    sender.receive_packet(0, 0, [ShardOpenFrame(7, 1 << 20, bytes(32))], 0.0)
    sender.receive_packet(0, 1, [DataFrame(7, 0, 1000, None)], 0.0)
    sender.receive_packet(0, 3, [DataFrame(7, 2000, 1000, None)], 0.0)  # a gap: ack at once
    acks = [tx for tx in sender.poll_transmit(0.0) if any(isinstance(f, AckFrame) for f in tx.frames)]
    assert len(acks) == 1
    ack = acks[0]
    assert ack.not_before >= last_departure
    assert ack.first_pn > max(tx.first_pn for tx in handed_out)
    ack_frame = next(f for f in ack.frames if isinstance(f, AckFrame))
    assert ack_frame.ack_delay_us == pytest.approx(last_departure * 1e6, abs=1)
