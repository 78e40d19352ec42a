"""RttEstimator against hand-computed RFC 9002 section 5 values."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wanxport.core.rtt import MIN_PTO_S, RttEstimator


def test_before_the_first_sample_everything_is_the_initial_rtt() -> None:
    rtt = RttEstimator()
    assert not rtt.has_sample
    assert rtt.smoothed_s == rtt.latest_s == rtt.min_s == rtt.min_recent_s == 0.333
    assert rtt.rttvar_s == pytest.approx(0.1665)
    # PTO = srtt + max(4 rttvar, 1 ms) + max_ack_delay
    assert rtt.pto_s(0.025) == pytest.approx(0.333 + 4 * 0.1665 + 0.025)
    assert RttEstimator(initial_rtt_s=0.1).smoothed_s == 0.1


def test_rfc9002_update_sequence() -> None:
    rtt = RttEstimator()
    rtt.update(0.100, 0.0, now=1.0)  # first sample: srtt = sample, rttvar = sample / 2
    assert rtt.has_sample
    assert (rtt.latest_s, rtt.smoothed_s, rtt.rttvar_s, rtt.min_s) == (0.1, 0.1, 0.05, 0.1)

    rtt.update(0.120, 0.010, now=2.0)  # 0.12 >= min + ack_delay: adjusted = 0.11
    assert rtt.min_s == 0.1
    assert rtt.rttvar_s == pytest.approx(0.75 * 0.05 + 0.25 * 0.01)  # 0.04
    assert rtt.smoothed_s == pytest.approx(0.875 * 0.1 + 0.125 * 0.11)  # 0.10125

    rtt.update(0.105, 0.010, now=3.0)  # 0.105 < min + ack_delay: delay not subtracted
    assert rtt.latest_s == 0.105
    assert rtt.rttvar_s == pytest.approx(0.75 * 0.04 + 0.25 * abs(0.10125 - 0.105))
    assert rtt.smoothed_s == pytest.approx(0.875 * 0.10125 + 0.125 * 0.105)
    assert rtt.pto_s(0.025) == pytest.approx(0.10171875 + 4 * 0.0309375 + 0.025)

    rtt.update(0.090, 0.050, now=4.0)  # a new minimum; ack delay never lowers min_s
    assert rtt.min_s == 0.09
    assert rtt.smoothed_s == pytest.approx(0.875 * 0.10171875 + 0.125 * 0.09)


def test_pto_variance_term_has_a_granularity_floor() -> None:
    rtt = RttEstimator()
    for i in range(200):
        rtt.update(0.05, 0.0, now=float(i))
    assert rtt.rttvar_s < 0.00025
    assert rtt.pto_s(0.0) == pytest.approx(0.05 + 0.001)


def test_pto_of_a_sub_millisecond_path_is_floored_at_ten_milliseconds() -> None:
    """A loopback or LAN path's RFC timeout (here 0.5 + 1 + 1 ms) is shorter than a busy
    host's scheduling stalls; the floor takes over, and only below 10 ms."""
    rtt = RttEstimator()
    for i in range(200):
        rtt.update(0.0005, 0.0, now=float(i))
    assert rtt.pto_s(0.001) == MIN_PTO_S == 0.010
    for i in range(200, 400):
        rtt.update(0.020, 0.0, now=float(i))
    assert rtt.pto_s(0.001) == pytest.approx(0.020 + 0.001 + 0.001, abs=1e-4)  # above the floor


def test_non_positive_samples_are_ignored() -> None:
    rtt = RttEstimator()
    rtt.update(0.0, 0.0, now=1.0)
    rtt.update(-1.0, 0.0, now=1.0)
    assert not rtt.has_sample
    assert rtt.smoothed_s == 0.333


def test_windowed_min_forgets_an_old_minimum_but_lifetime_min_does_not() -> None:
    rtt = RttEstimator(min_window_s=10.0)
    rtt.update(0.050, 0.0, now=0.0)
    t = 0.0
    while t < 9.0:
        t += 0.1
        rtt.update(0.080, 0.0, now=t)
    assert rtt.min_recent_s == 0.05
    while t < 20.0:
        t += 0.1
        rtt.update(0.080, 0.0, now=t)
    assert rtt.min_recent_s == 0.08
    assert rtt.min_s == 0.05
    rtt.update(0.070, 0.0, now=t + 0.1)
    assert rtt.min_recent_s == 0.07


@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.001, 1.0)),
        min_size=1,
        max_size=60,
    )
)
def test_windowed_min_is_a_recent_sample_no_larger_than_the_latest(
    steps: list[tuple[float, float]],
) -> None:
    rtt = RttEstimator(min_window_s=5.0)
    now = 0.0
    history: list[tuple[float, float]] = []
    for gap, sample in steps:
        now += gap
        rtt.update(sample, 0.0, now)
        history.append((now, sample))
        recent = [v for (t, v) in history if t >= now - 5.0]
        assert min(recent) <= rtt.min_recent_s <= sample
        assert rtt.min_recent_s in recent
        assert rtt.min_s == min(v for _, v in history)


def test_invalid_configuration_names_the_field() -> None:
    with pytest.raises(ValueError, match="initial_rtt_s"):
        RttEstimator(initial_rtt_s=0.0)
    with pytest.raises(ValueError, match="min_window_s"):
        RttEstimator(min_window_s=-1.0)
