"""Data flowing both ways on the same paths: acknowledgements stay cheap and in order."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.session import Session
from wanxport.scenario import parse_scenario
from wanxport.sim.network import PathDirection
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
    original = PathDirection.send

    def counting_send(link: PathDirection, packet: Any, size: int) -> None:
        frames = packet.frames  # a virtual datagram: None for DATA
        kind = "data" if frames is None or any(isinstance(f, DataFrame) for f in frames) else "control"
        sent[kind] += size
        original(link, packet, size)

    monkeypatch.setattr(PathDirection, "send", counting_send)
    report = run.run()
    assert report["intact"]
    assert sent["control"] < 0.05 * sent["data"], sent


def _session() -> Session:
    config = SessionConfig(paths=(PathConfig("p", 1500),), receive_budget_bytes=1 << 30,
                           peer_credit_bytes=1 << 30, initial_rtt_s=0.05)
    return Session(config, allocator=lambda shard_id, size, meta: None)


def test_an_ack_leaves_ahead_of_data_handed_out_earlier_and_the_peer_sees_no_gap() -> None:
    """An ACK-only packet leaves now, not behind the data this side paced out ahead (with
    data both ways that coupled each side's RTT to the other's rate); the data keeps its
    order, and the peer, receiving the ACK before that data, owes no ACK at once for it."""
    sender = _session()
    sender.submit(0, None, 0.0, size=4 << 20)
    flight = sender.poll_transmit(0.0)
    handed_out = [tx for tx in flight if any(isinstance(f, DataFrame) for f in tx.frames)]
    last_departure = max(tx.not_before for tx in handed_out)
    assert last_departure > 0.0  # paced: some data departs later than now
    # The peer's data arrives now: the ACK for it leaves now too.
    sender.receive_packet(0, 0, [ShardOpenFrame(7, 1 << 20, bytes(32))], 0.0)
    sender.receive_packet(0, 1, [DataFrame(7, 0, 1000, None)], 0.0)
    sender.receive_packet(0, 3, [DataFrame(7, 2000, 1000, None)], 0.0)  # a gap: ack at once
    acks = [tx for tx in sender.poll_transmit(0.0) if any(isinstance(f, AckFrame) for f in tx.frames)]
    assert len(acks) == 1
    ack = acks[0]
    assert ack.not_before == 0.0
    assert ack.first_pn > max(tx.first_pn for tx in handed_out)
    ack_frame = next(f for f in ack.frames if isinstance(f, AckFrame))
    assert ack_frame.ack_delay_us == 0
    more = [tx for tx in sender.poll_transmit(0.0005) if any(isinstance(f, DataFrame) for f in tx.frames)]
    assert all(tx.not_before >= last_departure for tx in more)  # data still leaves in order
    # The peer: the first packet, then the ACK-only one, then the rest numbered below it.
    peer = _session().paths[0].acks
    numbers = sorted(pn for tx in flight for pn in range(tx.first_pn, tx.first_pn + tx.count))
    assert numbers == list(range(len(numbers))) and ack.first_pn == len(numbers)
    peer.on_packet_received(numbers[0], True, 0.0, 1 << 20, 0.005)
    peer.on_packet_received(ack.first_pn, False, 0.0, 1 << 20, 0.005)
    for pn in numbers[1:]:
        peer.on_packet_received(pn, True, 0.001, 1 << 20, 0.005)
    assert not peer.ack_now
