"""A restarted session's careful resume from saved state, and the per-path rate cap (simulator).

Both are pacer-level behaviour of the core session, so they are checked in virtual
time, where the rates are exact and the runs deterministic: the gateway daemon only
hands the core saved state (``Session.resume_path``) and a cap (``PathConfig.max_rate_bps``).
"""

from __future__ import annotations

from typing import Any

import pytest

from wanxport.core.config import PathConfig, SessionConfig
from wanxport.core.session import Session
from wanxport.core.warm import MAX_AGE_S, PathMemory
from wanxport.scenario import parse_scenario
from wanxport.sim.runner import SimOptions, SimRun

RATE_BPS = 100e6
ONE_PATH = """
name = "restart"
seed = 3
[transfer]
size = "24MiB"
shards = 2
[[paths]]
name = "wan"
rtt_ms = 60.0
bandwidth_mbps = 100.0
"""
OPTIONS = SimOptions(payload_mode="virtual", fec="off")


def _run(memory: PathMemory | None = None, every_s: float = 0.005, until_s: float = 0.6
         ) -> tuple[dict[str, Any], SimRun, list[tuple[float, float, int]]]:
    """One transfer; samples (time, path 0's pacing rate, resumes so far) every ``every_s``."""
    run = SimRun(parse_scenario(ONE_PATH), OPTIONS)
    path = run.a.session.paths[0]
    if memory is not None:
        assert run.a.session.resume_path(0, memory, 0.0)
    samples: list[tuple[float, float, int]] = []

    def sample(at: float) -> None:
        samples.append((at, path.pacing_rate_bps, path.counters.resumes))

    for i in range(1, int(until_s / every_s)):
        run.loop.call_at(i * every_s, sample, i * every_s)
    return run.run(), run, samples


def test_a_restarted_path_resumes_at_half_the_saved_rate_within_a_round_trip() -> None:
    cold_report, _, cold = _run()
    saved = PathMemory(RATE_BPS, min_rtt_s=0.060, srtt_s=0.062, saved_at=0.0)
    report, run, warm = _run(saved)
    path = run.a.session.paths[0]
    assert report["intact"] and cold_report["intact"]
    assert (path.counters.resumes, path.counters.resumes_dropped) == (1, 0)
    resumed_at = next(i for i, (_, _, resumes) in enumerate(warm) if resumes)
    # The first acknowledgement (one round trip in) validates the route; until then the path
    # is cold, and from then on its first round is paced at half the saved rate, not above.
    assert 0.060 <= warm[resumed_at][0] <= 0.080
    assert warm[resumed_at - 1][1] == cold[resumed_at - 1][1], "before validation: as cold"
    assert warm[resumed_at][1] == pytest.approx(0.5 * RATE_BPS, rel=1e-6)
    first_round = [rate for at, rate, _ in warm if warm[resumed_at][0] <= at < warm[resumed_at][0] + 0.060]
    assert max(first_round) <= 0.5 * RATE_BPS * (1 + 1e-9)
    assert cold[resumed_at][1] < 0.5 * RATE_BPS, "a cold path is still far below it"
    assert report["completion_s"] < cold_report["completion_s"], (report["completion_s"],
                                                                  cold_report["completion_s"])


@pytest.mark.parametrize("min_rtt_s", [0.030, 0.080])
def test_saved_state_is_dropped_when_the_rtt_moved_more_than_20_percent(min_rtt_s: float) -> None:
    cold_report, _, _ = _run()
    moved = PathMemory(RATE_BPS, min_rtt_s=min_rtt_s, srtt_s=min_rtt_s * 1.02, saved_at=0.0)
    report, run, _ = _run(moved)
    path = run.a.session.paths[0]
    assert (path.counters.resumes, path.counters.resumes_dropped) == (0, 1)
    assert run.a.session.stats().paths[0].resumes_dropped == 1
    assert report["completion_s"] == cold_report["completion_s"], "dropped: exactly a cold start"


def test_resume_path_refuses_old_state_and_unknown_paths() -> None:
    session = Session(SessionConfig(paths=(PathConfig("p0"),)))
    memory = PathMemory(RATE_BPS, 0.06, 0.06, saved_at=0.0)
    assert not session.resume_path(0, memory, MAX_AGE_S + 1.0), "older than an hour"
    assert not session.resume_path(1, memory, 1.0)
    assert not session.resume_path(0, PathMemory(0.0, 0.06, 0.06, 0.0), 1.0), "no rate saved"
    assert session.paths[0].pending_resume is None
    assert session.resume_path(0, memory, 1.0) and session.paths[0].pending_resume == memory


CAP_BPS = 200e6
FAST = """
name = "capped"
seed = 5
[transfer]
size = "48MiB"
shards = 4
[[paths]]
name = "fast"
rtt_ms = 40.0
bandwidth_mbps = 1000.0
"""


def test_the_pacer_holds_a_capped_path_under_its_cap() -> None:
    free = SimRun(parse_scenario(FAST), OPTIONS).run()
    run = SimRun(parse_scenario(FAST), OPTIONS)
    # The cap PathConfig.max_rate_bps carries (the simulator builds its paths from the scenario).
    run.a.session.paths[0].max_rate_bps = CAP_BPS
    window_s = 0.1
    delivered: list[int] = []
    wanted: list[float] = []  # the controller's own pacing rate, before the cap

    def sample() -> None:
        stats = run.b.session.stats()
        delivered.append(stats.bytes_received + stats.receiving_bytes)
        wanted.append(run.a.session.paths[0].cc.pacing_rate_bps)

    for i in range(1, 30):
        run.loop.call_at(i * window_s, sample)
    report = run.run()
    assert report["intact"]
    rates = [(b - a) * 8 / window_s for a, b in zip(delivered, delivered[1:], strict=False)]
    assert max(wanted) > 1.2 * CAP_BPS, "the controller would send faster than the cap"
    assert max(rates) <= CAP_BPS * 1.02, max(rates)
    assert max(rates) >= CAP_BPS * 0.9, "and it does use the cap"
    size_bits = 48 * (1 << 20) * 8
    assert report["completion_s"] >= size_bits / CAP_BPS
    assert free["completion_s"] < size_bits / CAP_BPS / 2.5, "uncapped, the path is 5x faster"
    assert run.a.session.stats().paths[0].pacing_rate_bps <= CAP_BPS


def test_a_path_config_cap_reaches_the_pacer_and_is_validated() -> None:
    session = Session(SessionConfig(paths=(PathConfig("p0", max_rate_bps=CAP_BPS), PathConfig("p1"))))
    capped, free = session.paths
    assert capped.pacing_rate_bps <= CAP_BPS and capped.max_rate_bps == CAP_BPS
    assert free.max_rate_bps == float("inf")
    assert session.pacing_rates_bps()[0] <= CAP_BPS
    with pytest.raises(ValueError, match="max_rate_bps must be > 0"):
        SessionConfig(paths=(PathConfig("p0", max_rate_bps=0.0),))
