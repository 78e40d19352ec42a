"""The transport policies a gateway runs, run by the simulator: receive coalescing and stall detection.

Both are core decisions (``core.holdoff``, ``core.stall``); the asyncio endpoint
and the simulator only apply them, so these runs exercise what production runs.
"""

from __future__ import annotations

from typing import Any

import pytest

from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun

ONE_PATH = """
name = "one-path"
seed = 3
[transfer]
size = "{size}"
shards = 2
direction = "{direction}"
[[paths]]
name = "p"
rtt_ms = {rtt_ms}
bandwidth_mbps = {mbps}
{events}
"""
DOWN_FOR_GOOD = """
  [[paths.events]]
  at_s = 0.3
  down = true
"""


def run(rtt_ms: float, *, size: str = "1MiB", events: str = "", direction: str = "a->b",
        mbps: float = 20.0, **options: object) -> tuple[SimRun, dict[str, Any]]:
    scenario = parse_scenario(ONE_PATH.format(size=size, rtt_ms=rtt_ms, events=events, direction=direction,
                                              mbps=mbps))
    sim = SimRun(scenario, SimOptions(deadline_s=6.0, **options))  # type: ignore[arg-type]
    return sim, sim.run()


def test_the_receive_holdoff_coalesces_datagrams_on_a_long_path() -> None:
    (held, held_report), (plain, plain_report) = (run(40.0, receive_holdoff_s=0.001, receive_interval=False),
                                                  run(40.0, receive_holdoff_s=0.0))
    assert held_report["intact"] and plain_report["intact"]
    holdoff = held.b.session.receive_holdoff
    # A 40 ms path is long beside 8 hold-offs of 1 ms: the receiver holds throughout, and each
    # pass hands the session several datagrams at once.
    assert holdoff.holding and holdoff.yields == 0
    # Every datagram a sent b is at most an MTU: fewer passes than that many is coalescing.
    datagrams_at_least = sum(p.bytes_sent for p in held.a.session.stats().paths) // 1500
    assert 0 < holdoff.passes < datagrams_at_least / 2
    # Without a hold-off the driver reports no passes: the policy is off, nothing is held.
    assert plain.b.session.receive_holdoff.passes == 0 and not plain.b.held


def test_the_receive_holdoff_turns_itself_off_on_a_short_path() -> None:
    # Both ways, so each side measures the path's round trip with its own data; fast enough
    # that no queue builds up to lengthen it.
    sim, report = run(2.0, receive_holdoff_s=0.001, receive_interval=False, direction="both", mbps=1000.0)
    assert report["intact"]
    for side in (sim.a, sim.b):
        holdoff = side.session.receive_holdoff
        # Held until the first round trip was measured; then 2 ms < 8 x 1 ms: drained at once.
        assert not holdoff.holding and holdoff.passes > 0
        assert side.session.receive_holdoff.wait_s() == 0.0
    # The same run on a 40 ms path holds to the end on both sides.
    long, _ = run(40.0, receive_holdoff_s=0.001, receive_interval=False, direction="both", mbps=1000.0)
    assert all(side.session.receive_holdoff.holding for side in (long.a, long.b))


def test_the_control_interval_grows_with_the_round_trip_up_to_the_ack_delay() -> None:
    # Both ways, so each side measures the path. On 24 ms an eighth is 3 ms: each side holds
    # that long, and fewer, fuller passes carry the same transfer than with a fixed 1 ms.
    (grown, grown_report), (fixed, fixed_report) = (
        run(24.0, receive_holdoff_s=0.001, direction="both", mbps=100.0),  # growing with the round trip
        run(24.0, receive_holdoff_s=0.001, receive_interval=False, direction="both", mbps=100.0))
    assert grown_report["intact"] and fixed_report["intact"]
    for side, other in ((grown.a, fixed.a), (grown.b, fixed.b)):
        holdoff = side.session.receive_holdoff
        srtt = min(p.rtt.smoothed_s for p in side.session.paths)
        assert holdoff.holding and holdoff.interval_s == pytest.approx(srtt / 8)
        assert 0.001 < holdoff.interval_s <= side.session.config.max_ack_delay_s
        assert other.session.receive_holdoff.interval_s == 0.001
        assert 0 < holdoff.passes < other.session.receive_holdoff.passes
        # Everything arrived: the next burst's first wake holds only the floor.
        assert holdoff.wait_s() == 0.001
    # A 200 ms path would ask for 25 ms: the interval stops at the ACK delay.
    long, _ = run(200.0, receive_holdoff_s=0.001, direction="both")
    assert long.b.session.receive_holdoff.interval_s == long.b.session.config.max_ack_delay_s


def test_a_stalled_sender_is_reported_once_after_the_timeout() -> None:
    sim, report = run(20.0, size="4MiB", events=DOWN_FOR_GOOD, stall_timeout_s=1.0)
    assert not report["intact"]
    [stall] = sim.b.stalls
    # The last byte crossed before the path went down at 0.3 s (one way: 10 ms); the stall
    # falls due exactly one timeout after it, in virtual time.
    assert 1.3 - 0.02 <= stall.at <= 1.3 + 0.01
    assert stall.timeout_s == 1.0 and stall.open_shards >= 1
    assert 0 <= stall.received_bytes < stall.size
    assert "the sender stalled: no data for 1 s" in stall.describe()
    assert not sim.a.stalls  # the sender opened nothing: it watches nothing


def test_a_sender_that_keeps_sending_never_stalls() -> None:
    sim, report = run(20.0, size="4MiB", stall_timeout_s=0.05)
    assert report["intact"] and not sim.b.stalls
