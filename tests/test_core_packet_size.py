"""Core packets grow on fast paths (core.packet_size), and a segmented packet's round trip
is timed from its last datagram (Transmitter._last_departure)."""

from __future__ import annotations

import pytest

from wanxport.core.cc import cc_config
from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.packet_size import PacketSizer
from wanxport.core.session import Session
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, simulate
from wanxport.wire.frames import AckFrame, DataFrame

BASE = 100_000  # bytes of the configured core packet


def test_a_packet_grows_in_powers_of_two_while_the_bandwidth_fills_it_within_the_budget() -> None:
    sizer = PacketSizer(BASE, budget_s=0.004, max_factor=8)
    # 0.004 s of 200 Mb/s is 100 kB: one base packet.
    assert sizer.update(200e6, in_startup=False, loss_ratio=0.0) == BASE
    # 0.004 s of 1 Gb/s is 500 kB: five base packets fit, so four (a power of two).
    assert sizer.update(1e9, in_startup=False, loss_ratio=0.0) == 4 * BASE
    # 0.004 s of 10 Gb/s: fifty fit, capped at the factor 8.
    assert sizer.update(10e9, in_startup=False, loss_ratio=0.0) == 8 * BASE


def test_a_packet_shrinks_only_when_the_bandwidth_falls_below_half_of_what_it_needs() -> None:
    sizer = PacketSizer(BASE, budget_s=0.004, max_factor=8)
    sizer.update(1.6e9, in_startup=False, loss_ratio=0.0)  # 8 base packets fit
    assert sizer.packet_bytes == 8 * BASE
    # 6 fit: below 8 but not below half of it, so the size holds (a noisy sample does not flip it).
    assert sizer.update(1.2e9, in_startup=False, loss_ratio=0.0) == 8 * BASE
    # 3 fit: less than half of 8, so it halves until no more than twice the fit remains.
    assert sizer.update(0.6e9, in_startup=False, loss_ratio=0.0) == 4 * BASE
    assert sizer.update(0.1e9, in_startup=False, loss_ratio=0.0) == BASE


def test_a_lossy_path_grows_its_packets_less_or_not_at_all() -> None:
    sizer = PacketSizer(BASE, budget_s=0.004, max_factor=8)
    assert sizer.update(10e9, in_startup=False, loss_ratio=0.004) == 4 * BASE  # 4 x 0.4 % <= 2 %
    assert sizer.update(10e9, in_startup=False, loss_ratio=0.03) == BASE  # a base packet: 3 % already
    assert sizer.update(10e9, in_startup=False, loss_ratio=0.0) == 8 * BASE


def test_startup_and_a_path_without_a_bandwidth_estimate_use_the_configured_packet() -> None:
    sizer = PacketSizer(BASE, budget_s=0.004, max_factor=8)
    sizer.update(10e9, in_startup=False, loss_ratio=0.0)
    assert sizer.update(10e9, in_startup=True, loss_ratio=0.0) == BASE
    sizer.update(10e9, in_startup=False, loss_ratio=0.0)
    assert sizer.update(0.0, in_startup=False, loss_ratio=0.0) == BASE


def test_growth_needs_segmented_packets_and_can_be_turned_off() -> None:
    path = PathConfig("p", 1500)
    assert SessionConfig(paths=(path,)).packet_sizer(path) is None  # one datagram per packet
    assert SessionConfig(paths=(path,), chunk_bytes=1000).packet_sizer(path) is None  # ... this too
    segmented = SessionConfig(paths=(path,), chunk_bytes=16 * 1400)
    assert segmented.packet_sizer(path) is not None
    assert SessionConfig(paths=(path,), chunk_bytes=16 * 1400, max_packet_growth=1).packet_sizer(path) is None
    assert SessionConfig(paths=(path,), chunk_bytes=16 * 1400, packet_budget_s=0.0).packet_sizer(path) is None
    scavenger = SessionConfig(paths=(path,), chunk_bytes=16 * 1400, congestion_control=cc_config("ledbat"))
    assert scavenger.packet_sizer(path) is None  # delay-based: a larger packet reads as a queue


@pytest.mark.parametrize("bad", [0, 3, 6, -2])
def test_max_packet_growth_must_be_a_power_of_two(bad: int) -> None:
    with pytest.raises(ValueError, match="max_packet_growth"):
        SessionConfig(paths=(PathConfig("p", 1500),), max_packet_growth=bad)


def test_a_negative_packet_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="packet_budget_s"):
        SessionConfig(paths=(PathConfig("p", 1500),), packet_budget_s=-0.001)


def _one_path(rtt_ms: float, mbps: float, size: str) -> str:
    return f"""
name = "one-path"
seed = 3
[transfer]
size = "{size}"
shards = 1
[[paths]]
name = "p"
rtt_ms = {rtt_ms}
bandwidth_mbps = {mbps}
"""


def _first_data_rtt(grown_factor: int) -> tuple[float, float]:
    """(the first DATA packet's round-trip sample, its first datagram's time to the ACK) with the
    path's packets grown ``grown_factor`` times past the configured 4 datagrams of 1000 bytes."""
    session = Session(SessionConfig(paths=(PathConfig("p", 1500),), chunk_bytes=4 * 1000,
                                    segment_bytes=1000), allocator=None)
    path = session.paths[0]
    assert path.sizer is not None
    path.sizer.factor = grown_factor  # as a fast path's bandwidth would have grown it
    path.mss = path.sizer.packet_bytes
    session.submit(0, bytes(100_000), 0.0)
    transmits = session.poll_transmit(0.0)
    first = next(tx for tx in transmits if isinstance(tx.frames[0], DataFrame))
    assert first.count == 4 * grown_factor
    acked_at = first.not_before + 0.050
    session.receive_packet(0, 0, [AckFrame(0, 0, ((0, first.first_pn + first.count - 1),))], acked_at)
    return path.rtt.latest_s, acked_at - first.not_before


def test_a_grown_packet_reads_the_round_trip_of_a_configured_size_one() -> None:
    # The peer acknowledges a packet once its last datagram has arrived, so a sample holds
    # the packet's own serialisation: the configured size's is kept (the controllers were
    # tuned with it), what growth adds is not.
    sample, since_first = _first_data_rtt(1)
    assert sample == pytest.approx(since_first, rel=1e-9)
    sample, since_first = _first_data_rtt(4)
    assert sample < since_first - 0.001  # 12 of 16 datagrams' spread at the initial rate: over 1 ms


def test_a_fast_path_sends_larger_packets_and_a_slow_one_keeps_the_configured_size() -> None:
    scenario = parse_scenario(_one_path(10.0, 2000.0, "256MiB"))  # Startup keeps the base size
    grown = simulate(scenario, SimOptions(datagrams_per_packet=16, payload_mode="virtual"))
    fixed = simulate(scenario, SimOptions(datagrams_per_packet=16, payload_mode="virtual",
                                          session={"max_packet_growth": 1}))
    assert grown["intact"] and fixed["intact"]
    per_packet = [r["paths"][0]["payload_bytes"] / r["paths"][0]["packets_sent"] for r in (grown, fixed)]
    assert per_packet[0] > 3 * per_packet[1]  # 2 Gb/s fills 8 base packets within the 8 ms budget
    slow = simulate(parse_scenario(_one_path(10.0, 20.0, "2MiB")),
                    SimOptions(datagrams_per_packet=16, payload_mode="virtual"))
    path = slow["paths"][0]
    assert path["payload_bytes"] / path["packets_sent"] <= 16 * 1500
