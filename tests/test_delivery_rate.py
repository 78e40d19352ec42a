"""DeliveryRateEstimator on synthetic ack clocks."""

from __future__ import annotations

from collections import deque

import pytest

from wanxport.core.delivery_rate import DeliveryRateEstimator, PacketRateState, RateSample

SIZE = 1500
GAP_S = 0.001  # one packet per ms: 12 Mb/s
RTT_S = 0.050
RATE_BPS = SIZE * 8 / GAP_S


def run_clock(
    dre: DeliveryRateEstimator,
    *,
    packets: int,
    start: float = 0.0,
    ack_batch: int = 1,
    app_limited_after: int | None = None,
) -> list[RateSample]:
    """Send a packet every GAP_S; each is acked RTT_S later, ``ack_batch`` at a time."""
    samples: list[RateSample] = []
    in_flight: deque[tuple[float, PacketRateState]] = deque()
    pending: list[PacketRateState] = []
    sent = 0
    now = start
    while sent < packets or in_flight:
        next_send = start + sent * GAP_S if sent < packets else float("inf")
        next_ack = in_flight[0][0] if in_flight else float("inf")
        if next_ack <= next_send:
            now, state = in_flight.popleft()
            dre.on_packet_acked(state, SIZE, now)
            pending.append(state)
            if len(pending) == ack_batch or not in_flight:
                sample = dre.generate_sample(now, min_rtt_s=RTT_S)
                if sample is not None:
                    samples.append(sample)
                pending.clear()
        else:
            now = next_send
            if app_limited_after is not None and sent == app_limited_after:
                dre.on_app_limited(len(in_flight) * SIZE)
            in_flight.append((now + RTT_S, dre.on_packet_sent(now, len(in_flight) * SIZE)))
            sent += 1
    return samples


def test_constant_rate_ack_clock_yields_that_rate() -> None:
    dre = DeliveryRateEstimator()
    samples = run_clock(dre, packets=400)
    steady = samples[len(samples) // 4 :]
    assert len(steady) > 100  # one sample per ack: the checks below are not over nothing
    assert all(s.delivery_rate_bps == pytest.approx(RATE_BPS, rel=1e-6) for s in steady)
    assert all(s.rtt_s == pytest.approx(RTT_S) for s in samples)
    assert not any(s.is_app_limited for s in samples)
    assert dre.delivered_bytes == 400 * SIZE
    last = samples[-1]
    assert last.prior_delivered + last.delivered_bytes == dre.delivered_bytes
    assert last.interval_s == pytest.approx(last.delivered_bytes * 8 / RATE_BPS)


def test_batched_acks_give_the_same_rate() -> None:
    samples = run_clock(DeliveryRateEstimator(), packets=400, ack_batch=10)
    steady = samples[len(samples) // 4 : -1]
    assert steady
    assert all(s.delivery_rate_bps == pytest.approx(RATE_BPS, rel=1e-6) for s in steady)


def test_app_limited_phase_marks_its_samples_until_its_data_is_delivered() -> None:
    dre = DeliveryRateEstimator()
    samples = run_clock(dre, packets=200)
    assert not dre.is_app_limited
    # Nothing to send for a while (so nothing in flight), then a trickle: app-limited.
    samples = run_clock(dre, packets=20, start=1.0, app_limited_after=0)
    assert dre.is_app_limited is False  # its data has all been delivered
    assert samples and all(s.is_app_limited for s in samples)
    # A later full-rate phase is not marked.
    samples = run_clock(dre, packets=200, start=2.0)
    assert not any(s.is_app_limited for s in samples)


def test_idle_gap_does_not_dilute_the_next_rate() -> None:
    dre = DeliveryRateEstimator()
    run_clock(dre, packets=100)
    samples = run_clock(dre, packets=200, start=5.0)  # five idle seconds before
    assert samples[-1].delivery_rate_bps == pytest.approx(RATE_BPS, rel=1e-6)
    assert all(s.interval_s < 1.0 for s in samples)


def test_interval_shorter_than_min_rtt_is_discarded() -> None:
    dre = DeliveryRateEstimator()
    state = dre.on_packet_sent(0.0, 0)
    dre.on_packet_acked(state, SIZE, 0.010)
    assert dre.generate_sample(0.010, min_rtt_s=0.050) is None
    # An acked packet is consumed by the batch: the next batch has nothing.
    assert dre.generate_sample(0.011, min_rtt_s=0.0) is None


def test_sample_describes_the_most_recently_sent_packet_of_the_batch() -> None:
    dre = DeliveryRateEstimator()
    first = dre.on_packet_sent(0.0, 0)
    second = dre.on_packet_sent(0.001, SIZE)
    dre.on_packet_acked(second, SIZE, 0.051)
    dre.on_packet_acked(first, SIZE, 0.051)
    sample = dre.generate_sample(0.051, min_rtt_s=0.0)
    assert sample is not None
    assert sample.rtt_s == pytest.approx(0.050)
    assert sample.delivered_bytes == 2 * SIZE
    assert sample.interval_s == pytest.approx(0.051)
