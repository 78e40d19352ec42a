"""Path health: every (state, event) pair of the transition table, and the probing/resume state."""

from __future__ import annotations

import itertools

import pytest

from wanxport.core.cc import CcContext
from wanxport.core.cc.fixed import FixedConfig, FixedRateCongestionController
from wanxport.core.health import (
    PROBE_MISS_LIMIT,
    TRANSITIONS,
    HealthEvent,
    IllegalTransition,
    PathHealth,
    PathState,
)
from wanxport.core.rtt import RttEstimator

A, P, D, F = PathState.ACTIVE, PathState.PROBING, PathState.DEGRADED, PathState.FAILED
PTO, MISSES, ACK, DONE = (HealthEvent.PTO, HealthEvent.PROBE_MISSES, HealthEvent.ACK,
                          HealthEvent.STARTUP_DONE)

# The machine written out once more, independently of TRANSITIONS: None is illegal.
EXPECTED: dict[tuple[PathState, HealthEvent], PathState | None] = {
    (A, PTO): D, (A, MISSES): F, (A, ACK): A, (A, DONE): None,
    (P, PTO): D, (P, MISSES): F, (P, ACK): P, (P, DONE): A,
    (D, PTO): D, (D, MISSES): F, (D, ACK): A, (D, DONE): None,
    (F, PTO): F, (F, MISSES): F, (F, ACK): P, (F, DONE): None,
}


def health_in(state: PathState) -> PathHealth:
    health = PathHealth()
    health.state = state
    health.usable = state in (A, P)
    return health


def test_the_expected_table_covers_every_pair() -> None:
    assert set(EXPECTED) == set(itertools.product(PathState, HealthEvent))
    assert {pair for pair, new in EXPECTED.items() if new is not None} == set(TRANSITIONS)


@pytest.mark.parametrize(("state", "event"), list(itertools.product(PathState, HealthEvent)))
def test_every_state_event_pair(state: PathState, event: HealthEvent) -> None:
    health = health_in(state)
    expected = EXPECTED[(state, event)]
    if expected is None:
        with pytest.raises(IllegalTransition, match=f"{event.value!r} in state {state.value!r}"):
            health.fire(event)
        assert health.state is state  # an illegal event leaves the machine where it was
        return
    assert health.next_state(event) is expected
    before = health.fire(event)
    assert before is state
    assert health.state is expected
    assert health.usable == (expected in (A, P))
    assert health.counters.failures == (1 if expected is F and state is not F else 0)


def test_a_path_fails_after_the_probe_miss_limit_and_comes_back_through_probing() -> None:
    health = PathHealth()
    health.fire(PTO)
    assert health.state is D and not health.usable
    for _ in range(PROBE_MISS_LIMIT - 1):
        assert not health.probe_missed()
    assert health.probe_missed()
    health.fire(MISSES)
    health.fire(MISSES)  # more misses while failed: no second failure
    assert (health.state, health.counters.failures) == (F, 1)
    health.fire(ACK)
    assert health.state is P and health.usable
    health.answered()
    assert health.probe_misses == 0 and health.next_probe_at is None
    health.fire(DONE)
    assert health.state is A


def test_each_probe_gets_a_new_token_and_its_deadline() -> None:
    health = PathHealth()
    assert health.next_probe(1.5) == 1
    assert health.next_probe(2.5) == 2
    assert health.next_probe_at == 2.5


def _measured(rtt_s: float) -> tuple[FixedRateCongestionController, RttEstimator]:
    rtt = RttEstimator(initial_rtt_s=0.1)
    for i in range(5):
        rtt.update(rtt_s, 0.0, i * 0.1)
    return FixedConfig(rate_bps=50e6).build(CcContext(mss_bytes=1416)), rtt


def test_resume_state_is_saved_only_from_an_active_measured_path() -> None:
    cc, rtt = _measured(0.05)
    degraded = health_in(D)
    degraded.save_for_resume(cc, rtt, 0.5)
    assert degraded.saved is None  # not active: nothing validated to save
    unmeasured = PathHealth()
    unmeasured.save_for_resume(cc, RttEstimator(initial_rtt_s=0.1), 0.5)
    assert unmeasured.saved is None  # no RTT sample yet
    health = PathHealth()
    health.save_for_resume(cc, rtt, 0.5)
    assert health.saved is not None
    assert (health.saved.rate_bps, health.saved.min_rtt_s, health.saved.srtt_s) == (
        50e6, rtt.min_recent_s, rtt.smoothed_s)
    assert health.resume_rate_bps(rtt, 1.0) == 50e6
    assert health.resume_rate_bps(rtt, 0.5 + 3601.0) == 0.0  # saved more than an hour ago
    rtt.update(0.5, 0.0, 1.0)  # the answer came over a much longer route
    assert health.resume_rate_bps(rtt, 1.0) == 0.0
