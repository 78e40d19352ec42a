"""The receive hold-off ends with the data it waits for (``core.holdoff``).

A message's last datagram must not wait out a whole control interval after it
arrived: the hold-off after a held pass ends when the open shards' missing bytes
should be in, at the rate that pass saw, and the first wake of the next burst
holds only the floor. Bulk transfers keep the full interval.
"""

from __future__ import annotations

import pytest

from wanxport.core.cc import PathGroup
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.flow import ReceiveBudget
from wanxport.core.holdoff import ReceiveHoldoff
from wanxport.core.incoming import IncomingData
from wanxport.core.paths import Path
from wanxport.wire.frames import DIGEST_LEN, ShardOpenFrame

FLOOR_S = 0.001
SRTT_S = 0.020  # a 20 ms path: the full interval is SRTT_S / 8 = 2.5 ms
MAX_S = 0.010


def incoming_with(*sizes: int) -> IncomingData:
    incoming = IncomingData(ReceiveBudget(1 << 40), lambda shard_id, size, meta: None)
    for shard_id, size in enumerate(sizes):
        assert incoming.open(ShardOpenFrame(shard_id, size, bytes(DIGEST_LEN)))
    return incoming


def arrive(incoming: IncomingData, shard_id: int, offset: int, length: int) -> None:
    """As ``Reception.place`` does: place, and count the new bytes."""
    incoming.placed_total += incoming.shards[shard_id].place(offset, None, length, 0.0)


def holdoff_over(incoming: IncomingData) -> ReceiveHoldoff:
    config = SessionConfig(paths=(PathConfig("p"),))
    path = Path(0, "p", 1200, config.congestion_control.build(config.cc_context(0, PathGroup())), 0.1)
    path.rtt.update(SRTT_S, 0.0, now=0.5)  # the first sample is the smoothed RTT
    return ReceiveHoldoff(FLOOR_S, incoming, [path], max_s=MAX_S)


def test_the_hold_off_after_a_pass_ends_when_the_rest_of_the_message_should_be_in() -> None:
    size, first = 64 << 10, 36_000
    incoming = incoming_with(size)
    holdoff = holdoff_over(incoming)
    arrive(incoming, 0, 0, first)  # what a 2.5 ms hold-off gathered
    holdoff.after_pass(1.0, False, held_s=0.0025)
    rate = first / 0.0025
    assert holdoff.wait_s() == pytest.approx((size - first) / rate)
    assert holdoff.wait_s() < SRTT_S / 8 and holdoff.shortened == 1
    # The rest came in: nothing open lacks a byte, so the next burst's first wake holds the floor.
    arrive(incoming, 0, first, size - first)
    holdoff.after_pass(1.003, False, held_s=0.002)
    assert holdoff.wait_s() == FLOOR_S


def test_a_bulk_transfer_keeps_the_full_interval() -> None:
    incoming = incoming_with(64 << 20, 64 << 20)
    holdoff = holdoff_over(incoming)
    arrive(incoming, 0, 0, 36_000)
    holdoff.after_pass(1.0, False, held_s=0.0025)
    assert holdoff.wait_s() == pytest.approx(SRTT_S / 8)
    assert holdoff.shortened == 0


def test_until_a_held_pass_measured_the_arrival_rate_it_holds_the_floor() -> None:
    incoming = incoming_with(64 << 10)
    holdoff = holdoff_over(incoming)
    holdoff.after_pass(1.0, False, held_s=0.0025)  # the shard opened (a control packet), no data yet
    assert holdoff.wait_s() == FLOOR_S
    arrive(incoming, 0, 0, 1400)
    holdoff.after_pass(1.001, False, held_s=0.0)  # drained at once: no rate to go by
    assert holdoff.wait_s() == FLOOR_S
    arrive(incoming, 0, 1400, 14_000)
    holdoff.after_pass(1.002, False, held_s=FLOOR_S)  # 14 000 bytes in 1 ms: 50 000 more take 3.6 ms
    assert holdoff.wait_s() == pytest.approx(SRTT_S / 8)


def test_a_pass_whose_data_came_late_in_its_hold_does_not_lower_the_rate() -> None:
    incoming = incoming_with(50_000)
    holdoff = holdoff_over(incoming)
    arrive(incoming, 0, 0, 30_000)
    holdoff.after_pass(1.0, False, held_s=0.0025)  # 12 MB/s
    arrive(incoming, 0, 30_000, 1400)  # a hold begun by an ACK, the data at its very end
    holdoff.after_pass(1.01, False, held_s=0.0025)
    # By the larger rate the 18 600 bytes left take 1.55 ms; by the last pass's, 33 ms.
    assert holdoff.wait_s() == pytest.approx(18_600 / 12e6)


def test_only_missing_bytes_count_so_duplicates_do_not_end_it_early() -> None:
    size = 1 << 20
    incoming = incoming_with(size)
    holdoff = holdoff_over(incoming)
    arrive(incoming, 0, 0, 30_000)
    arrive(incoming, 0, 0, 30_000)  # a duplicate places nothing new
    holdoff.after_pass(1.0, False, held_s=0.0025)
    # 30 000 bytes per 2.5 ms: the ~1 MB missing take far longer than an interval.
    assert holdoff.wait_s() == pytest.approx(SRTT_S / 8)


def test_the_missing_bytes_are_summed_only_up_to_the_limit() -> None:
    incoming = incoming_with(*([1000] * 50))
    assert incoming.missing_bytes(1 << 30) == 50_000
    assert incoming.missing_bytes(2500) == 3000  # three shards looked at, not fifty
