"""The windowed max/min filters against brute-force windows over random samples."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanxport.core.windowed_filter import RoundMaxFilter, RunningMinFilter

ROUNDS = 10
WINDOW_S = 5.0

# (rounds since the previous sample, sample): gaps of 0 put several samples in one round,
# gaps beyond ROUNDS empty the window.
round_samples = st.lists(st.tuples(st.integers(0, 14), st.floats(0.0, 1e10)), min_size=1, max_size=80)
# (seconds since the previous sample, sample)
timed_samples = st.lists(st.tuples(st.floats(0.0, 3.0), st.floats(0.001, 1.0)), min_size=1, max_size=80)


@given(round_samples)
def test_round_max_is_the_exact_max_of_the_last_rounds(steps: list[tuple[int, float]]) -> None:
    window = RoundMaxFilter(ROUNDS)
    history: list[tuple[int, float]] = []
    now = 0
    for gap, sample in steps:
        now += gap
        window.update(now, sample)
        history.append((now, sample))
        assert window.value == max((v for r, v in history if r > now - ROUNDS), default=0.0)


@given(round_samples, round_samples)
def test_round_max_reset_forgets_everything(before: list[tuple[int, float]],
                                            after: list[tuple[int, float]]) -> None:
    window = RoundMaxFilter(ROUNDS)
    now = 0
    for gap, sample in before:
        now += gap
        window.update(now, sample)
    window.reset()
    assert window.value == 0.0
    fresh = RoundMaxFilter(ROUNDS)
    now = 0
    for gap, sample in after:
        now += gap
        window.update(now, sample)
        fresh.update(now, sample)
        assert window.value == fresh.value


def test_round_max_holds_its_estimate_while_no_sample_arrives() -> None:
    """It ages by the rounds between samples, measured when the next one arrives."""
    window = RoundMaxFilter(ROUNDS)
    window.update(3, 100.0)
    window.update(4, 10.0)
    assert window.value == 100.0
    window.update(3 + ROUNDS - 1, 20.0)  # round 3 is still inside the window
    assert window.value == 100.0
    window.update(3 + ROUNDS, 20.0)
    assert window.value == 20.0


@given(timed_samples)
def test_running_min_is_a_sample_of_the_window_no_larger_than_the_latest(
        steps: list[tuple[float, float]]) -> None:
    first = steps[0][1]
    window = RunningMinFilter(WINDOW_S, 0.0, first)
    history = [(0.0, first)]
    now = 0.0
    for gap, sample in steps[1:]:
        now += gap
        window.update(now, sample)
        history.append((now, sample))
        recent = [v for t, v in history if t >= now - WINDOW_S]
        assert window.value in recent
        assert min(recent) <= window.value <= sample


@given(timed_samples, st.floats(0.0001, 1.0))
def test_running_min_takes_a_new_minimum_at_once(steps: list[tuple[float, float]], fraction: float) -> None:
    window = RunningMinFilter(WINDOW_S, 0.0, steps[0][1])
    now = 0.0
    for gap, sample in steps[1:]:
        now += gap
        window.update(now, sample)
    lower = window.value * fraction
    window.update(now, lower)
    assert window.value == lower


def test_running_min_forgets_a_minimum_older_than_the_window() -> None:
    window = RunningMinFilter(WINDOW_S, 0.0, 0.050)
    t = 0.0
    while t < WINDOW_S - 0.5:
        t += 0.1
        window.update(t, 0.080)
    assert window.value == 0.050
    while t < 2 * WINDOW_S:
        t += 0.1
        window.update(t, 0.080)
    assert window.value == 0.080
    window.reset(t, 0.2)
    assert window.value == 0.2


@pytest.mark.parametrize("rounds", [0, -1])
def test_round_max_needs_a_positive_round_count(rounds: int) -> None:
    with pytest.raises(ValueError, match="rounds"):
        RoundMaxFilter(rounds)


def test_running_min_needs_a_positive_window() -> None:
    with pytest.raises(ValueError, match="window_s"):
        RunningMinFilter(0.0, 0.0, 1.0)
