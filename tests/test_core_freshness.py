"""An idle path's RTT estimate is kept fresh by rate-limited probes (core.freshness), and the
scheduler's expected arrival follows the fresh sample at once (``Path.one_way_s``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_core_session import Pair, all_acknowledged, make_config, payloads

from wanxport.core import freshness
from wanxport.core.cc import CongestionController, PathGroup
from wanxport.core.counters import PathCounters
from wanxport.core.freshness import STALE_AFTER_RTTS, STALE_AFTER_S, RttFreshness
from wanxport.core.paths import Path
from wanxport.core.rtt import RttEstimator
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun
from wanxport.wire.frames import Frame, ProbeFrame

SMALL_STEPS = """
name = "stale-fast-path"
seed = 3
[transfer]
size = "64KiB"
shards = 1
direction = "a->b"
steps = 60
think_ms = 50.0
[[paths]]
name = "fast"
rtt_ms = 20.0
bandwidth_mbps = 200.0
[[paths]]
name = "slow"
rtt_ms = 55.0
bandwidth_mbps = 200.0
"""
STALL_S = 1.0  # the fast path's acknowledgements leave 0.8 s late until then (a stalled host)
STALL_EXTRA_RTT_MS = 1600.0


def test_the_clock_starts_with_the_first_shard_and_restarts_at_each_sample() -> None:
    rtt = RttEstimator(initial_rtt_s=0.1)
    counters = PathCounters()
    clock = RttFreshness(counters)
    assert clock.due_at(rtt) == float("inf")  # the session has had nothing to send yet
    assert clock.start(1.0) and not clock.start(1.5)
    assert clock.due_at(rtt) == pytest.approx(1.0 + STALE_AFTER_S)  # never measured: from the start
    rtt.update(0.5, 0.0, now=2.0)
    assert clock.due_at(rtt) == pytest.approx(2.0 + STALE_AFTER_RTTS * 0.5)
    assert clock.probe(rtt, usable=True, session_open=True, now=3.0) is None  # not stale yet
    probe = clock.probe(rtt, usable=True, session_open=True, now=3.5)
    assert isinstance(probe, ProbeFrame) and counters.rtt_probes == 1
    rtt.update(0.02, 0.0, now=3.6)  # its answer
    assert clock.due_at(rtt) == pytest.approx(3.6 + max(STALE_AFTER_S, STALE_AFTER_RTTS * rtt.smoothed_s))
    assert clock.probe(rtt, usable=False, session_open=True, now=100.0) is None  # suspected or failed
    assert clock.probe(rtt, usable=True, session_open=False, now=100.0) is None
    assert clock.due_at(rtt) == float("inf") and counters.rtt_probes == 1  # closed: stopped for good


def test_expected_arrival_takes_a_low_sample_at_once() -> None:
    """One stall-inflated sample then one fresh one: the smoothed RTT still reads ~0.73 s,
    the scheduler's one-way delay the fresh route's."""
    path = Path(0, "p", 1200, make_cc(), 0.1)
    path.rtt.update(0.83, 0.0, now=1.0)
    path.rtt.update(0.02, 0.0, now=4.0)
    assert path.rtt.smoothed_s > 0.7
    assert path.one_way_s == pytest.approx(0.01)


def make_cc() -> CongestionController:
    config = make_config(paths=1)
    return config.congestion_control.build(config.cc_context(0, PathGroup()))


def stalled_run(probes: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[SimRun, list[int], list[int]]:
    """60 small steps; the fast path's first acknowledgements are all ~0.8 s late. Returns the
    run and each path's payload bytes once the fast path's estimate recovered, then at the end."""
    if not probes:
        monkeypatch.setattr(RttFreshness, "due_at", lambda self, rtt: float("inf"))
    run = SimRun(parse_scenario(SMALL_STEPS), SimOptions(payload_mode="virtual"))
    acks = run.network.reverse[0]
    clean = acks.params
    acks.set_params(replace(clean, rtt_ms=clean.rtt_ms + STALL_EXTRA_RTT_MS))
    run.loop.call_at(STALL_S, acks.set_params, clean)
    # By then the late acknowledgements are in (STALL_S + 0.8 s), the estimate (~0.82 s)
    # has gone stale (STALE_AFTER_RTTS of it) and a probe's answer has come back.
    recovered_at = STALL_S + 0.82 * (1 + STALE_AFTER_RTTS) + 0.2
    fast_payload: list[int] = []
    slow_payload: list[int] = []

    def note() -> None:
        fast, slow = run.a.session.stats().paths
        fast_payload.append(fast.payload_bytes)
        slow_payload.append(slow.payload_bytes)

    run.loop.call_at(recovered_at, note)
    report = run.run()
    assert report["intact"] is True and len(report["step_s"]) == 60
    note()
    return run, fast_payload, slow_payload


def test_small_messages_return_to_the_fast_path_once_it_is_probed(monkeypatch: pytest.MonkeyPatch) -> None:
    run, fast_payload, slow_payload = stalled_run(True, monkeypatch)
    fast, slow = run.a.session.stats().paths
    assert fast.rtt_probes >= 1
    assert slow_payload[0] == slow_payload[1], "every step after the probe went on the fast path"
    assert fast_payload[1] - fast_payload[0] >= 10 * 64 * 1024  # ... and there were many


@pytest.mark.skipif(freshness.__file__.endswith(".so"),
                    reason="switching the probes off patches a class, which a mypyc-compiled build forbids")
def test_without_the_probes_the_inflated_estimate_sticks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The contrast: the fast path carries nothing after the stall, so nothing corrects it."""
    run, _, slow_payload = stalled_run(False, monkeypatch)
    fast, slow = run.a.session.stats().paths
    assert fast.rtt_probes == 0
    assert slow_payload[1] > slow_payload[0]
    assert fast.min_rtt_s is not None and fast.min_rtt_s > 0.5  # only stalled samples, ever
    assert slow.payload_bytes > fast.payload_bytes


NEVER_MEASURED = SMALL_STEPS.replace('size = "64KiB"', 'size = "16KiB"').replace("steps = 60", "steps = 30")


def test_a_path_never_given_data_is_measured_and_then_used() -> None:
    """Listed first, the slow path measures 55 ms, under the fast path's initial 100 ms
    estimate, and carries every 16 KiB message (one stripe); the fast path had no sample
    to correct that until its probe."""
    text = NEVER_MEASURED.split("[[paths]]")
    run = SimRun(parse_scenario(text[0] + "[[paths]]" + text[2] + "[[paths]]" + text[1]),
                 SimOptions(payload_mode="virtual"))
    report = run.run()
    assert report["intact"] is True
    slow, fast = run.a.session.stats().paths
    assert (slow.name, fast.name) == ("slow", "fast")
    assert fast.rtt_probes >= 1 and fast.srtt_s is not None and fast.srtt_s < slow.srtt_s
    assert fast.payload_bytes > 0


def test_an_idle_session_probes_each_path_about_once_a_second_and_a_failed_one_not_at_all() -> None:
    """Path 1 goes dark at 50 ms while the shards are in flight and fails; then the session
    sits idle for a minute. Path 0 gets one probe per stale interval, never more; path 1
    only the failover probes of a failed path."""
    def drop(side: str, path_id: int, at: float, frames: list[Frame]) -> bool:
        return path_id == 1 and at >= 0.05

    pair = Pair(make_config(), owd_s=[0.01, 0.03], rate_bps=[40e6, 20e6], drop=drop)
    for shard_id, data in enumerate(payloads(4, 64_000)):
        pair.submit("a", shard_id, data)
    pair.run(30.0, stop=all_acknowledged(4))
    assert len(pair.acknowledged("a")) == 4
    pair.run(pair.now + 2.0)  # the last acknowledgements and SHARD_DONEs settle
    idle_from = pair.now
    before = pair.a.stats().paths
    idle_s = 60.0
    pair.run(idle_from + idle_s)
    steady, dark = pair.a.stats().paths
    assert dark.state == "failed"
    assert dark.rtt_probes == before[1].rtt_probes, "a failed path gets no freshness probes"
    assert dark.packets_sent > before[1].packets_sent  # ... only the failover ones
    probes = steady.rtt_probes - before[0].rtt_probes
    assert idle_s / (STALE_AFTER_S + 0.1) - 1 <= probes <= idle_s / STALE_AFTER_S + 1
    # Nothing else leaves the idle path: each probe is one small packet.
    assert steady.packets_sent - before[0].packets_sent == probes
    assert (steady.bytes_sent - before[0].bytes_sent) / idle_s < 100  # bytes a second, one way
    assert pair.b.stats().paths[0].rtt_probes > 0  # both ends keep their own estimates fresh
    pair.a.close(pair.now)
    pair.run(pair.now + 10.0)
    assert pair.a.stats().paths[0].rtt_probes == steady.rtt_probes  # closed: no more
